"""rlvr-gym: learned simulators trained with RLVR, as Gymnasium environments."""

__version__ = "0.1.0"

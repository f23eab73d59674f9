"""rlvr-gym: learned simulators trained with RLVR, as Gymnasium environments."""

__version__ = "0.1.0"

from rlvr_gym.sim import register_envs

register_envs()

"""Logging for the command lines: this project's INFO messages, other libraries' warnings and errors only."""

import logging

OWN_LOGGERS = ("rlvr_gym", "envs", "agents", "bench", "__main__")


def configure_logging(level: int = logging.INFO) -> None:
    """Timestamped messages on stderr: `level` for the project's loggers, WARNING for everything else (PyOpenGL,
    for one, announces at INFO on import that it found no accelerator module)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level)

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MuJoCo reads MUJOCO_GL once, at its first import: without it a display-less machine gets GLFW and fails.
os.environ.setdefault("MUJOCO_GL", "egl")

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def sb3_logs_in_tmp(tmp_path, monkeypatch):
    """SB3's learn() makes a log directory in the system temp dir unless told where: keep the suite's in tmp_path."""
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path / "sb3"))


import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MuJoCo reads MUJOCO_GL once, at its first import: without it a display-less machine gets GLFW and fails.
os.environ.setdefault("MUJOCO_GL", "egl")

import torch

torch.set_num_threads(1)

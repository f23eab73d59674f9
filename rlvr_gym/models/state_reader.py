"""State reader: a small CNN that reads the tabletop's state (object centres, drawer joint, target marker) off a frame.

The learned simulator decides success from what it shows. The transformer's success flag is one token after 64
frame codes, learned from one positive frame per successful episode (the real env terminates there), and it moves
with whatever changes the prompt: a refiner that kept objects better made it fire on fewer of the good policies'
episodes. The reader learns from every frame, each with the true state it
shows, and success is then the task's own test (`envs.robot.tasks.success_margin`) on the state it reads off the
predicted frame; the target marker is read off the episode's first frame, where nothing covers it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from envs.robot.tasks import Task, success_margin
from rlvr_gym.models.frame_tokenizer import FrameTokenizer

READ_NAMES = (
    *(f"object{i}_{axis}" for i in range(3) for axis in "xyz"),
    "drawer_qpos", "target_x", "target_y",
)  # fmt: skip
"""What the reader outputs, in metres: the three objects' centres in `envs.robot.OBJECT_NAMES` order, the drawer
joint (0 closed), the target marker's centre in the table plane."""
MARGIN_SCALE = 0.01
"""Metres of success margin that move the success probability from 0.5 to 0.73 (sigmoid(margin / scale))."""


def read_margin(task: Task, states: np.ndarray, first_state: np.ndarray) -> np.ndarray:
    """The task's success margin (m, > 0 succeeded) on read states (N, len(READ_NAMES)), with the target marker
    taken from the state read off the episode's first frame (len(READ_NAMES),) or one per row (N, len(READ_NAMES))."""
    states = np.asarray(states, dtype=np.float64)
    first_state = np.broadcast_to(np.asarray(first_state, dtype=np.float64), states.shape)
    return success_margin(task, states[:, :9].reshape(-1, 3, 3), states[:, 9], first_state[:, 10:12])


def margin_probability(margin: np.ndarray) -> np.ndarray:
    """sigmoid(margin / MARGIN_SCALE): a success margin (m) as a probability, 0.5 exactly on the success boundary."""
    return 1.0 / (1.0 + np.exp(-np.asarray(margin) / MARGIN_SCALE))


def success_probability(task: Task, states: np.ndarray, first_state: np.ndarray) -> np.ndarray:
    """`margin_probability` of the read states' success margin."""
    return margin_probability(read_margin(task, states, first_state))


class StateReaderConfig(PretrainedConfig):
    model_type = "rlvr_state_reader"

    def __init__(self, width: int = 16, keypoints: int = 32, hidden: int = 64, image_size: int = 64,
                 mean: list[float] | None = None, std: list[float] | None = None, **kwargs):
        if width % 8:
            raise ValueError(f"width must be a multiple of 8 (group norms of 8 groups), got {width}")
        self.width = width
        self.keypoints = keypoints
        self.hidden = hidden
        self.image_size = image_size
        # The outputs are regressed in standard units; mean and std (from the training states) map them back to metres.
        self.mean = list(mean) if mean is not None else [0.0] * len(READ_NAMES)
        self.std = list(std) if std is not None else [1.0] * len(READ_NAMES)
        if len(self.mean) != len(READ_NAMES) or len(self.std) != len(READ_NAMES):
            raise ValueError(f"mean and std need one value per output {READ_NAMES}, got {len(self.mean)} and {len(self.std)}")
        super().__init__(**kwargs)


class StateReader(PreTrainedModel):
    """Convolutions to `keypoints` maps at half resolution, each reduced by a spatial softmax to the expected (x, y)
    of its mass and how peaked it is (Levine et al. 2016, deep spatial autoencoders), then a small MLP to the state.
    Held-out real frames are read to about 1 cm (objects), 1 mm (drawer) and 3 mm (marker) by 22k parameters (44 kB in
    fp16): the shipped checkpoints had 150 kB left of their 10 MB."""

    config_class = StateReaderConfig
    main_input_name = "frames"

    def __init__(self, config: StateReaderConfig):
        super().__init__(config)
        w, k = config.width, config.keypoints
        # Group norms: without them a plain CNN reader sat on the mean state for its first few hundred steps.
        self.features = nn.Sequential(
            nn.Conv2d(3, w, 4, 2, 1), nn.GroupNorm(8, w), nn.SiLU(),
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.GroupNorm(8, 2 * w), nn.SiLU(),
            nn.Conv2d(2 * w, k, 3, padding=1),
        )
        self.head = nn.Sequential(nn.Linear(3 * k, config.hidden), nn.SiLU(), nn.Linear(config.hidden, len(READ_NAMES)))
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Conv2d, nn.Linear)):  # PyTorch's defaults
            module.reset_parameters()

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Float frames (N, 3, H, W) in [0, 1] -> the state in standard units (N, len(READ_NAMES))."""
        maps = self.features(frames)
        height, width = maps.shape[2:]
        weights = maps.flatten(2).softmax(-1).view_as(maps)
        ys = torch.linspace(-1, 1, height, device=maps.device, dtype=maps.dtype)
        xs = torch.linspace(-1, 1, width, device=maps.device, dtype=maps.dtype)
        x = (weights.sum(2) * xs).sum(-1)
        y = (weights.sum(3) * ys).sum(-1)
        peak = maps.flatten(2).logsumexp(-1) - math.log(height * width)
        return self.head(torch.cat([x, y, peak], 1))

    def scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training states' mean and std (metres), from the config: from_pretrained would leave buffers empty."""
        as_tensor = lambda values: torch.tensor(values, dtype=torch.float32, device=self.device)  # noqa: E731
        return as_tensor(self.config.mean), as_tensor(self.config.std)

    def standardize(self, states: torch.Tensor) -> torch.Tensor:
        mean, std = self.scale()
        return (states - mean) / std

    @torch.no_grad()
    def read(self, frames: np.ndarray, batch_size: int = 512) -> np.ndarray:
        """uint8 frames (N, H, W, 3) -> float32 (N, len(READ_NAMES)) states in metres, on the CPU wherever the model
        lives."""
        size = self.config.image_size
        if frames.ndim != 4 or frames.shape[1:] != (size, size, 3) or frames.dtype != np.uint8:
            raise ValueError(f"expected uint8 frames of shape (N, {size}, {size}, 3), got {frames.shape} {frames.dtype}")
        mean, std = self.scale()
        out = []
        for start in range(0, len(frames), batch_size):
            chunk = torch.as_tensor(np.ascontiguousarray(frames[start : start + batch_size])).to(self.device)
            out.append((self(FrameTokenizer.to_float(chunk).to(self.dtype)).float() * std + mean).cpu())
        return torch.cat(out).numpy() if out else np.zeros((0, len(READ_NAMES)), np.float32)

"""Motion refiner: the step after the frame decoder that moves the last frame's pixels instead of redrawing them.

The frame decoder redraws every frame from 8x8 codes, and each code covers 8x8 pixels: it cannot place a pushed
object to the pixel (decoding the *real* next frame's codes puts moved objects 2.7 px off, where copying the last
frame is 2.0 px off). The refiner keeps what the codes do well (the gripper, the drawer)
and takes the rest from the last frame, warped:

    next = m * warp(last, flow) + (1 - m) * decoded

where a small U-Net reads the frame before the last, the last frame, the decoded next frame and the action, and
gives a per-pixel flow (in pixels) and mix m. Where nothing moves, flow 0 and m 1 copy the last frame exactly, so
the still scene stays sharp through a rollout; a pushed object keeps its colours and moves by a fraction of a
pixel if need be. As in dynamic-filter and warp-based video prediction (Finn et al. 2016, DVF), here on top of a
token world model: the transformer still decides what changes, the refiner where to draw it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from rlvr_gym.models.frame_tokenizer import FrameTokenizer, ResBlock


class MotionRefinerConfig(PretrainedConfig):
    model_type = "rlvr_motion_refiner"

    def __init__(self, width: int = 32, bottleneck_blocks: int = 2, action_dim: int = 7, image_size: int = 64, **kwargs):
        if width % 8:
            raise ValueError(f"width must be a multiple of 8 (group norms of 8 groups), got {width}")
        self.width = width
        self.bottleneck_blocks = bottleneck_blocks
        self.action_dim = action_dim
        self.image_size = image_size
        super().__init__(**kwargs)


class MotionRefiner(PreTrainedModel):
    config_class = MotionRefinerConfig
    main_input_name = "last"

    def __init__(self, config: MotionRefinerConfig):
        super().__init__(config)
        w = config.width
        inputs = 4 * 3 + config.action_dim  # frame t-1, frame t, decoded t+1, t - (t-1), the action broadcast
        self.stem = nn.Sequential(nn.Conv2d(inputs, w, 3, padding=1), nn.SiLU(), nn.Conv2d(w, w, 3, padding=1), nn.SiLU())
        self.down1 = nn.Sequential(nn.Conv2d(w, 2 * w, 4, 2, 1), nn.GroupNorm(8, 2 * w), nn.SiLU(), ResBlock(2 * w))
        self.down2 = nn.Sequential(nn.Conv2d(2 * w, 3 * w, 4, 2, 1), nn.GroupNorm(8, 3 * w), nn.SiLU(),
                                   *[ResBlock(3 * w) for _ in range(config.bottleneck_blocks)])
        self.up2 = nn.Sequential(nn.Conv2d(3 * w, 8 * w, 3, padding=1), nn.PixelShuffle(2), nn.SiLU())
        self.up1 = nn.Sequential(nn.Conv2d(4 * w, 4 * w, 3, padding=1), nn.PixelShuffle(2), nn.SiLU())
        self.head = nn.Sequential(nn.Conv2d(2 * w, w, 3, padding=1), nn.SiLU(), nn.Conv2d(w, 3, 3, padding=1))
        self.post_init()
        # The last layer starts at zero: flow 0 and an even mix of the last frame and the decoded one.
        nn.init.zeros_(self.head[-1].weight)
        nn.init.zeros_(self.head[-1].bias)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Conv2d):  # PyTorch's default, as the frame tokenizer's
            module.reset_parameters()

    def forward(self, before: torch.Tensor, last: torch.Tensor, decoded: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Float frames (N, 3, H, W) in [0, 1] and actions (N, action_dim) -> the refined next frame (N, 3, H, W)."""
        action_map = action[:, :, None, None].expand(-1, -1, *last.shape[2:])
        h0 = self.stem(torch.cat([before, last, decoded, last - before, action_map], 1))
        h1 = self.down1(h0)
        h2 = self.down2(h1)
        u = self.up1(torch.cat([self.up2(h2), h1], 1))
        out = self.head(torch.cat([u, h0], 1))
        flow, mix = out[:, :2], torch.sigmoid(out[:, 2:3])
        return mix * warp(last, flow) + (1 - mix) * decoded

    @torch.no_grad()
    def refine(self, before: np.ndarray, last: np.ndarray, decoded: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """uint8 frames (N, H, W, 3) and actions (N, action_dim) -> uint8 refined frames (N, H, W, 3), on the CPU
        wherever the model lives."""
        size = self.config.image_size
        for name, frames in (("before", before), ("last", last), ("decoded", decoded)):
            if frames.shape != (len(decoded), size, size, 3) or frames.dtype != np.uint8:
                raise ValueError(f"{name}: expected uint8 frames of shape ({len(decoded)}, {size}, {size}, 3), got "
                                 f"{frames.shape} {frames.dtype}")
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape != (len(decoded), self.config.action_dim):
            raise ValueError(f"expected actions of shape ({len(decoded)}, {self.config.action_dim}), got {actions.shape}")
        as_float = lambda x: FrameTokenizer.to_float(torch.as_tensor(np.ascontiguousarray(x)).to(self.device))
        out = self(as_float(before), as_float(last), as_float(decoded), torch.as_tensor(actions).to(self.device))
        return FrameTokenizer.to_uint8(out).cpu().numpy()


def warp(images: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """Sample (N, C, H, W) images at each pixel's position plus `flow` (N, 2, H, W; x then y, in pixels), bilinear,
    edges repeated. Flow 0 returns the images exactly."""
    height, width = images.shape[2:]
    ys = torch.linspace(-1 + 1 / height, 1 - 1 / height, height, device=images.device)
    xs = torch.linspace(-1 + 1 / width, 1 - 1 / width, width, device=images.device)
    grid = torch.stack(torch.meshgrid(ys, xs, indexing="ij")[::-1], -1)[None]
    scale = torch.tensor([2.0 / width, 2.0 / height], device=images.device)
    grid = grid + flow.permute(0, 2, 3, 1) * scale
    return F.grid_sample(images, grid.to(images.dtype), mode="bilinear", padding_mode="border", align_corners=False)

"""Frame tokenizer: 64x64 RGB frames <-> 8x8 = 64 tokens of an FSQ codebook, conditioned on a context frame.

Why conditioned: with a plain tokenizer the reconstruction ceiling (26.4 dB here, CALIBRATION.md) caps every
world-model metric below simply copying the last frame (25.6 dB). As in iVideoGPT, the decoder also sees a real
*context frame* through skip connections at every scale, so the static scene can be reproduced sharply. The encoder
sees the target frame only, so tokens describe the whole scene (equal tokens mean an equal frame, which is what the
repetition rate counts). In training the context is blanked for a fraction of the frames: a first version that
always had it learned to copy the context and ignore its tokens.

`context_frame` says which frame: "first", the episode's first frame (the shipped models), or "previous", the frame
before (in a rollout the previous *decoded* frame, so frames decode in order). Measured with rt1-rlvr's transformer
and a decoder-only fine-tune to "previous" (`eval rt1`, 20 episodes): single-step LPIPS 0.028 -> 0.016 and object
error 7.0 -> 5.8 px, but changed-pixel MSE 0.096 -> 0.115 and the 5-step rollout's PSNR 21.1 -> 20.6 dB, and its
ceiling did not move (3.5 -> 3.7 px, copying the last frame: 1.9). A residual decoder (context + correction) on
these codes converged to an exact copy of the context. The README's results say where the object error comes from.

FSQ (Mentzer et al., 2023) instead of a VQ codebook: no codebook collapse and no commitment losses; levels
(8, 5, 5, 5) give 1,000 codes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

# Which real frame the decoder sees: the episode's first frame, or the frame just before (in a rollout, the
# previous decoded frame).
CONTEXT_FRAMES = ("first", "previous")


class FrameTokenizerConfig(PretrainedConfig):
    model_type = "rlvr_frame_tokenizer"

    def __init__(self, levels=(8, 5, 5, 5), channels=(32, 64, 128), image_size=64, context_dropout=0.5,
                 context_frame="first", **kwargs):
        if context_frame not in CONTEXT_FRAMES:
            raise ValueError(f"context_frame must be one of {CONTEXT_FRAMES}, got {context_frame!r}")
        self.levels = list(levels)
        self.context_frame = context_frame
        self.channels = list(channels)
        self.image_size = image_size
        self.context_dropout = context_dropout
        super().__init__(**kwargs)

    @property
    def codebook_size(self) -> int:
        n = 1
        for level in self.levels:
            n *= level
        return n

    @property
    def tokens_per_side(self) -> int:
        return self.image_size // 2 ** len(self.channels)


class FSQ(nn.Module):
    """Finite scalar quantisation: each latent channel is bounded and rounded to one of `levels[i]` values."""

    def __init__(self, levels: list[int]):
        super().__init__()
        # Plain lists, not buffers: nothing here is learned, and from_pretrained leaves unsaved buffers uninitialised.
        self.level_list = list(levels)
        self.basis_list = [1]
        for level in levels[:-1]:
            self.basis_list.append(self.basis_list[-1] * level)

    def constants(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        levels = torch.tensor(self.level_list, dtype=torch.float32, device=like.device)
        basis = torch.tensor(self.basis_list, dtype=torch.float32, device=like.device)
        return levels, basis, torch.floor(levels / 2)

    def bound(self, z: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
        levels, _, _ = self.constants(z)
        half = (levels - 1) * (1 + eps) / 2
        offset = torch.where(levels % 2 == 0, 0.5, 0.0)
        shift = torch.atanh(offset / half)
        return torch.tanh(z + shift) * half - offset

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """(..., C) latents -> quantised codes in [-1, 1], straight-through gradients."""
        bounded = self.bound(z)
        rounded = bounded + (torch.round(bounded) - bounded).detach()
        return rounded / self.constants(z)[2]

    def to_indices(self, codes: torch.Tensor) -> torch.Tensor:
        _, basis, half_width = self.constants(codes)
        digits = codes * half_width + half_width
        return (digits * basis).sum(-1).round().long()

    def from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        levels, basis, half_width = self.constants(indices)
        digits = torch.div(indices[..., None].float(), basis, rounding_mode="floor") % levels
        return (digits - half_width) / half_width


class ResBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(8, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(8, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.silu(self.norm2(self.conv1(F.silu(self.norm1(x))))))


def down(c_in: int, c_out: int) -> nn.Module:
    # Group norms keep the latent scale steady: without them Adam inflated the encoder until every latent saturated
    # FSQ's tanh and all frames mapped to one code.
    return nn.Sequential(nn.Conv2d(c_in, c_out, 4, stride=2, padding=1), nn.GroupNorm(8, c_out), nn.SiLU())


class FrameTokenizer(PreTrainedModel):
    config_class = FrameTokenizerConfig
    main_input_name = "frames"

    def __init__(self, config: FrameTokenizerConfig):
        super().__init__(config)
        chans = config.channels
        latent = len(config.levels)
        self.encoder = nn.Sequential(
            *[down(c_in, c_out) for c_in, c_out in zip([3] + chans[:-1], chans)], ResBlock(chans[-1]),
            nn.GroupNorm(8, chans[-1]), nn.Conv2d(chans[-1], latent, 1),
        )
        # Context features at every decoder scale (U-Net skips from the context frame).
        self.context_stages = nn.ModuleList(down(c_in, c_out) for c_in, c_out in zip([3] + chans[:-1], chans))
        self.decoder_in = nn.Sequential(nn.Conv2d(latent, chans[-1], 1), ResBlock(chans[-1]))
        ups = []
        for i in range(len(chans) - 1, -1, -1):
            c_out = chans[i - 1] if i > 0 else chans[0]
            ups.append(nn.Sequential(nn.Conv2d(2 * chans[i], 4 * c_out, 3, padding=1), nn.PixelShuffle(2),
                                     nn.GroupNorm(8, c_out), nn.SiLU()))
        self.up_stages = nn.ModuleList(ups)
        self.decoder_out = nn.Conv2d(chans[0] + 3, 3, 3, padding=1)
        self.fsq = FSQ(config.levels)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        # PyTorch's default (Kaiming-uniform) init: the library's N(0, 0.02) starves this conv net, the latents stay
        # near zero and FSQ collapses to a single code (seen in a first training run).
        if isinstance(module, nn.Conv2d):
            module.reset_parameters()

    @staticmethod
    def to_float(frames: torch.Tensor) -> torch.Tensor:
        """(N, H, W, 3) uint8 -> (N, 3, H, W) float in [0, 1]."""
        if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"expected (N, H, W, 3) uint8 frames, got {tuple(frames.shape)} {frames.dtype}")
        return frames.permute(0, 3, 1, 2).float() / 255.0

    @staticmethod
    def to_uint8(images: torch.Tensor) -> torch.Tensor:
        return (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)

    def encode_latents(self, target: torch.Tensor) -> torch.Tensor:
        z = self.encoder(target)  # (N, C, h, w)
        return self.fsq(z.permute(0, 2, 3, 1))  # (N, h, w, C) codes

    def decode_codes(self, codes: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        skips, h = [], context
        for stage in self.context_stages:
            h = stage(h)
            skips.append(h)
        x = self.decoder_in(codes.permute(0, 3, 1, 2))
        for stage, skip in zip(self.up_stages, reversed(skips)):
            x = stage(torch.cat([x, skip], 1))
        return torch.sigmoid(self.decoder_out(torch.cat([x, context], 1)))

    def forward(self, frames: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Float frames and context (N, 3, H, W) in [0, 1] -> (reconstruction, token indices (N, h*w)).

        In training mode a `context_dropout` fraction of the contexts is blanked, so the tokens must carry the frame.
        """
        codes = self.encode_latents(frames)
        if self.training and self.config.context_dropout > 0:
            keep = torch.rand(len(context), 1, 1, 1, device=context.device) >= self.config.context_dropout
            context = context * keep
        return self.decode_codes(codes, context), self.fsq.to_indices(codes).flatten(1)

    @torch.no_grad()
    def encode(self, frames: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 frames (N, H, W, 3) -> token ids (N, tokens_per_frame) on the CPU, wherever the model lives; tokens
        do not depend on the context."""
        codes = self.encode_latents(self.to_float(frames.to(self.device)))
        return self.fsq.to_indices(codes).flatten(1).cpu()

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Token ids (N, tokens_per_frame) and uint8 context frames -> uint8 frames (N, H, W, 3) on the CPU."""
        side = self.config.tokens_per_side
        if tokens.ndim != 2 or tokens.shape[1] != side * side:
            raise ValueError(f"expected token ids of shape (N, {side * side}), got {tuple(tokens.shape)}")
        if int(tokens.min()) < 0 or int(tokens.max()) >= self.config.codebook_size:
            raise ValueError(f"token ids must lie in [0, {self.config.codebook_size}), got {int(tokens.min())}..{int(tokens.max())}")
        codes = self.fsq.from_indices(tokens.to(self.device).view(-1, side, side))
        return self.to_uint8(self.decode_codes(codes, self.to_float(context.to(self.device)))).cpu()

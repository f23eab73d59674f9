"""Training the frame tokenizer: 64x64 frames to FSQ codes, conditioned on the episode's first frame.

    rlvr-gym train tokenizer --data runs/rt1/train --heldout runs/rt1/heldout --run-dir runs/rt1/tokenizer
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlvr_gym.data.episodes import Episode, load_episodes
from rlvr_gym.domains import robot as R
from rlvr_gym.models.frame_tokenizer import CONTEXT_FRAMES, FrameTokenizer, FrameTokenizerConfig
from rlvr_gym.models.robot_world_model import load_frame_tokenizer
from rlvr_gym.train import run as RUN

log = logging.getLogger("rlvr_gym")


@dataclass
class TokenizerConfig(RUN.RunConfig):
    run_dir: str = "runs/rt1/tokenizer"
    """Directory for checkpoints, logs and the final tokenizer."""
    data: str = "runs/rt1/train"
    """Training episodes (a directory written by `rlvr-gym collect rt1`)."""
    heldout: str = ""
    """Held-out episodes for eval/psnr (optional)."""
    steps: int = 3000
    """Optimizer steps."""
    lr: float = 5e-4
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 100
    """Linear warm-up steps."""
    batch_size: int = 32
    """Frames per step on each process."""
    channels: tuple[int, ...] = (32, 64, 128)
    """Conv widths of the three stride-2 stages (64x64 -> 8x8 tokens)."""
    eval_frames: int = 512
    """Held-out frames scored at each evaluation."""
    salient_weight: float = 0.0
    """Extra loss weight on pixels of saturated colour in the target frame (the objects, the drawer front, the target
    disc). The objects cover ~0.6% of a frame, so plain L1 + MSE lets the decoder smear them where the gripper is."""
    context_frame: str = ""
    """The frame the decoder is conditioned on: "first" (the episode's first frame) or "previous" (the frame
    before). Empty keeps the --model tokenizer's choice ("first" for a new one)."""
    context_dropout: float = -1.0
    """Fraction of training contexts blanked; negative keeps the --model tokenizer's (0.5 for a new one)."""
    train_encoder: bool = True
    """False fine-tunes the decoder only (start from a trained tokenizer with --model): the codes stay the same, so a
    world model trained on them keeps working with the new decoder."""
    train_context: str = ""
    """The context frames in training: empty, the ones it decodes against (`context_frame`); "any", a random frame of
    the same episode each time. Trained against the first frame only, the decoder leans on where the objects stood
    in it and draws moved ones back towards there; against any frame it must read their place from the codes.
    Measured: lower LPIPS, but more lost objects; not shipped."""


def frame_pairs(episodes: list[Episode], context_frame: str = "first") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All frames, the indices of the frames to reconstruct (all but each episode's first: a world model is given
    that one, never decodes it) and of each one's context frame: the episode's first frame, or the frame before."""
    frames = np.concatenate([e.frames for e in episodes])
    starts = np.cumsum([0] + [len(e.frames) for e in episodes[:-1]]).astype(int)
    targets = np.concatenate([s + np.arange(1, len(e.frames)) for e, s in zip(episodes, starts)])
    if context_frame == "first":
        context = np.concatenate([np.full(len(e.frames) - 1, s) for e, s in zip(episodes, starts)])
    elif context_frame == "previous":
        context = targets - 1
    else:
        raise ValueError(f"context_frame must be one of {CONTEXT_FRAMES}, got {context_frame!r}")
    return frames, targets, context


def episode_spans(episodes: list[Episode]) -> tuple[np.ndarray, np.ndarray]:
    """Per pair of `frame_pairs`, in its order: the index of its episode's first frame and the episode's length. A
    random frame of the episode (for `--train-context any`; the target itself as likely as any other) is
    `first + rng.integers(0, length)`."""
    lengths = np.array([len(e.frames) for e in episodes])
    pairs = lengths - 1
    return np.repeat(np.cumsum(lengths) - lengths, pairs), np.repeat(lengths, pairs)


def tokenizer_metrics(model: FrameTokenizer, frames: np.ndarray, target_idx: np.ndarray, context_idx: np.ndarray,
                      n: int) -> dict[str, float]:
    """Held-out reconstruction PSNR and object-position error (objects that moved since the context frame), with the
    same for simply showing the context frame, on n evenly spaced frames."""
    idx = np.linspace(0, len(target_idx) - 1, min(n, len(target_idx))).astype(int)
    target = torch.as_tensor(frames[target_idx[idx]])
    context = torch.as_tensor(frames[context_idx[idx]])
    recon = torch.cat([model.decode(model.encode(t, c), c) for t, c in zip(target.split(128), context.split(128))])
    return {
        "psnr": float(R.psnr(recon, target).clamp(max=60).mean()),
        "psnr_context_copy": float(R.psnr(context, target).clamp(max=60).mean()),
        "object_error_px": R.object_position_error(recon.numpy(), target.numpy(), context.numpy()),
        "object_error_px_context_copy": R.object_position_error(context.numpy(), target.numpy(), context.numpy()),
    }


def salient_pixels(images: torch.Tensor, threshold: float = 0.35) -> torch.Tensor:
    """(N, 3, H, W) floats in [0, 1] -> (N, 1, H, W) 1.0 where the colour is saturated (max - min channel > threshold).
    The table, floor, cabinet, arm and fingers are greys; the objects, drawer front and target disc are not."""
    return ((images.amax(1, keepdim=True) - images.amin(1, keepdim=True)) > threshold).float()


def reconstruction_loss(recon: torch.Tensor, target: torch.Tensor, salient_weight: float = 0.0) -> torch.Tensor:
    """L1 + MSE per pixel, averaged with weight 1 + salient_weight on saturated pixels of the target."""
    error = ((recon - target).abs() + (recon - target) ** 2).mean(1, keepdim=True)
    if salient_weight <= 0:
        return error.mean()
    weight = 1 + salient_weight * salient_pixels(target)
    return (weight * error).sum() / weight.sum()


def load_tokenizer_for_training(path: str | os.PathLike, config: TokenizerConfig) -> tuple[FrameTokenizer, None]:
    model = load_frame_tokenizer(path).train()
    if config.context_frame:
        model.config.context_frame = config.context_frame
    if config.context_dropout >= 0:
        model.config.context_dropout = config.context_dropout
    if not config.train_encoder:  # before DDP wraps the model, which only tracks parameters that require gradients
        model.encoder.requires_grad_(False)
    return model, None


def train_frame_tokenizer(config: TokenizerConfig) -> Path:
    """Train a frame tokenizer from scratch (or resume) on (frame, context frame) pairs; L1 + MSE loss,
    optionally weighted towards saturated pixels; with train_encoder=False only the decoder learns."""
    if not config.train_encoder and not config.model:
        raise ValueError("--no-train-encoder fine-tunes a trained tokenizer's decoder: pass it with --model")
    if config.context_frame and config.context_frame not in CONTEXT_FRAMES:
        raise ValueError(f"--context-frame must be one of {CONTEXT_FRAMES}, got {config.context_frame!r}")
    if config.train_context not in ("", "any"):
        raise ValueError(f"--train-context must be empty or 'any', got {config.train_context!r}")
    d = RUN.setup_processes(config.threads)
    if not config.model:
        init = Path(config.run_dir) / "init"
        if d.is_main and not (init / "config.json").is_file():
            torch.manual_seed(config.seed)
            FrameTokenizer(FrameTokenizerConfig(channels=config.channels)).save_pretrained(init)
        RUN.barrier(d)
        config = TokenizerConfig(**{**vars(config), "model": str(init)})
    run = RUN.Run(config, "tokenizer", load=lambda path: load_tokenizer_for_training(path, config))
    model = run.model
    episodes = load_episodes(config.data)
    frames, target_idx, context_idx = frame_pairs(episodes, model.config.context_frame)
    episode_first, episode_length = episode_spans(episodes)
    del episodes  # `frames` holds a copy of every frame
    held = frame_pairs(load_episodes(config.heldout), model.config.context_frame) if config.heldout else None

    def evaluate() -> dict[str, float]:
        return tokenizer_metrics(model, *held, config.eval_frames) if held is not None else {}

    while run.running():
        started = time.perf_counter()
        idx = RUN.batch_indices(len(target_idx), config.batch_size, run.step, config.seed, d.rank, d.world_size)
        if config.train_context == "any":
            rng = np.random.default_rng((config.seed, run.step, d.rank))
            contexts = episode_first[idx] + rng.integers(0, episode_length[idx])
        else:
            contexts = context_idx[idx]
        target = FrameTokenizer.to_float(torch.as_tensor(frames[target_idx[idx]])).to(d.device)
        context = FrameTokenizer.to_float(torch.as_tensor(frames[contexts])).to(d.device)
        model.train()
        recon, _ = run.ddp_model(target, context)
        loss = reconstruction_loss(recon, target, config.salient_weight)
        loss.backward()
        grad_norm = run.optimizer_step()
        metrics = {"train/loss": loss.item(), "train/grad_norm": grad_norm,
                   "time/frames_per_s": len(idx) / (time.perf_counter() - started)}
        run.end_step(metrics, evaluate if held is not None else None, postfix=["train/loss"])
    return run.finish()

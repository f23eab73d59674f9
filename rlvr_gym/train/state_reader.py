"""Training a video world model's state reader: object centres, drawer joint and target marker read off a frame.

    rlvr-gym train state-reader --world-model runs/rt1/rlvr/world_model --data runs/rt1/train --run-dir runs/rt1/reader
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from envs.robot.tasks import TASKS, task_and_layout, task_from_instruction
from rlvr_gym.data.episodes import STATE_NAMES, Episode, load_episodes
from rlvr_gym.domains.robot import balanced_accuracy
from rlvr_gym.models.frame_tokenizer import FrameTokenizer
from rlvr_gym.models.robot_world_model import RobotWorldModel, load_state_reader
from rlvr_gym.models.state_reader import READ_NAMES, StateReader, StateReaderConfig, read_margin
from rlvr_gym.train import run as RUN
from rlvr_gym.train.robot import save_with_initial_states

log = logging.getLogger("rlvr_gym")


@dataclass
class ReaderConfig(RUN.RunConfig):
    run_dir: str = "runs/rt1/state_reader"
    """Directory for checkpoints, logs, the final reader and RUN_DIR/world_model (the world model with it)."""
    world_model: str = "runs/rt1/refiner/world_model"
    """The world model (a directory or shipped name) the reader is added to; its tokenizer also round-trips
    `recon_fraction` of the training frames, so the reader learns frames as the decoder draws them."""
    data: tuple[str, ...] = ("runs/rt1/train",)
    """Training episode directories: every frame with the true state it shows. Real ones (`rlvr-gym collect rt1`),
    and real episodes with the frames the world model draws for their actions (`rlvr-gym imagine rt1`), from which
    the reader learns to read success off the simulator's own rollouts."""
    heldout: str = ""
    """Held-out episodes for eval/ (read errors in cm, success read from the frames against the true success)."""
    steps: int = 4000
    """Optimizer steps."""
    lr: float = 3e-3
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 100
    """Linear warm-up steps."""
    batch_size: int = 32
    """Frames per step on each process (two processes: 64)."""
    recon_fraction: float = 0.5
    """Fraction of each batch passed through the world model's frame tokenizer first."""
    width: int = 16
    """Conv width of the reader's first layer (a multiple of 8; twice that in the second)."""
    keypoints: int = 32
    """Feature maps the reader reduces to an (x, y) each by a spatial softmax."""
    eval_frames: int = 2048
    """Held-out frames scored at each evaluation."""


def reader_labels(episodes: list[Episode]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every frame of the episodes (N, 64, 64, 3), the state it shows (N, len(READ_NAMES)): object centres and
    drawer from the recorded states, the target marker from the episode's reset seed (NaN for imported episodes),
    and the index of its episode's first frame (N,)."""
    objects = [STATE_NAMES.index(name) for name in READ_NAMES[:10]]
    frames, labels = [], []
    for episode in episodes:
        target = (task_and_layout(episode.task, episode.seed)[1].target_xy if episode.seed >= 0 and episode.task in TASKS
                  else np.full(2, np.nan))
        frames.append(episode.frames)
        labels.append(np.concatenate([episode.states[:, objects], np.broadcast_to(target, (len(episode.frames), 2))], 1))
    lengths = np.array([len(f) for f in frames])
    first = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.concatenate(frames), np.concatenate(labels).astype(np.float32), first


def load_reader_for_training(path: str | os.PathLike) -> tuple[StateReader, None]:
    return load_state_reader(path).train(), None


def reader_metrics(reader: StateReader, episodes: list[Episode], n: int) -> dict[str, float]:
    """Read errors (cm) on n evenly spaced held-out frames, and how well success read from each frame (its task's
    test on the read state, the target read from the episode's first frame) matches the true success."""
    frames, labels, first = reader_labels(episodes)
    read = reader.eval().read(frames)
    pick = np.linspace(0, len(frames) - 1, min(n, len(frames))).round().astype(int)
    error = np.abs(read[pick] - labels[pick]) * 100
    metrics = {"object_xy_cm": float(np.nanmean(error[:, [0, 1, 3, 4, 6, 7]])),
               "object_z_cm": float(np.nanmean(error[:, [2, 5, 8]])),
               "drawer_cm": float(np.nanmean(error[:, 9])), "target_cm": float(np.nanmean(error[:, 10:]))}
    margins, succeeded = [], []
    for episode, start in zip(episodes, np.unique(first)):
        if episode.task in TASKS:
            states = read[start : start + len(episode.frames)]
            margins.append(read_margin(task_from_instruction(episode.instruction), states, states[0]))
            succeeded.append(np.concatenate([[False], episode.success]))
    if margins:
        metrics["success_balanced_accuracy"] = balanced_accuracy(np.concatenate(margins), np.concatenate(succeeded), 0.0)
    return metrics


def train_state_reader(config: ReaderConfig) -> Path:
    """Train a state reader on real frames (and their tokenizer reconstructions) against the true states; writes
    RUN_DIR/world_model, the world model with the reader, whose simulator then reads success off its frames.
    `--model READER_DIR --steps 0` adds a trained reader to another world model as it is."""
    if not 0 <= config.recon_fraction <= 1:
        raise ValueError(f"--recon-fraction must lie in [0, 1], got {config.recon_fraction}")
    d = RUN.setup_processes(config.threads)
    run_dir = Path(config.run_dir)
    world = RobotWorldModel.load(config.world_model, d.device)
    data = [config.data] if isinstance(config.data, str) else list(config.data)
    frames, labels, first = reader_labels([e for directory in data for e in load_episodes(directory)])
    unlabelled = [name for name, known in zip(READ_NAMES, (~np.isnan(labels)).any(0)) if not known]
    if unlabelled:
        raise ValueError(f"{' '.join(data)} has no true {', '.join(unlabelled)} for any frame (imported episodes carry no "
                         "states): train the reader on episodes collected from the tabletop (`rlvr-gym collect rt1`)")
    # The decoder's context, as in a rollout: the episode's first frame, or the frame before (itself at the start).
    context = first if world.context_frame == "first" else np.maximum(np.arange(len(frames)) - 1, first)
    if not config.model:
        init = run_dir / "init"
        if d.is_main and not (init / "config.json").is_file():
            torch.manual_seed(config.seed)
            mean, std = np.nanmean(labels, 0), np.nanstd(labels, 0) + 1e-4
            StateReader(StateReaderConfig(config.width, config.keypoints, mean=mean.tolist(), std=std.tolist())).save_pretrained(init)
        RUN.barrier(d)
        config = ReaderConfig(**{**vars(config), "model": str(init)})
    run = RUN.Run(config, "state_reader", load=load_reader_for_training)
    held = load_episodes(config.heldout) if config.heldout else None
    log.info("%d training frames", len(frames))

    def evaluate() -> dict[str, float]:
        return reader_metrics(run.model, held, config.eval_frames)

    to_float = lambda x: FrameTokenizer.to_float(torch.as_tensor(x)).to(d.device)

    while run.running():
        started = time.perf_counter()
        idx = RUN.batch_indices(len(frames), config.batch_size, run.step, config.seed, d.rank, d.world_size)
        batch = to_float(frames[idx])
        n_recon = int(config.recon_fraction * len(idx))
        if n_recon:
            with torch.no_grad():
                recon, _ = world.frame_tokenizer(batch[:n_recon], to_float(frames[context[idx[:n_recon]]]))
            batch = torch.cat([recon.clamp(0, 1), batch[n_recon:]])
        target = run.model.standardize(torch.as_tensor(labels[idx]).to(d.device))
        run.model.train()
        out = run.ddp_model(batch)
        known = ~torch.isnan(target)
        loss = torch.nn.functional.smooth_l1_loss(out[known], target[known], beta=0.1)
        loss.backward()
        grad_norm = run.optimizer_step()
        metrics = {"train/loss": loss.item(), "train/grad_norm": grad_norm,
                   "time/frames_per_s": len(idx) / (time.perf_counter() - started)}
        run.end_step(metrics, evaluate if held is not None else None, postfix=["train/loss"])
    final = run.finish()
    if d.is_main:
        world.state_reader = load_state_reader(final)
        # Thresholds calibrated on the success flag mean nothing to the reader's probabilities (0.5: on the
        # boundary of the task's own test); `rlvr-gym calibrate rt1` sets new ones.
        world.settings.success_thresholds = {}
        save_with_initial_states(world, config.world_model, run_dir / "world_model")
    RUN.barrier(d)
    return run_dir / "world_model"

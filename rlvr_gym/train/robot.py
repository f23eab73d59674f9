"""Training the robot video world model: frame tokenizer, MLE transformer, RLVR post-training.

    rlvr-gym train tokenizer --data runs/rt1/train --heldout runs/rt1/heldout --run-dir runs/rt1/tokenizer
    rlvr-gym train rt1-mle   --data runs/rt1/train --tokenizer runs/rt1/tokenizer/final --run-dir runs/rt1/mle
    rlvr-gym train refiner   --data runs/rt1/train --world-model runs/rt1/mle/world_model --run-dir runs/rt1/refiner
    rlvr-gym train rt1-rlvr  --data runs/rt1/train --model runs/rt1/mle/world_model --run-dir runs/rt1/rlvr
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from envs.robot.tasks import TASKS, task_and_layout, task_from_instruction
from rlvr_gym.data.episodes import STATE_NAMES, Episode, load_episodes
from rlvr_gym.domains import robot as R
from rlvr_gym.domains.lpips import load_lpips
from rlvr_gym.models.frame_tokenizer import CONTEXT_FRAMES, FrameTokenizer, FrameTokenizerConfig
from rlvr_gym.models.lm import LlamaSize, build_llama, load_model
from rlvr_gym.models.motion_refiner import MotionRefiner, MotionRefinerConfig
from rlvr_gym.models.robot_world_model import (
    RobotWorldModel,
    RolloutStart,
    WorldModelSettings,
    load_frame_tokenizer,
    load_motion_refiner,
    load_state_reader,
    predict_in_batches,
)
from rlvr_gym.models.state_reader import READ_NAMES, StateReader, StateReaderConfig, read_margin
from rlvr_gym.sim.real_env_versions import REAL_ENV_FILE
from rlvr_gym.sim.robot import balanced_accuracy, save_initial_states
from rlvr_gym.train import run as RUN
from rlvr_gym.train.grpo import GRPOConfig, train_grpo
from rlvr_gym.train.sft import SFTConfig, train_sft

log = logging.getLogger("rlvr_gym")


# ---------------------------------------------------------------------------------------------------- tokenizer


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
    Measured (docs/research/rt1_experiments.md, session 15): lower LPIPS, but more lost objects; not shipped."""


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


def save_with_initial_states(world: RobotWorldModel, source: str | os.PathLike, out: Path) -> Path:
    """Save `world` (the model loaded from `source` with a network trained or replaced) to `out`, with the initial
    states of `source`, so that the learned env can start from it."""
    world.to("cpu").save(out)
    for name in ("initial_states.npz", REAL_ENV_FILE):
        if (RobotWorldModel.resolve(source) / name).is_file():
            shutil.copy2(RobotWorldModel.resolve(source) / name, out / name)
    return out


# ---------------------------------------------------------------------------------------------------- motion refiner


@dataclass
class RefinerConfig(RUN.RunConfig):
    run_dir: str = "runs/rt1/refiner"
    """Directory for checkpoints, logs, the final refiner and RUN_DIR/world_model (the world model with it)."""
    world_model: str = "runs/rt1/mle/world_model"
    """The world model (a directory or shipped name) whose transformer's greedy predictions the refiner learns to
    draw, and which RUN_DIR/world_model copies with the refiner added."""
    data: str = "runs/rt1/train"
    """Training episodes (`rlvr-gym collect rt1`)."""
    heldout: str = ""
    """Held-out episodes for eval/ (object error and PSNR of refined predictions, with copying's; optional)."""
    prediction_episodes: int = 0
    """Training episodes whose transitions the transformer predicts, once, before training (all 800 of the shipped
    data: 6 minutes on two processes), saved in RUN_DIR so a resumed run reuses them. 0: all."""
    steps: int = 2400
    """Optimizer steps."""
    lr: float = 5e-4
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 50
    """Linear warm-up steps."""
    batch_size: int = 16
    """Transitions per step on each process (two processes: 32)."""
    real_fraction: float = 0.5
    """Fraction of each batch decoded from the real next frame's codes instead of the predicted ones: the refiner
    learns to trust codes that are right as well as to correct the transformer's."""
    moved_fraction: float = 0.5
    """Fraction of each batch drawn from transitions where a whole object moves (about 10% of them as collected).
    Measured (docs/research/rt1_experiments.md, session 17): it took the moved objects from 2.8 px to 1.5 at step 1."""
    revealed_fraction: float = 0.0
    """Fraction of each batch drawn from transitions where an object comes out from under the gripper (a third of
    the moved ones), always decoded from the transformer's predicted codes: where those do not redraw the object, the
    refiner learns to draw it from the few pixels the last frame shows."""
    salient_weight: float = 10.0
    """Extra loss weight on saturated pixels of the target (objects, drawer front, target disc), as the tokenizer's."""
    lpips_weight: float = 0.0
    """Weight of LPIPS (the video reward's perceptual term) between the refined and the real frame, added to the
    pixel loss: the refiner is deterministic and differentiable, so the reward's own gradient trains it."""
    width: int = 24
    """Conv width of the refiner's first stage (x2, x3 below); a multiple of 8."""
    bottleneck_blocks: int = 1
    """Residual blocks at the refiner's 16x16 stage. Width 24 with 1 block (437k parameters, 0.9 MB in fp16) fits
    the shipped checkpoints' 10 MB budget beside the transformer and the tokenizer; 32 with 2 is 942k."""
    eval_transitions: int = 512
    """Held-out transitions scored at each evaluation."""
    context_from_frames: bool = True
    """Whether RUN_DIR/world_model feeds the frames it shows back into its prompts (WorldModelSettings). Measured
    (docs/research/rt1_experiments.md, session 18): with the refiner it keeps objects the codes alone drop in rollouts."""
    rollout_depth: int = 1
    """With d > 1, the refiner also learns on the frames it is given in multi-step rollouts: `rollout_starts` greedy
    d-frame rollouts of the world model (with its own refiner, the window sliding as in the env) are run once and
    saved in RUN_DIR, and their frames 2..d, each refined from the two frames shown before it, make
    `rollout_fraction` of each batch. On the single-step transitions alone the refiner only ever sees real frames."""
    rollout_starts: int = 1024
    """Rollouts run for `rollout_depth` > 1, half of them from steps where a whole object moves within the rollout."""
    rollout_fraction: float = 0.0
    """Fraction of each batch drawn from the rollout transitions (`rollout_depth`), before the other fractions."""


def greedy_predictions(world: RobotWorldModel, episodes: list[Episode], where: list[tuple[int, int]] | None = None,
                       batch: int = 64) -> dict[str, np.ndarray]:
    """The transformer's greedy next-frame codes from the real history at steps (episode, t) of the episodes (all
    steps by default): "codes" (rows, frame_tokens), the real next frame's "real" codes, "episode" and "t";
    unparsable rows left out."""
    if where is None:
        where = [(e, t) for e, episode in enumerate(episodes) for t in range(len(episode.actions))]
    real = {e: episode_codes(world.frame_tokenizer, episodes[e]) for e in sorted({e for e, _ in where})}
    flags = {e: frame_flags(episodes[e]) for e in real}
    prompts = [world.prompt(real[e][: t + 1], flags[e][: t + 1], episodes[e].actions[: t + 1]) for e, t in where]
    codes, keep = [], []
    for s in range(0, len(prompts), batch):
        predicted, _, errors = world.predict(prompts[s : s + batch], k=1)
        codes.append(predicted[:, 0])
        keep += [error is None for error in errors]
    keep = np.array(keep, dtype=bool)
    where = np.array(where, dtype=np.int64).reshape(-1, 2)[keep]
    codes = np.concatenate(codes)[keep] if len(prompts) else np.zeros((0, world.frame_tokens), np.int64)
    next_real = np.array([real[e][t + 1] for e, t in where], dtype=np.int64).reshape(len(where), world.frame_tokens)
    return {"codes": codes, "real": next_real, "episode": where[:, 0], "t": where[:, 1]}


def load_refiner_for_training(path: str | os.PathLike) -> tuple[MotionRefiner, None]:
    return load_motion_refiner(path).train(), None


def refiner_batch(episodes: list[Episode], rows: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, ...]:
    """uint8 frames t-1 (t at an episode's start), t, t+1, the first frame, and action t of each (episode, t)."""
    pick = lambda offset: np.stack([episodes[e].frames[max(s + offset, 0)] for e, s in zip(rows, t)])
    actions = np.stack([episodes[e].actions[s] for e, s in zip(rows, t)]).astype(np.float32)
    return pick(-1), pick(0), pick(1), np.stack([episodes[e].frames[0] for e in rows]), actions


def saved_shards(run_dir: Path, kind: str = "predictions") -> list[Path] | None:
    """A complete set of the shards `train refiner` saves (KIND_R_of_N.npz for every R < N; kind "predictions" or
    "rollouts") in run_dir, whatever N the processes that wrote them numbered; the smallest N if there are several,
    None if none."""
    found = [re.fullmatch(rf"{kind}_(\d+)_of_(\d+)\.npz", p.name) for p in run_dir.glob(f"{kind}_*_of_*.npz")]
    for n in sorted({int(m[2]) for m in found if m}):
        shards = [run_dir / f"{kind}_{r}_of_{n}.npz" for r in range(n)]
        if all(shard.is_file() for shard in shards):
            return shards
    return None


def predict_once(run_dir: Path, kind: str, d: RUN.Dist,
                 predict: Callable[[int, int], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`predict(rank, world_size)`'s arrays from every process, concatenated: each process computes its share once
    and saves it in run_dir (KIND_R_of_N.npz), so a resumed run, or one started in a run dir holding the shards of
    another (under any number of processes), reads them back."""
    shards = saved_shards(run_dir, kind)
    if shards is None:
        part = run_dir / f"{kind}_{d.rank}_of_{d.world_size}.npz"
        if not part.is_file():
            arrays = predict(d.rank, d.world_size)
            run_dir.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(part.with_suffix(".tmp.npz"), **arrays)
            os.replace(part.with_suffix(".tmp.npz"), part)
        shards = [run_dir / f"{kind}_{r}_of_{d.world_size}.npz" for r in range(d.world_size)]
    RUN.barrier(d)
    parts = [np.load(shard) for shard in shards]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0].files}


def rollout_transitions(world: RobotWorldModel, episodes: list[Episode], starts: list[tuple[int, int]],
                        depth: int) -> dict[str, np.ndarray]:
    """Frames 2..depth of greedy `depth`-frame rollouts from each (episode, b) in `starts` (the world model as the
    env runs it: its refiner, its prompts): per frame, the generated "codes", the frames shown "before" and "last"
    it, and the "episode" and step "t" whose real next frame it predicts (frame t + 1, after action t). Step-major;
    rows whose codes did not parse are left out."""
    if not starts:  # a process's share can be empty
        frame = episodes[0].frames.shape[1:]
        return {"codes": np.zeros((0, world.frame_tokens), np.int64), "before": np.zeros((0, *frame), np.uint8),
                "last": np.zeros((0, *frame), np.uint8), "episode": np.zeros(0, np.int64), "t": np.zeros(0, np.int64)}
    codes = {e: episode_codes(world.frame_tokenizer, episodes[e]) for e in sorted({e for e, _ in starts})}
    flags = {e: frame_flags(episodes[e]) for e in codes}
    prompts = [world.prompt(codes[e][: b + 1], flags[e][: b + 1], episodes[e].actions[: b + 1]) for e, b in starts]
    future = [episodes[e].actions[b + 1 : b + depth] for e, b in starts]
    start = RolloutStart.of_episodes(episodes, starts)
    rollout = predict_in_batches(world, prompts, start, depth, future)
    shown = np.concatenate([start.before[:, None], start.last[:, None], rollout.frames], 1).swapaxes(0, 1)
    generated = rollout.codes[:, 1:].swapaxes(0, 1)  # (depth - 1, starts, frame_tokens)
    ok = (generated >= 0).all(-1)
    episode, begin = (np.array(column) for column in zip(*starts))
    return {"codes": generated[ok], "before": shown[1:depth][ok], "last": shown[2 : depth + 1][ok],
            "episode": np.broadcast_to(episode, ok.shape)[ok], "t": (begin + np.arange(1, depth)[:, None])[ok]}


def rollout_starts(episodes: list[Episode], depth: int, count: int, seed: int) -> list[tuple[int, int]]:
    """`count` (episode, b) rollout starts with `depth` real frames after b, half of them (or all there are) where a
    whole object moves within the rollout."""
    where, moving = [], []
    for e, episode in enumerate(episodes):
        moves = whole_object_moves(episode)
        for b in range(len(episode.actions) - depth + 1):
            where.append((e, b))
            moving.append(bool(moves[b : b + depth].any()))
    picked = draw_prompts(np.array(moving, dtype=bool), count, 0.5, np.random.default_rng(seed))
    return [where[i] for i in sorted(picked)]


def draw_refiner_batch(moved: np.ndarray, revealed: np.ndarray, config: RefinerConfig, rng: np.random.Generator,
                       size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Indices of `size` (default: a batch) predicted transitions (`moved_fraction` of a batch where a whole object
    moves, `revealed_fraction` where one comes out from under the gripper, the rest drawn from all) and, per row,
    whether it is decoded from the real codes (`real_fraction` of the others; never a revealed one)."""
    idx = rng.integers(0, len(moved), config.batch_size if size is None else size)
    n_moved = int(config.moved_fraction * config.batch_size)
    n_revealed = int(config.revealed_fraction * config.batch_size)
    if n_moved:
        idx[:n_moved] = rng.choice(np.flatnonzero(moved), n_moved)
    if n_revealed:
        idx[n_moved : n_moved + n_revealed] = rng.choice(np.flatnonzero(revealed), n_revealed)
    use_real = rng.random(len(idx)) < config.real_fraction
    use_real[n_moved : n_moved + n_revealed] = False
    return idx, use_real


def train_motion_refiner(config: RefinerConfig) -> Path:
    """Train a motion refiner on a world model's own greedy predictions (and the real codes) against the real next
    frames; the transformer and the tokenizer stay as they are. Writes RUN_DIR/world_model with the refiner."""
    shares = (config.moved_fraction, config.revealed_fraction, config.rollout_fraction)
    if not 0 <= config.real_fraction <= 1 or min(shares) < 0 or sum(shares) >= 1:
        raise ValueError(f"--real-fraction must lie in [0, 1], and --moved-fraction, --revealed-fraction and "
                         f"--rollout-fraction be at least 0 with a sum below 1, got {config.real_fraction}, "
                         f"{config.moved_fraction}, {config.revealed_fraction} and {config.rollout_fraction}")
    if (config.rollout_fraction > 0) != (config.rollout_depth > 1):
        raise ValueError(f"--rollout-fraction and --rollout-depth go together: a fraction above 0 draws rollout frames "
                         f"2..depth (depth 2 or more), and rollouts are run only for it; got "
                         f"{config.rollout_fraction} and {config.rollout_depth}")
    d = RUN.setup_processes(config.threads)
    run_dir = Path(config.run_dir)
    world = RobotWorldModel.load(config.world_model, d.device)
    episodes = load_episodes(config.data)
    rollouts = None
    if config.rollout_depth > 1:
        starts = rollout_starts(episodes, config.rollout_depth, config.rollout_starts, config.seed)
        rollouts = predict_once(run_dir, "rollouts", d, lambda rank, size: rollout_transitions(
            world, episodes, starts[rank::size], config.rollout_depth))
        log.info("%d rollout transitions (frames 2..%d of %d rollouts)", len(rollouts["t"]), config.rollout_depth, len(starts))
        if not len(rollouts["t"]):
            raise ValueError("--rollout-depth > 1, but no rollout could be run (episodes shorter than the depth?)")
    if world.refiner is not None:
        log.info("%s already has a motion refiner; training a new one in its place", config.world_model)
        world.refiner = None
    chosen = np.sort(np.random.default_rng(config.seed).permutation(len(episodes))[: config.prediction_episodes or None])

    def predict(rank: int, size: int) -> dict[str, np.ndarray]:
        mine = chosen[rank::size]
        predictions = greedy_predictions(world, [episodes[i] for i in mine])
        predictions["episode"] = mine[predictions["episode"]]
        return predictions

    predictions = predict_once(run_dir, "predictions", d, predict)
    codes, real_codes, rows, t = (predictions[k] for k in ("codes", "real", "episode", "t"))
    moves = {e: whole_object_moves(episodes[e]) for e in np.unique(rows)}
    reveals = {e: whole_object_reveals(episodes[e]) for e in np.unique(rows)}
    moved = np.array([moves[e][s] for e, s in zip(rows, t)], dtype=bool)
    revealed = np.array([reveals[e][s] for e, s in zip(rows, t)], dtype=bool)
    log.info("%d predicted transitions from %d episodes, a whole object moving in %d, coming out from under the "
             "gripper in %d", len(rows), len(chosen), moved.sum(), revealed.sum())
    if config.moved_fraction > 0 and not moved.any():
        raise ValueError("--moved-fraction > 0, but no predicted transition moves a whole object")
    if config.revealed_fraction > 0 and not revealed.any():
        raise ValueError("--revealed-fraction > 0, but in no predicted transition an object comes out from under the gripper")
    if not config.model:
        init = run_dir / "init"
        if d.is_main and not (init / "config.json").is_file():
            torch.manual_seed(config.seed)
            MotionRefiner(MotionRefinerConfig(config.width, config.bottleneck_blocks, R.ACTION_DIM)).save_pretrained(init)
        RUN.barrier(d)
        config = RefinerConfig(**{**vars(config), "model": str(init)})
    run = RUN.Run(config, "refiner", load=load_refiner_for_training)
    held = load_episodes(config.heldout) if config.heldout else None
    to_float = lambda x: FrameTokenizer.to_float(torch.as_tensor(x)).to(d.device)
    lpips = load_lpips(d.device) if config.lpips_weight else None

    def evaluate() -> dict[str, float]:
        world.refiner = run.model
        return refiner_metrics(world, held, config.eval_transitions)

    while run.running():
        started = time.perf_counter()
        rng = np.random.default_rng((config.seed, run.step, d.rank))
        n_rollout = int(config.rollout_fraction * config.batch_size) if rollouts is not None else 0
        idx, use_real = draw_refiner_batch(moved, revealed, config, rng, config.batch_size - n_rollout)
        before, last, target, first, actions = refiner_batch(episodes, rows[idx], t[idx])
        next_codes = np.where(use_real[:, None], real_codes[idx], codes[idx])
        if n_rollout:  # rollout frames: refined from the frames shown before them, not the real ones
            pick = rng.integers(0, len(rollouts["t"]), n_rollout)
            _, _, r_target, r_first, r_actions = refiner_batch(episodes, rollouts["episode"][pick], rollouts["t"][pick])
            before, last, target, first, actions, next_codes = (np.concatenate(pair) for pair in (
                (before, rollouts["before"][pick]), (last, rollouts["last"][pick]), (target, r_target),
                (first, r_first), (actions, r_actions), (next_codes, rollouts["codes"][pick])))
        decoded = world.decode(next_codes, first if world.context_frame == "first" else last)
        run.model.train()
        refined = run.ddp_model(to_float(before), to_float(last), to_float(decoded), torch.as_tensor(actions).to(d.device))
        target = to_float(target)
        pixel_loss = reconstruction_loss(refined, target, config.salient_weight)
        perceptual = lpips(refined * 2 - 1, target * 2 - 1).mean() if lpips is not None else torch.zeros(())
        loss = pixel_loss + config.lpips_weight * perceptual
        loss.backward()
        grad_norm = run.optimizer_step()
        metrics = {"train/loss": loss.item(), "train/pixel_loss": pixel_loss.item(), "train/lpips": perceptual.item(),
                   "train/grad_norm": grad_norm,
                   "time/transitions_per_s": len(target) / (time.perf_counter() - started)}
        run.end_step(metrics, evaluate if held is not None else None, postfix=["train/loss"])
    final = run.finish()
    if d.is_main:
        world.refiner = load_motion_refiner(final)
        world.settings.context_from_frames = config.context_from_frames
        save_with_initial_states(world, config.world_model, run_dir / "world_model")
    RUN.barrier(d)
    return run_dir / "world_model"


# ---------------------------------------------------------------------------------------------------- state reader


@dataclass
class ReaderConfig(RUN.RunConfig):
    run_dir: str = "runs/rt1/state_reader"
    """Directory for checkpoints, logs, the final reader and RUN_DIR/world_model (the world model with it)."""
    world_model: str = "runs/rt1/refiner/world_model"
    """The world model (a directory or shipped name) the reader is added to; its tokenizer also round-trips
    `recon_fraction` of the training frames, so the reader learns frames as the decoder draws them."""
    data: str = "runs/rt1/train"
    """Training episodes (`rlvr-gym collect rt1`): every frame with the true state it shows."""
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
    frames, labels, first = reader_labels(load_episodes(config.data))
    unlabelled = [name for name, known in zip(READ_NAMES, (~np.isnan(labels)).any(0)) if not known]
    if unlabelled:
        raise ValueError(f"{config.data} has no true {', '.join(unlabelled)} for any frame (imported episodes carry no "
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


def refiner_metrics(world: RobotWorldModel, episodes: list[Episode], n: int) -> dict[str, float]:
    """Object error and PSNR of the refined greedy predictions on n evenly spaced held-out transitions, with the
    plain decoder's and copying the last frame's."""
    where = [(e, s) for e, episode in enumerate(episodes) for s in range(len(episode.actions))]
    where = [where[i] for i in np.linspace(0, len(where) - 1, min(n, len(where))).astype(int)]
    predictions = greedy_predictions(world, episodes, where)
    predicted, rows, t = predictions["codes"][:, None], predictions["episode"], predictions["t"]
    before, last, target, first, actions = refiner_batch(episodes, rows, t)
    refined = world.decode_rollout(predicted, last, first, before, actions[:, None])[:, 0]
    plain = world.decode(predicted[:, 0], first if world.context_frame == "first" else last)
    metrics = {}
    for name, frames in (("refined", refined), ("decoded", plain), ("copy", last)):
        metrics[f"psnr_{name}"] = float(R.psnr(torch.as_tensor(frames), torch.as_tensor(target)).clamp(max=60).mean())
        metrics[f"object_error_px_{name}"] = R.object_position_error(frames, target, last, min_target_pixels=R.WHOLE_OBJECT_PIXELS)
    return metrics


# ---------------------------------------------------------------------------------------------------- sequences


def episode_codes(frame_tokenizer: FrameTokenizer, episode: Episode) -> np.ndarray:
    """Frame codes (T+1, tokens per frame) of an episode, each frame tokenized against the episode's first frame."""
    frames = torch.as_tensor(episode.frames)
    return torch.cat([frame_tokenizer.encode(f, frames[:1].expand(len(f), -1, -1, -1)) for f in frames.split(256)]).numpy()


def frame_flags(episode: Episode) -> np.ndarray:
    """Success flag of every frame: the first frame is before any step, frame t+1 follows action t."""
    return np.concatenate([[False], episode.success.astype(bool)])


def mle_examples(codes: np.ndarray, episode: Episode, window: int, changed_weight: float = 1.0) -> list[dict]:
    """Windows of `window` frames: the first step is the prompt, the rest the target (actions masked out). Frame
    codes that differ from the same position in the frame before weigh `changed_weight` in the loss (1: plain MLE)."""
    flags = frame_flags(episode)
    # The last frame has no action; any action token there is masked from the loss, so pad with zeros.
    actions = np.concatenate([episode.actions, np.zeros((1, R.ACTION_DIM), np.float32)])
    frame_tokens = codes.shape[1]
    step = R.step_length(frame_tokens)
    out = []
    for start in range(0, len(codes) - 1):
        end = min(start + window, len(codes))
        tokens = R.window_tokens(codes[start:end], flags[start:end], actions[start:end])
        prompt_len = 1 + step
        target = tokens[prompt_len:-R.ACTION_DIM]  # ends with the last frame's flag
        mask = np.array([(i % step) < frame_tokens + 1 for i in range(len(target))], dtype=float)
        for j in range(start + 1, end):
            frame = mask[(j - start - 1) * step :][:frame_tokens]  # a view: writes land in mask
            frame[codes[j] != codes[j - 1]] = changed_weight
        out.append({"prompt_ids": tokens[:prompt_len], "target_ids": target, "target_mask": mask.tolist()})
    return out


# ---------------------------------------------------------------------------------------------------- MLE


@dataclass
class RT1MLEConfig:
    data: str = "runs/rt1/train"
    """Training episodes (`rlvr-gym collect rt1`)."""
    heldout: str = ""
    """Held-out episodes for eval/loss (optional)."""
    tokenizer: str = "runs/rt1/tokenizer/final"
    """Trained frame tokenizer directory."""
    out: str = "runs/rt1/mle"
    """Run directory; the world model is written to OUT/world_model."""
    window: int = 4
    """Frames per training sequence (1 prompt frame + window-1 predicted)."""
    context_steps: int = 2
    """Past steps the world model sees when it predicts (rollouts slide this window)."""
    changed_weight: float = 1.0
    """Loss weight of the frame codes that differ from the frame before (about a quarter of them: the gripper and
    what it moves), which the static rest could drown. The held-out loss stays unweighted. Measured from rt1-mle
    (docs/research/rt1_experiments.md, session 11): 4 did not place moved objects better than plain MLE."""
    moved_windows: float = 0.0
    """Fraction of the training windows in which a whole object moves, repeating those windows to make it (19% of
    the collected ones at window 4; 0: as collected). The object error counts only such frames. Measured from rt1-mle
    (docs/research/rt1_experiments.md, session 15): 0.75 cut false repetition 2.4x but lost more objects and raised LPIPS."""
    size: LlamaSize = field(default_factory=lambda: LlamaSize(hidden_size=256, layers=4, heads=4, intermediate_size=512, max_positions=1024))
    """Transformer shape (trained from scratch)."""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=3000, lr=1e-3, batch_size=16, micro_batch=16, save_every=200, warmup_steps=100))
    """Trainer settings (run_dir is set from `out`). --sft.model DIR starts from a trained transformer (e.g. a world
    model's lm/ when its tokenizer was retrained) instead of one built from `size`."""


def whole_object_moves(episode: Episode) -> np.ndarray:
    """Per step t of the episode, whether a whole object moved between its real frames t and t + 1 (where the eval's
    object error has something to count)."""
    return R.moved_objects(episode.frames[1:], episode.frames[:-1], min_target_pixels=R.WHOLE_OBJECT_PIXELS).any(1)


def whole_object_reveals(episode: Episode) -> np.ndarray:
    """Per step t of the episode, whether an object came out from under the gripper between its real frames t and
    t + 1 (`R.revealed_objects`)."""
    return R.revealed_objects(episode.frames[1:], episode.frames[:-1]).any(1)


def windows_with_moves(episode: Episode, window: int) -> np.ndarray:
    """Per `mle_examples` window of the episode, whether a whole object moves in one of the frames it predicts."""
    moved = whole_object_moves(episode)
    return np.array([moved[start : start + window - 1].any() for start in range(len(episode.frames) - 1)], dtype=bool)


def run_rt1_mle(config: RT1MLEConfig) -> Path:
    if not 0 <= config.moved_windows < 1:
        raise ValueError(f"--moved-windows is a fraction in [0, 1), got {config.moved_windows}")
    d = RUN.setup_processes(config.sft.threads)
    out = Path(config.out)
    frame_tokenizer = load_frame_tokenizer(config.tokenizer)
    init = Path(config.sft.model) if config.sft.model else out / "init"
    sft = RUN.set_by_command(config.sft, "sft", run_dir=str(out), model=config.sft.model or str(init))
    if d.is_main and not config.sft.model and not (init / "config.json").is_file():
        torch.manual_seed(config.sft.seed)
        build_llama(R.VOCAB_SIZE, config.size).save_pretrained(init)
    RUN.barrier(d)
    train_episodes = load_episodes(config.data)
    held_episodes = load_episodes(config.heldout) if config.heldout else []
    examples = [ex for e in train_episodes
                for ex in mle_examples(episode_codes(frame_tokenizer, e), e, config.window, config.changed_weight)]
    if config.moved_windows > 0:
        moved = np.concatenate([windows_with_moves(e, config.window) for e in train_episodes])
        examples = repeat_moved(examples, moved, config.moved_windows)
        log.info("%d training windows after repeating; a whole object moves in %.0f%% of the collected ones",
                 len(examples), 100 * moved.mean())
    held = [ex for e in held_episodes for ex in mle_examples(episode_codes(frame_tokenizer, e), e, config.window)]
    lm_dir = train_sft(sft, examples, eval_examples=held)
    if d.is_main:
        world_dir = RobotWorldModel(load_model(lm_dir)[0], frame_tokenizer, WorldModelSettings(config.context_steps)).save(out / "world_model")
        # The learned simulator starts its episodes from these real first frames.
        save_initial_states(world_dir, train_episodes)
    RUN.barrier(d)
    return out / "world_model"


# ---------------------------------------------------------------------------------------------------- RLVR


@dataclass
class RT1RLVRConfig:
    data: str = "runs/rt1/train"
    """Episodes whose real next frames score the rollouts."""
    model: str = "runs/rt1/mle/world_model"
    """The MLE world model (a directory or shipped name). Its motion refiner, if it has one, refines the frames the
    reward scores and those the prompts are rolled out through (as in the learned env), and stays in OUT/world_model."""
    out: str = "runs/rt1/rlvr"
    """Run directory; the world model is written to OUT/world_model."""
    horizon: int = 1
    """Frames predicted per rollout (1: single-step; >1: real actions spliced between generated frames). A k-step
    rollout is one completion, so its prompt grows past `context_steps` by k-1 steps, where eval and the env slide
    the window instead, and its later frames follow the generated codes even for a model with `context_from_frames`.
    `--rollout-depth` prompts are the env's own: they come from `RobotWorldModel.rollout`."""
    object_weight: float = 0.5
    """Weight of the object term: the reward loses this times the mean over the objects showing in the real frame
    of min(centroid distance, 45 px) / 45, a lost object counting 1 (colours read from the frames, as the eval's
    object error). 0 (with no repetition penalty): RLVR-World's -(L1 + LPIPS) alone."""
    repetition_penalty: float = 0.15
    """Taken off the reward for each predicted frame that repeats the frame before it (the same codes) while the
    real frame changed: RLVR-World's repetition failure, read from the real codes."""
    rollout_depth: int = 4
    """Prompts sit 1..D frames deep into a rollout (drawn evenly): for depth d the model first predicts d-1 frames
    greedily from the real history under the real actions, sliding its window as the learned env does, and the
    prompt holds those predictions; the reward still scores the real next frame. 1: real history only (needed for
    --horizon > 1). The contexts are rolled out once, by the starting model, before training."""
    rollout_prompts: int = 2048
    """With --rollout-depth > 1: the number of (episode, t) prompts drawn (each needs its rollout)."""
    moved_prompts: float = 0.0
    """Fraction of the prompts whose real next frame moves a whole object (the eval's object error counts only
    those; about 9% of all). 0 keeps the data's own mix. With --rollout-depth > 1 the drawn prompts hold this
    fraction of them; with 1 (every transition a prompt) they are repeated until they make it."""
    revealed_prompts: float = 0.0
    """With --rollout-depth > 1: fraction of the prompts whose real next frame shows an object coming out from under
    the gripper (`R.revealed_objects`; a third of the moved ones), drawn before --moved-prompts' share. Every object
    the shipped models still lose is one of these (docs/research/rt1_experiments.md, session 19). Measured (session 20): 0.25
    of them, with 0.25 moved, did not place moved objects better at step 5 than rt1-mle."""
    seed: int = 0
    """Draws the rollout prompts."""
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(steps=200, lr=5e-5, prompts_per_step=8, group_size=8, beta=0.0,
                                                                 temperature=0.5, save_every=10))
    """Trainer settings (run_dir, model and max_new_tokens are set by this command). At temperature 1 the samples
    almost never repeat a frame, so the repetition penalty would never fire; the defaults are the shipped rt1-rlvr's
    (one process: prompts_per_step counts per process, so under two give 4 each)."""


def rlvr_examples(world: RobotWorldModel, episodes: list[Episode], horizon: int,
                  codes_per_episode: list[np.ndarray] | None = None) -> list[dict]:
    """One prompt per (episode, t): the last context steps up to frame t and action t, the next `horizon` real frames."""
    n = world.settings.context_steps
    out = []
    for index, episode in enumerate(episodes):
        codes = episode_codes(world.frame_tokenizer, episode) if codes_per_episode is None else codes_per_episode[index]
        flags = frame_flags(episode)
        for t in range(len(episode.actions) - horizon + 1):
            lo = max(0, t - n + 1)
            prompt = R.window_tokens(codes[lo : t + 1], flags[lo : t + 1], episode.actions[lo : t + 1])
            future = episode.actions[t + 1 : t + horizon]
            out.append({
                "prompt_ids": prompt,
                "forced": R.rollout_forced_tokens(future, flags[t + 1 : t + 1 + horizon], world.frame_tokens),
                "episode": index,
                "t": t,
                "last_codes": codes[t].tolist(),
            })
    return out


def example_flags(episodes: list[Episode], examples: list[dict],
                  per_step: Callable[[Episode], np.ndarray]) -> np.ndarray:
    """Per example, the flag that `per_step` (`whole_object_moves`, `whole_object_reveals`) gives its episode's step t."""
    per_episode = [per_step(e) for e in episodes]
    return np.array([per_episode[ex["episode"]][ex["t"]] for ex in examples], dtype=bool)


def draw_prompts(moved: np.ndarray, count: int, moved_fraction: float, rng: np.random.Generator,
                 revealed: np.ndarray | None = None, revealed_fraction: float = 0.0) -> np.ndarray:
    """`count` indices drawn without replacement: `revealed_fraction` of them (or all there are) from the `revealed`
    ones, then `moved_fraction` from the other `moved` ones, the rest from the others; with both 0, from all."""
    count = min(count, len(moved))
    if moved_fraction <= 0 and revealed_fraction <= 0:
        return rng.choice(len(moved), size=count, replace=False)
    revealed = np.zeros_like(moved) if revealed is None else revealed
    free = np.ones(len(moved), dtype=bool)
    picked = []
    for mask, fraction in ((revealed, revealed_fraction), (moved, moved_fraction), (~moved & ~revealed, 1.0)):
        pool = np.flatnonzero(mask & free)
        n = min(len(pool), round(count * fraction), count - sum(map(len, picked)))
        if n > 0:
            picked.append(rng.choice(pool, size=n, replace=False))
            free[picked[-1]] = False
    return np.concatenate(picked)


def repeat_moved(examples: list[dict], moved: np.ndarray, moved_fraction: float) -> list[dict]:
    """The examples, with the `moved` ones repeated until they make about `moved_fraction` of the list."""
    n_yes = int(moved.sum())
    if moved_fraction <= 0 or n_yes == 0 or n_yes == len(moved) or n_yes / len(moved) >= moved_fraction:
        return examples
    repeats = round(moved_fraction * (len(moved) - n_yes) / ((1 - moved_fraction) * n_yes))
    return examples + [ex for ex, m in zip(examples, moved) if m] * (repeats - 1)


def rollout_examples(world: RobotWorldModel, episodes: list[Episode], depth: int, count: int, seed: int = 0,
                     batch: int = 64, codes_per_episode: list[np.ndarray] | None = None,
                     moved_fraction: float = 0.0, revealed_fraction: float = 0.0) -> list[dict]:
    """Single-step prompts `count` (episode, t) pairs drawn at random (`moved_fraction` of them where a whole object
    moves, `revealed_fraction` where an object comes out from under the gripper; see `draw_prompts`), each d frames
    deep into a greedy rollout of the model (d drawn evenly from 1..depth): the frames after t-d+1 in the prompt are
    the model's predictions, made by `world.rollout` with the window sliding as in the learned env (and entering the
    prompt as it does there). "last_codes" is the prompt's last frame (what a repeat copies)."""
    codes = codes_per_episode or [episode_codes(world.frame_tokenizer, e) for e in episodes]
    flags = [frame_flags(e) for e in episodes]
    real = rlvr_examples(world, episodes, 1, codes)
    rng = np.random.default_rng(seed)
    focus = moved_fraction > 0 or revealed_fraction > 0
    none = np.zeros(len(real), dtype=bool)
    moved = example_flags(episodes, real, whole_object_moves) if focus else none
    revealed = example_flags(episodes, real, whole_object_reveals) if revealed_fraction > 0 else none
    drawn = draw_prompts(moved, count, moved_fraction, rng, revealed, revealed_fraction)
    if focus:
        log.info("%d prompts, %d where a whole object moves, %d of them where one comes out from under the gripper",
                 len(drawn), moved[drawn].sum(), revealed[drawn].sum())
    picked = [real[i] for i in drawn]
    # Frames predicted before each prompt: depth - 1, clipped at the episode's first frame.
    predicted = [min(int(d) - 1, ex["t"]) for ex, d in zip(picked, rng.integers(1, depth + 1, size=len(picked)))]
    out = [{**ex, "depth": 1} for ex, n in zip(picked, predicted) if n == 0]
    for n in range(1, depth):
        group = [ex for ex, m in zip(picked, predicted) if m == n]
        for s in range(0, len(group), batch):
            part = group[s : s + batch]
            begins = [(ex["episode"], ex["t"] - n) for ex in part]
            prompts = [world.prompt(codes[e][: b + 1], flags[e][: b + 1], episodes[e].actions[: b + 1]) for e, b in begins]
            future = [episodes[e].actions[b + 1 : b + n] for e, b in begins]
            rollout = world.rollout(prompts, RolloutStart.of_episodes(episodes, begins), k=n, future_actions=future)
            for ex, (e, b), frames, probs in zip(part, begins, rollout.context, rollout.success):
                history = list(codes[e][: b + 1]) + list(frames)
                history_flags = list(flags[e][: b + 1]) + [bool(p > 0.5) for p in probs]
                prompt = world.prompt(history, history_flags, episodes[e].actions[: ex["t"] + 1])
                out.append({**ex, "prompt_ids": prompt, "last_codes": frames[-1].tolist(), "depth": n + 1})
    return out


def frame_reward_fn(world: RobotWorldModel, episodes: list[Episode], horizon: int, object_weight: float = 0.0,
                    repetition_penalty: float = 0.0, codes_per_episode: list[np.ndarray] | None = None):
    """Reward -(L1 + LPIPS) of the decoded predicted frames against the real next frames, mean over the horizon,
    less the object term and the repetition penalty when their weights are set (see RT1RLVRConfig)."""
    real_codes = codes_per_episode
    if repetition_penalty and real_codes is None:
        real_codes = [episode_codes(world.frame_tokenizer, e) for e in episodes]

    def reward(completion_ids, episode, t, last_codes=None, **_) -> list[dict]:
        results: list[dict | None] = [None] * len(completion_ids)
        codes, targets, starts, firsts, befores, actions, rows = [], [], [], [], [], [], []
        for i, (ids, e, step) in enumerate(zip(completion_ids, episode, t)):
            frames, _, error = R.parse_rollout(ids, horizon, world.frame_tokens)
            if error:
                results[i] = {"score": R.PARSE_FAILURE_REWARD, "error": error}
                continue
            codes.append(frames)
            targets.append(episodes[e].frames[step + 1 : step + 1 + horizon])
            starts.append(episodes[e].frames[step])
            firsts.append(episodes[e].frames[0])
            befores.append(episodes[e].frames[max(step - 1, 0)])
            actions.append(episodes[e].actions[step : step + horizon])
            rows.append(i)
        if rows:
            pred = world.decode_rollout(np.stack(codes), np.stack(starts), np.stack(firsts), np.stack(befores),
                                        np.stack(actions))
            pred = pred.reshape(-1, *pred.shape[2:])
            target = np.concatenate(targets)
            l1, lpips = (x.numpy() for x in R.frame_reward_terms(pred, target))
            objects = R.object_reward_error(pred, target)
            per_frame = -(l1 + lpips) - object_weight * objects
            repeats = np.zeros(len(per_frame))
            if repetition_penalty:
                for j, i in enumerate(rows):
                    e, step = episode[i], t[i]
                    real = real_codes[e][step : step + 1 + horizon]
                    # The frame before the first predicted one is the prompt's last: a real frame, or the model's own.
                    before = real[:1] if last_codes is None else np.asarray(last_codes[i])[None]
                    predicted = np.concatenate([before, codes[j]])
                    repeats[j * horizon : (j + 1) * horizon] = ((predicted[1:] == predicted[:-1]).all(-1)
                                                                & (real[1:] != real[:-1]).any(-1))
                per_frame = per_frame - repetition_penalty * repeats
            for j, i in enumerate(rows):
                part = slice(j * horizon, (j + 1) * horizon)
                results[i] = {"score": float(per_frame[part].mean()), "l1": float(l1[part].mean()),
                              "lpips": float(lpips[part].mean()), "object": float(objects[part].mean()),
                              "false_repetition": float(repeats[part].mean())}
        return results

    return reward


def run_rt1_rlvr(config: RT1RLVRConfig) -> Path:
    if not 0 <= config.moved_prompts < 1:
        raise ValueError(f"--moved-prompts is a fraction in [0, 1), got {config.moved_prompts}")
    if not 0 <= config.revealed_prompts < 1 or config.moved_prompts + config.revealed_prompts >= 1:
        raise ValueError("--revealed-prompts is a fraction in [0, 1) whose sum with --moved-prompts stays below 1, got "
                         f"{config.revealed_prompts} and {config.moved_prompts}")
    if config.revealed_prompts > 0 and config.rollout_depth == 1:
        raise ValueError("--revealed-prompts needs --rollout-depth > 1 (prompts drawn, not every transition)")
    d = RUN.setup_processes(config.grpo.threads)
    out = Path(config.out)
    world = RobotWorldModel.load(config.model, d.device)  # rolls out the prompts and decodes the rewarded frames
    lm_dir = RobotWorldModel.resolve(config.model) / "lm"
    grpo = RUN.set_by_command(config.grpo, "grpo", run_dir=str(out), model=str(lm_dir),
                              max_new_tokens=R.rollout_length(config.horizon, world.frame_tokens))
    if config.rollout_depth > 1 and (config.horizon != 1 or world.context_frame != "first"):
        raise ValueError("--rollout-depth > 1 needs --horizon 1 and a frame tokenizer conditioned on the first frame "
                         "(pass --rollout-depth 1 for multi-frame rollouts from real history)")
    episodes = load_episodes(config.data)
    codes = [episode_codes(world.frame_tokenizer, e) for e in episodes]
    if config.rollout_depth > 1:
        examples = rollout_examples(world, episodes, config.rollout_depth, config.rollout_prompts, config.seed,
                                    codes_per_episode=codes, moved_fraction=config.moved_prompts,
                                    revealed_fraction=config.revealed_prompts)
    else:
        examples = rlvr_examples(world, episodes, config.horizon, codes)
        if config.moved_prompts > 0:
            moved = example_flags(episodes, examples, whole_object_moves)
            still = int((~moved).sum())
            examples = repeat_moved(examples, moved, config.moved_prompts)
            log.info("%d prompts, %d where a whole object moves", len(examples), len(examples) - still)
    reward = frame_reward_fn(world, episodes, config.horizon, config.object_weight, config.repetition_penalty, codes)
    final = train_grpo(grpo, reward, examples, decode=None, allowed_tokens=R.rollout_allowed_tokens(config.horizon, world.frame_tokens))
    if d.is_main:
        world.lm = load_model(final)[0]
        save_with_initial_states(world, config.model, out / "world_model")
    RUN.barrier(d)
    return out / "world_model"

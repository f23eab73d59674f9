"""Training a video world model's motion refiner on its transformer's own greedy predictions.

    rlvr-gym train refiner --data runs/rt1/train --world-model runs/rt1/mle/world_model --run-dir runs/rt1/refiner
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlvr_gym.data import video_tokens as V
from rlvr_gym.data.episodes import Episode, load_episodes
from rlvr_gym.data.robot import (
    episode_codes,
    frame_flags,
    whole_object_moves,
    whole_object_reveals,
)
from rlvr_gym.domains import robot as R
from rlvr_gym.domains.lpips import load_lpips
from rlvr_gym.models.frame_tokenizer import FrameTokenizer
from rlvr_gym.models.motion_refiner import MotionRefiner, MotionRefinerConfig
from rlvr_gym.models.robot_world_model import (
    RobotWorldModel,
    RolloutStart,
    load_motion_refiner,
    predict_in_batches,
)
from rlvr_gym.train import run as RUN
from rlvr_gym.train.frame_tokenizer import reconstruction_loss
from rlvr_gym.train.robot import rollout_starts, save_with_initial_states

log = logging.getLogger("rlvr_gym")


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
    Measured: it took the moved objects from 2.8 px to 1.5 at step 1."""
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
    """Whether RUN_DIR/world_model feeds the frames it shows back into its prompts (WorldModelSettings). Measured:
    with the refiner it keeps objects the codes alone drop in rollouts."""
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
            MotionRefiner(MotionRefinerConfig(config.width, config.bottleneck_blocks, V.ACTION_DIM)).save_pretrained(init)
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

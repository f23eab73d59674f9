"""Evaluating the robot video world model against fresh real episodes.

    rlvr-gym eval rt1 --checkpoint rt1-rlvr --episodes 20 --seed 7

Single-step: predict frame t+1 from the real history up to frame t and action t (teacher forcing).
Multi-step: predict frames t+1..t+k from the real history up to t, with the real actions spliced in between, one
frame at a time, the context window sliding over the predicted frames as it does in the learned env.
Every table carries the baselines a world model must beat: copying the last real frame (raw and through the
tokenizer) and the tokenizer's ceiling (the real next frame encoded and decoded).
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from rlvr_gym.data.episodes import CollectConfig, Episode, collect, load_episodes
from rlvr_gym.data.robot import episode_codes, frame_flags
from rlvr_gym.domains import robot as R
from rlvr_gym.domains.robot import WHOLE_OBJECT_PIXELS, object_position_error
from rlvr_gym.models.robot_world_model import RobotWorldModel, RolloutStart, predict_in_batches
from rlvr_gym.models.sampler import SamplingConfig


def changed_mse(pred: np.ndarray, target: np.ndarray, prev: np.ndarray) -> float:
    """Mean over frames of the MSE on pixels that changed from prev to target (NaN when none did)."""
    changed = R.changed_pixel_mse(pred, target, prev)
    return float(np.nanmean(changed.numpy())) if torch.isfinite(changed).any() else math.nan


ACTION_SIZE_EDGES = (0.05, 0.3, 0.6)
"""Edges of the action-size bins (an action's largest world_vector component, in [0, 1]): still, small, medium and
large moves. The scripted policies move at up to 0.85."""


def changed_mse_by_action_size(frames: dict[str, np.ndarray], target: np.ndarray, prev: np.ndarray,
                               actions: np.ndarray) -> list[dict]:
    """The changed-pixel MSE of each predictor in `frames` (name -> uint8 frames aligned with `target`) over the steps
    of each action size (`ACTION_SIZE_EDGES`; bins without steps left out): whether a world model's error on what
    moves grows with the move, and how much of it its tokenizer already makes (the ceiling's frames)."""
    edges = (0.0, *ACTION_SIZE_EDGES, 1.0)
    bins = np.digitize(np.abs(actions[:, :3]).max(1), ACTION_SIZE_EDGES)
    rows = []
    for b in np.unique(bins):
        steps = bins == b
        rows.append({"action_size": f"{edges[b]:g}-{edges[b + 1]:g}", "n": int(steps.sum()),
                     **{name: changed_mse(f[steps], target[steps], prev[steps]) for name, f in frames.items()}})
    return rows


def mean_of_defined(values: list[float]) -> float:
    """Mean over the values that are not NaN; NaN, without numpy's empty-slice warning, when all are: a metric that
    no step of a small episode set defines, such as object error where nothing moved."""
    values = np.asarray(values, dtype=float)
    return float(np.nanmean(values)) if not np.isnan(values).all() else math.nan


def object_errors(pred: np.ndarray, target: np.ndarray, since: np.ndarray) -> dict[str, float]:
    """Object error over the objects that moved since `since`: all of them, and those showing whole."""
    return {"object_error_px": object_position_error(pred, target, since),
            "object_error_px_whole": object_position_error(pred, target, since, min_target_pixels=WHOLE_OBJECT_PIXELS)}


def frame_metrics(pred: np.ndarray, target: np.ndarray, prev: np.ndarray, since: np.ndarray | None = None) -> dict[str, float]:
    """Mean of each per-frame metric over a batch of uint8 frames; prev is the real frame before the target, and
    object errors count the objects that moved since `since` (default prev; a rollout's start frame for k steps)."""
    return {
        "mse": float(R.mse(pred, target).mean()),
        "psnr": float(R.psnr(pred, target).clamp(max=60).mean()),
        "ssim": float(R.ssim(pred, target).mean()),
        "lpips": float(batched_lpips(pred, target).mean()),
        "changed_mse": changed_mse(pred, target, prev),
        **object_errors(pred, target, prev if since is None else since),
    }


def batched_lpips(pred: np.ndarray, target: np.ndarray, batch: int = 256) -> torch.Tensor:
    return torch.cat([R.lpips_distance(pred[i : i + batch], target[i : i + batch]) for i in range(0, len(pred), batch)])


@dataclass
class EpisodeTokens:
    episode: Episode
    codes: np.ndarray
    flags: np.ndarray


def tokenize_episodes(world: RobotWorldModel, episodes: list[Episode]) -> list[EpisodeTokens]:
    """Each episode with its frames' codes under the world model's tokenizer and its success flags."""
    return [EpisodeTokens(e, episode_codes(world.frame_tokenizer, e), frame_flags(e)) for e in episodes]


def fresh_episodes(episodes: int, seed: int, env_horizon: int = 30, split: str = "eval") -> list[Episode]:
    """`episodes` new real episodes collected with `seed` (one never used for training data), kept in memory."""
    with tempfile.TemporaryDirectory() as tmp:
        collect(CollectConfig(out=tmp + "/episodes", episodes=episodes, seed=seed, horizon=env_horizon, split=split))
        return load_episodes(tmp + "/episodes")


def single_step_prompts(world: RobotWorldModel, data: list[EpisodeTokens]):
    prompts, where = [], []
    for i, e in enumerate(data):
        for t in range(len(e.episode.actions)):
            prompts.append(world.prompt(e.codes[: t + 1], e.flags[: t + 1], e.episode.actions[: t + 1]))
            where.append((i, t))
    return prompts, where


def multi_step_prompts(world: RobotWorldModel, data: list[EpisodeTokens], k: int):
    prompts, future, where = [], [], []
    for i, e in enumerate(data):
        for t in range(0, len(e.episode.actions) - k + 1, k):
            prompts.append(world.prompt(e.codes[: t + 1], e.flags[: t + 1], e.episode.actions[: t + 1]))
            future.append(e.episode.actions[t + 1 : t + k])
            where.append((i, t))
    return prompts, future, where


def rollout_start(data: list[EpisodeTokens], where: list[tuple[int, int]]) -> RolloutStart:
    """The real frames behind prompts ending at step t of episode i, for each (i, t) in `where`."""
    return RolloutStart.of_episodes([d.episode for d in data], where)


def evaluate_world_model(world: RobotWorldModel, episodes: list[Episode], horizon: int = 5,
                         sampling: SamplingConfig | None = None, choose=None) -> dict:
    """Metrics of single-step and `horizon`-step predictions on the episodes, with the baselines.

    `choose(prompts, start, k, future) -> Rollout` replaces greedy prediction (best-of-N, rejection sampling).
    A frame repeats when its codes equal those the prompt held for the frame before (the real codes at step 1 of a
    rollout; after that the predicted frame as it entered the prompt, see `context_from_frames`).
    """
    sampling = sampling or SamplingConfig(temperature=0.0)
    data = tokenize_episodes(world, episodes)
    result: dict = {"n_episodes": len(episodes)}

    prompts, where = single_step_prompts(world, data)
    start = rollout_start(data, where)
    idx = np.array(where)
    target = np.stack([data[i].episode.frames[t + 1] for i, t in where])
    prev, firsts, befores, actions = start.last, start.first, start.before, start.action[:, None]
    prev_codes = np.stack([data[i].codes[t] for i, t in where])
    next_codes = np.stack([data[i].codes[t + 1] for i, t in where])

    def decode_one(c: np.ndarray) -> np.ndarray:
        return world.decode_rollout(c[:, None], prev, firsts, befores, actions)[:, 0]

    rollout = (choose or partial(predict_in_batches, world, sampling=sampling))(prompts, start, 1, None)
    codes, pred = rollout.codes, rollout.frames[:, 0]
    ceiling = decode_one(next_codes)
    result["single"] = {
        "model": {**frame_metrics(pred, target, prev), "repetition_rate": R.repetition_rate(codes[:, 0], prev_codes),
                  "false_repetition_rate": R.false_repetition_rate(codes[:, 0], prev_codes, next_codes, prev_codes),
                  "moving_repetition_rate": R.moving_repetition_rate(codes[:, 0], prev_codes, target, prev),
                  "frozen_rate": R.frozen_frame_rate(pred, prev, target, prev), "n": len(idx)},
        "copy_last_frame": frame_metrics(prev, target, prev),
        "copy_last_frame_tokenized": frame_metrics(decode_one(prev_codes), target, prev),
        "tokenizer_ceiling": frame_metrics(ceiling, target, prev),
        "real_repetition_rate": R.repetition_rate(next_codes, prev_codes),
        "changed_mse_by_action_size": changed_mse_by_action_size(
            {"model": pred, "tokenizer_ceiling": ceiling, "copy_last_frame": prev}, target, prev, start.action),
    }

    prompts, future, where = multi_step_prompts(world, data, horizon)
    if prompts:
        start = rollout_start(data, where)
        rollout = (choose or partial(predict_in_batches, world, sampling=sampling))(prompts, start, horizon, future)
        codes, preds = rollout.codes, rollout.frames
        per_step = []
        for j in range(horizon):
            target = np.stack([data[i].episode.frames[t + 1 + j] for i, t in where])
            prev = np.stack([data[i].episode.frames[t + j] for i, t in where])
            previous_pred = np.stack([data[i].codes[t] for i, t in where]) if j == 0 else rollout.context[:, j - 1]
            real_codes = np.stack([data[i].codes[t + 1 + j] for i, t in where])
            previous_real = np.stack([data[i].codes[t + j] for i, t in where])
            pred = preds[:, j]
            per_step.append({
                "step": j + 1,
                # Objects that moved since the rollout began, for the model and the copy baseline alike.
                **frame_metrics(pred, target, prev, since=start.last),
                "repetition_rate": R.repetition_rate(codes[:, j], previous_pred),
                "false_repetition_rate": R.false_repetition_rate(codes[:, j], previous_pred, real_codes, previous_real),
                "moving_repetition_rate": R.moving_repetition_rate(codes[:, j], previous_pred, target, prev),
                "frozen_rate": R.frozen_frame_rate(pred, start.last if j == 0 else preds[:, j - 1], target, prev),
                "real_repetition_rate": R.repetition_rate(real_codes, previous_real),
                "copy_start_psnr": float(R.psnr(start.last, target).clamp(max=60).mean()),
                "copy_start_changed_mse": changed_mse(start.last, target, prev),
                **{f"copy_start_{k}": v for k, v in object_errors(start.last, target, start.last).items()},
            })
        keys = ["mse", "psnr", "ssim", "lpips", "changed_mse", "object_error_px", "repetition_rate", "false_repetition_rate",
                "moving_repetition_rate", "frozen_rate", "real_repetition_rate"]
        result["multi"] = {
            "horizon": horizon,
            "n": len(prompts),
            "per_step": per_step,
            "model": {k: mean_of_defined([s[k] for s in per_step]) for k in keys},
        }
    return result


def summary_line(result: dict) -> dict:
    """The flat JSON line `rlvr-gym eval rt1` prints."""
    single = result["single"]["model"]
    line = {f"{k}": single[k] for k in ("mse", "psnr", "ssim", "lpips", "repetition_rate", "false_repetition_rate",
                                        "moving_repetition_rate", "frozen_rate")}
    line["real_repetition_rate"] = result["single"]["real_repetition_rate"]
    motion = ("changed_mse", "object_error_px", "object_error_px_whole")
    line.update({f"single_{k}": single[k] for k in motion})
    line.update({f"copy_last_frame_{k}": result["single"]["copy_last_frame"][k] for k in ("psnr", *motion)})
    line.update({f"tokenizer_ceiling_{k}": result["single"]["tokenizer_ceiling"][k] for k in ("psnr", *motion)})
    by_size = result["single"]["changed_mse_by_action_size"]
    if by_size and by_size[-1]["action_size"].startswith(f"{ACTION_SIZE_EDGES[-1]:g}-"):
        large = {k: v for k, v in by_size[-1].items() if k not in ("action_size", "n")}
        line.update({f"{k}_changed_mse_large_moves": v for k, v in large.items()})
    if "multi" in result:
        line.update({f"multi_{k}": v for k, v in result["multi"]["model"].items()})
        last = result["multi"]["per_step"][-1]
        line.update({f"multi_step{last['step']}_{k}": last[k] for k in ("psnr", *motion)})
        line.update({f"multi_step{last['step']}_copy_{k}": last[f"copy_start_{k}"] for k in ("psnr", *motion)})
    line["n"] = single["n"]
    return line


def rollout_gif(worlds: dict[str, RobotWorldModel], episode, steps: int, path: Path) -> Path:
    """Real frames next to each model's autoregressive prediction under the real actions (greedy, from frame 0)."""
    from PIL import Image

    steps = min(steps, len(episode.actions))
    columns = [episode.frames[: steps + 1]]
    for world in worlds.values():
        codes = [world.encode(episode.frames[:1], episode.frames[:1])[0]]
        flags = [False]
        frames = [episode.frames[0]]
        for t in range(steps):
            prompt = world.prompt(codes, flags, episode.actions[: t + 1])
            start = RolloutStart(frames[-1][None], episode.frames[:1], frames[max(t - 1, 0)][None], episode.actions[t][None])
            rollout = world.rollout([prompt], start, k=1)
            codes.append(rollout.context[0, 0])
            flags.append(bool(rollout.success[0, 0] > 0.5))
            frames.append(rollout.frames[0, 0])
        columns.append(np.stack(frames))
    images = [Image.fromarray(np.concatenate([col[t] for col in columns], 1)).resize((64 * len(columns) * 3, 192), Image.NEAREST)
              for t in range(steps + 1)]
    images[0].save(path, save_all=True, append_images=images[1:], duration=300, loop=0)
    return path


@dataclass
class RT1EvalConfig:
    checkpoint: str = "rt1-rlvr"
    """World model: a shipped name (rt1-mle, rt1-rlvr) or a directory."""
    episodes: int = 20
    """Fresh real episodes to collect and predict."""
    seed: int = 7
    """Collection seed (use one never used for training data)."""
    horizon: int = 5
    """Frames per multi-step rollout."""
    env_horizon: int = 30
    """Steps per collected episode at most."""
    temperature: float = 0.0
    """Sampling temperature of the predictions (0: greedy)."""
    out: str = ""
    """Optional path of a JSON file for the full result (per-step tables, baselines)."""
    device: str = "cpu"
    """Where the world model runs: cpu, cuda, cuda:N, or auto (the first GPU if there is one). The metrics are
    computed on the CPU."""
    precision: str = "float32"
    """float32 or bfloat16: the world model's weight products (`RobotWorldModel.precision`)."""
    tokens_only: bool = False
    """Score the transformer's own frames, as RLVR-World does and as GRPO trains it: decoded without the motion
    refiner, each frame's generated codes fed back into the prompt (`RobotWorldModel.tokens_only`)."""


def run_rt1_eval(config: RT1EvalConfig) -> dict:
    world = RobotWorldModel.load(config.checkpoint, config.device, config.precision)
    if config.tokens_only:
        world = world.tokens_only()
    episodes = fresh_episodes(config.episodes, config.seed, config.env_horizon)
    result = evaluate_world_model(world, episodes, config.horizon, SamplingConfig(temperature=config.temperature))
    if config.out:
        Path(config.out).parent.mkdir(parents=True, exist_ok=True)
        Path(config.out).write_text(json.dumps(result, indent=2))
    return summary_line(result)

"""Where an RT-1 world model's object error comes from: objects it loses against objects it misplaces, at step 1 and
step k, beside copying the last frame and the tokenizer's ceiling.

    python -m bench.rt1_objects --checkpoints rt1-mle rt1-rlvr     # writes runs/bench/rt1_objects.{md,json}

Whole objects that moved (15+ pixels in the real frame), greedy predictions; step 1 from the real history, step k
after k frames rolled out under the real actions with the window sliding as in the learned env. The eval's object
error counts a lost object 45 px; here the two parts are apart.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from rlvr_gym.domains.robot import LOST_OBJECT_PX, WHOLE_OBJECT_PIXELS, moved_object_distances
from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.evaluation.robot import (
    EpisodeTokens,
    fresh_episodes,
    multi_step_prompts,
    rollout_start,
    single_step_prompts,
    tokenize_episodes,
)
from rlvr_gym.models.robot_world_model import RobotWorldModel, predict_in_batches
from rlvr_gym.models.sampler import SamplingConfig


def breakdown(distances: np.ndarray) -> dict:
    """Mean with a lost object at 45 px, the lost fraction, and the kept objects' mean / median / 90th percentile."""
    lost = np.isnan(distances)
    kept = distances[~lost] if (~lost).any() else np.array([np.nan])
    return {"n": int(distances.size), "mean_px": float(np.where(lost, LOST_OBJECT_PX, distances).mean()),
            "lost": float(lost.mean()), "kept_mean_px": float(kept.mean()), "kept_median_px": float(np.median(kept)),
            "kept_p90_px": float(np.percentile(kept, 90))}


def gap_to_copying(distances: np.ndarray, copy_distances: np.ndarray, resamples: int = 2000, seed: int = 0) -> dict:
    """Mean of (prediction's distance - copying's) over the same objects, a lost one at 45 px, with a 95% bootstrap
    interval over the objects: above 0 means copying the last frame places them better."""
    gap = np.where(np.isnan(distances), LOST_OBJECT_PX, distances) - copy_distances
    means = gap[np.random.default_rng(seed).integers(0, len(gap), (resamples, len(gap)))].mean(1)
    return {"minus_copy_px": float(gap.mean()), "ci95_low": float(np.percentile(means, 2.5)),
            "ci95_high": float(np.percentile(means, 97.5))}


def whole_object_distances(pred: np.ndarray, target: np.ndarray, since: np.ndarray) -> np.ndarray:
    return moved_object_distances(pred, target, since, min_target_pixels=WHOLE_OBJECT_PIXELS)


def object_rows(world: RobotWorldModel, data: list[EpisodeTokens], horizon: int) -> dict[str, dict]:
    """Breakdowns of copying, the tokenizer's ceiling and the model, at step 1 and step `horizon`."""
    greedy = SamplingConfig(temperature=0.0)
    rows = {}
    for k in (1, horizon):
        if k == 1:
            prompts, where = single_step_prompts(world, data)
            future = None
        else:
            prompts, future, where = multi_step_prompts(world, data, k)
        begin = rollout_start(data, where)
        decoded = predict_in_batches(world, prompts, begin, k, future, greedy).frames
        start, first, before = begin.last, begin.first, begin.before
        target = np.stack([data[i].episode.frames[t + k] for i, t in where])
        real_codes = np.stack([data[i].codes[t + k] for i, t in where])
        actions = np.stack([data[i].episode.actions[t : t + k] for i, t in where])
        predicted = decoded[:, -1]
        # The ceiling decodes the real frame's codes against the same frames the model's last frame had.
        history = np.concatenate([before[:, None], start[:, None], decoded[:, :-1]], 1)
        ceiling = world.decode_rollout(real_codes[:, None], history[:, -1], first, history[:, -2], actions[:, -1:])[:, 0]
        copying = whole_object_distances(start, target, start)
        rows[f"step {k}, copy last real frame"] = breakdown(copying)
        for row, frames in ((f"step {k}, tokenizer ceiling", ceiling), (f"step {k}, model", predicted)):
            distances = whole_object_distances(frames, target, start)
            rows[row] = {**breakdown(distances), **gap_to_copying(distances, copying)}
    return rows


def main(out_dir: str = "runs/bench", checkpoints: tuple[str, ...] = ("rt1-mle", "rt1-rlvr"), episodes: int = 60,
         seed: int = 21, horizon: int = 5, env_horizon: int = 30) -> dict:
    torch.set_num_threads(1)
    real_episodes = fresh_episodes(episodes, seed, env_horizon)
    report = {"episodes": episodes, "seed": seed, "horizon": horizon, "checkpoints": {}}
    for name in checkpoints:
        world = RobotWorldModel.load(name)
        report["checkpoints"][name] = object_rows(world, tokenize_episodes(world, real_episodes), horizon)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rt1_objects.json").write_text(json.dumps(report, indent=2))
    table = [{"checkpoint": name, "prediction": row, **stats}
             for name, rows in report["checkpoints"].items() for row, stats in rows.items()]
    (out / "rt1_objects.md").write_text(
        f"# RT-1 world models: lost vs misplaced objects\n\n{episodes} fresh real episodes (collection seed {seed}), "
        f"whole objects that moved, greedy predictions; `mean_px` counts a lost object {LOST_OBJECT_PX:.0f} px, the "
        "kept columns are over the objects the prediction shows; `minus_copy_px` is the mean over the same objects of "
        "the prediction's distance less copying's, with a 95% bootstrap interval over the objects (above 0: copying "
        "places them better).\n\n" + markdown_table(table, digits=3) + "\n")
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="runs/bench")
    parser.add_argument("--checkpoints", nargs="+", default=["rt1-mle", "rt1-rlvr"])
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--horizon", type=int, default=5)
    args = parser.parse_args()
    main(args.out_dir, tuple(args.checkpoints), args.episodes, args.seed, args.horizon)

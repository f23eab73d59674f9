"""What the RT-1 recipes share: saving a trained world model with its start states, and drawing prompts where
objects move. The recipes, one module each: frame_tokenizer, rt1_mle, refiner, rt1_rlvr, state_reader.

    rlvr-gym train tokenizer --data runs/rt1/train --heldout runs/rt1/heldout --run-dir runs/rt1/tokenizer
    rlvr-gym train rt1-mle   --data runs/rt1/train --tokenizer runs/rt1/tokenizer/final --run-dir runs/rt1/mle
    rlvr-gym train refiner   --data runs/rt1/train --world-model runs/rt1/mle/world_model --run-dir runs/rt1/refiner
    rlvr-gym train rt1-rlvr  --data runs/rt1/train --model runs/rt1/mle/world_model --run-dir runs/rt1/rlvr
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np

from rlvr_gym.data.episodes import Episode
from rlvr_gym.data.real_env_versions import REAL_ENV_FILE
from rlvr_gym.data.robot import INITIAL_STATES, whole_object_moves
from rlvr_gym.models.robot_world_model import RobotWorldModel

log = logging.getLogger("rlvr_gym")


def save_with_initial_states(world: RobotWorldModel, source: str | os.PathLike, out: Path) -> Path:
    """Save `world` (the model loaded from `source` with a network trained or replaced) to `out`, with the initial
    states of `source`, so that the learned env can start from it."""
    world.to("cpu").save(out)
    for name in (INITIAL_STATES, REAL_ENV_FILE):
        if (RobotWorldModel.resolve(source) / name).is_file():
            shutil.copy2(RobotWorldModel.resolve(source) / name, out / name)
    return out


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



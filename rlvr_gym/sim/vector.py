"""What the batched learned envs (RT1WorldVectorEnv, TextGameDiscreteVectorEnv) share: reading `reset`'s arguments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def reset_arguments(num_envs: int, seed: int | Sequence[int | None] | None,
                    options: dict[str, Any] | None) -> tuple[np.ndarray, list[int | None], list[int | None]]:
    """(which sub-envs to reset, a seed per sub-env, a start index per sub-env) from a VectorEnv reset's `seed` (s
    seeds sub-env i with s + i, as SyncVectorEnv does; or one per sub-env) and `options` (gymnasium's `reset_mask`;
    `index`: one start index for all, or one per sub-env)."""
    options = dict(options or {})
    mask = options.pop("reset_mask", None)
    if mask is None:
        mask = np.ones(num_envs, dtype=bool)
    elif not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (num_envs,):
        raise ValueError(f"options['reset_mask'] must be a bool numpy array of shape ({num_envs},), got {mask!r}")
    seeds = [seed + i for i in range(num_envs)] if isinstance(seed, (int, np.integer)) else seed
    seeds = [None] * num_envs if seeds is None else list(seeds)
    if len(seeds) != num_envs:
        raise ValueError(f"reset needs one seed per sub-env ({num_envs}), got {len(seeds)}")
    indices = options.pop("index", None)
    indices = [indices] * num_envs if indices is None or isinstance(indices, (int, np.integer)) else list(indices)
    if len(indices) != num_envs:
        raise ValueError(f"options['index'] must be one int or a list of {num_envs}, got {len(indices)}")
    return mask, seeds, indices

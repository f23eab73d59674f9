"""What the Discrete SB3 wrappers of the language simulators (text game, web) share: stable feature hashing and the
mask of candidate indices."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np


def stable_bucket(feature: str, size: int) -> int:
    """A bucket in [0, size) for a feature string, the same in every process (Python's str hash is salted)."""
    return zlib.crc32(feature.encode("utf-8")) % size


def action_mask(candidates: Sequence[str], max_candidates: int) -> np.ndarray:
    """Which discrete actions name a candidate (for sb3-contrib's MaskablePPO)."""
    mask = np.zeros(max_candidates, dtype=bool)
    mask[: min(len(candidates), max_candidates)] = True
    return mask

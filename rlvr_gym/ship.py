"""`rlvr-gym ship textgame|web`: turn a trained text or web world model into a checkpoint the learned envs start from.

A shipped checkpoint is the model and tokenizer in fp16 (loading casts back to fp32), the real start states the
env resets to (TextWorld games from held-out seeds, or MiniWoB pages from held-out seeds, recorded here in the real
engine or browser), the web model's training record (which tasks and seeds it saw), and CARD.md, written by hand
with the commands and the measured numbers. Shipping into `rlvr_gym/checkpoints/NAME` makes NAME usable by every
`--checkpoint` option and by `gym.make(..., checkpoint=NAME)`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlvr_gym.models.lm import SHIPPED_DIR, resolve_checkpoint, ship_lm


@dataclass
class ShipConfig:
    src: str
    """The trained model: a run's final/ or a checkpoint directory (with its tokenizer)."""
    name: str
    """Name of the shipped checkpoint (e.g. textgame-rlvr): written to rlvr_gym/checkpoints/NAME unless --out."""
    domain: Literal["textgame", "web"] = "textgame"
    """Which start states go with it: TextWorld games (textgame) or MiniWoB pages (web)."""
    out: str = ""
    """Directory to write instead of rlvr_gym/checkpoints/NAME."""
    start_states: int = 32
    """TextWorld games (textgame) or pages per task (web) to record as start states, from held-out seeds."""


def ship(config: ShipConfig) -> Path:
    """Write the shipped checkpoint; returns its directory (an existing one is replaced, its CARD.md kept)."""
    src = resolve_checkpoint(config.src)
    out = Path(config.out) if config.out else SHIPPED_DIR / config.name
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    ship_lm(src, tmp)
    for extra in ("web_training.json", "CARD.md"):
        source = src / extra if (src / extra).is_file() else out / extra
        if source.is_file():
            shutil.copy(source, tmp / extra)
    if config.domain == "textgame":
        from rlvr_gym.sim.textgame import HELD_OUT_SEED, write_start_states

        write_start_states(tmp, range(HELD_OUT_SEED, HELD_OUT_SEED + config.start_states))
    else:
        from rlvr_gym.sim.web import START_SEEDS, write_start_pages

        write_start_pages(tmp, seeds=list(START_SEEDS)[: config.start_states])
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out

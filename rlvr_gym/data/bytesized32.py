"""ByteSized32 state-prediction transitions (Wang et al., ACL 2024), read in the benchmark's own JSONL format.

A record holds `current_state`, `action_state` and `tick_state` (each with `objects` and text fields),
`current_score_state`, `next_score_state`, `game` and `state_id`. A `Transition` keeps what a world model
needs: the state before the action, the action (`action_state.lastAction`), and the complete next state
(`tick_state` objects with `next_score_state`: the action's effect and one tick of the world's own dynamics).
States follow `rlvr_gym.domains.textgame`'s schema.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DATA_ENV_VAR = "RLVR_GYM_BYTESIZED32"
SPLIT_FILES = ("train.jsonl.gz", "valid.jsonl.gz")
_RECORD_KEYS = ("game", "state_id", "current_state", "action_state", "tick_state", "current_score_state", "next_score_state")
_OBJECT_FIELDS = {"name": str, "uuid": int, "type": str, "properties": dict, "contains": list}


@dataclass(frozen=True)
class Transition:
    """One simulated step of a text game."""

    game: str
    """game name, e.g. `boil-water`"""
    state_id: int
    """position in the benchmark's crawl of the game; `(game, state_id)` identifies the transition"""
    task: str
    """the game's task description (`taskDesc`)"""
    current: dict[str, Any]
    """state before the action: `{"objects": [...], "score", "gameOver", "gameWon"}`"""
    action: str
    """the action being simulated"""
    next: dict[str, Any]
    """state after the action and one world tick, same schema as `current`"""


def installed_data_dir() -> Path:
    """Where `rlvr-gym data bytesized32` puts the data: `$XDG_DATA_HOME/rlvr-gym/bytesized32` (~/.local/share)."""
    root = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(root) / "rlvr-gym" / "bytesized32"


def data_dir() -> Path:
    """The ByteSized32 folder (train.jsonl.gz, valid.jsonl.gz): `$RLVR_GYM_BYTESIZED32` when set; else the folder
    `rlvr-gym data bytesized32` installed; else `$RLVR_GYM_SHARED/data/bytesized32`, by default the `shared/` checkout
    beside the repository. With none present, the installed folder, whose absence `load_transitions` explains."""
    if os.environ.get(DATA_ENV_VAR):
        return Path(os.environ[DATA_ENV_VAR])
    shared = os.environ.get("RLVR_GYM_SHARED") or Path(__file__).resolve().parents[2].parent / "shared"
    for candidate in (installed_data_dir(), Path(shared) / "data" / "bytesized32"):
        if all((candidate / name).is_file() for name in SPLIT_FILES):
            return candidate
    return installed_data_dir()


@dataclass
class DataConfig:
    """Install the ByteSized32 state-prediction data where every command finds it."""

    source: str
    """a folder holding train.jsonl.gz and valid.jsonl.gz (ByteSized32-State-Prediction, as in the repository's
    `shared/data/bytesized32`)"""
    dest: str = ""
    """where to put them; empty: `installed_data_dir()`"""


def install_data(config: DataConfig) -> dict[str, Any]:
    """Check that every file of `config.source` reads as ByteSized32 records, then copy them to `config.dest`."""
    source, dest = Path(config.source), Path(config.dest) if config.dest else installed_data_dir()
    missing = [name for name in SPLIT_FILES if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{source} has no {' or '.join(missing)}: pass the folder of the ByteSized32 "
                                f"state-prediction data, which holds {' and '.join(SPLIT_FILES)}")
    counts = {name: len(load_transitions(source / name)) for name in SPLIT_FILES}
    dest.mkdir(parents=True, exist_ok=True)
    for name in SPLIT_FILES:
        partial = dest / f".{name}.partial"
        shutil.copyfile(source / name, partial)
        partial.replace(dest / name)
    log.info("installed %s into %s", ", ".join(f"{n} ({c} transitions)" for n, c in counts.items()), dest)
    return {"dest": str(dest), **{name: count for name, count in counts.items()}}


def load_transitions(path: str | os.PathLike) -> list[Transition]:
    """Read a plain or gzipped (`.gz`) JSONL file of ByteSized32 records; a bad record raises naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file. Pass a ByteSized32 .jsonl or .jsonl.gz file (--data), point ${DATA_ENV_VAR} at a "
            f"folder holding {' and '.join(SPLIT_FILES)}, or install that folder once with "
            "`rlvr-gym data bytesized32 --source DIR`")
    opener = gzip.open if path.name.endswith(".gz") else open
    transitions = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                transitions.append(_transition(json.loads(line)))
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{line_no}: not a ByteSized32 record: {e}") from None
    return transitions


def _transition(record: Any) -> Transition:
    if not isinstance(record, dict):
        raise TypeError(f"expected a JSON object, got {type(record).__name__}")
    missing = [k for k in _RECORD_KEYS if k not in record]
    if missing:
        raise KeyError(f"missing keys {missing}; a record has {list(_RECORD_KEYS)}")
    for key in _RECORD_KEYS[2:]:
        _typed(record[key], dict, key)
    action, tick_action = record["action_state"].get("lastAction"), record["tick_state"].get("lastAction")
    if not isinstance(action, str) or action != tick_action:
        raise ValueError(f"action_state.lastAction {action!r} must be a string equal to tick_state.lastAction {tick_action!r}")
    return Transition(
        game=_typed(record["game"], str, "game"),
        state_id=_typed(record["state_id"], int, "state_id"),
        task=_typed(record["current_state"].get("taskDesc", ""), str, "current_state.taskDesc"),
        current=_state(record["current_state"], record["current_score_state"], "current_state"),
        action=action,
        next=_state(record["tick_state"], record["next_score_state"], "tick_state"),
    )


def _state(game_state: dict, score_state: dict, where: str) -> dict[str, Any]:
    objects = _typed(game_state.get("objects"), list, f"{where}.objects")
    seen = set()
    for i, obj in enumerate(objects):
        _typed(obj, dict, f"{where}.objects[{i}]")
        for field, kind in _OBJECT_FIELDS.items():
            _typed(obj.get(field), kind, f"{where}.objects[{i}].{field}")
        if not all(isinstance(c, str) for c in obj["contains"]):
            raise TypeError(f"{where}.objects[{i}].contains must list object names (strings)")
        if obj["uuid"] in seen:
            raise ValueError(f"{where}.objects[{i}]: uuid {obj['uuid']} appears twice")
        seen.add(obj["uuid"])
    score = score_state.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise TypeError(f"score must be a number, got {score!r}")
    return {
        "objects": [{field: obj[field] for field in _OBJECT_FIELDS} for obj in objects],
        "score": score,
        "gameOver": _typed(score_state.get("gameOver"), bool, "gameOver"),
        "gameWon": _typed(score_state.get("gameWon"), bool, "gameWon"),
    }


def _typed(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{where} must be {kind.__name__}, got {type(value).__name__}")
    return value

"""Files every layer writes and reads: atomic text writes, the JSONL log a training run keeps, and the error a
missing or damaged checkpoint raises."""

from __future__ import annotations

import json
import os
from pathlib import Path

LOG_FILE = "log.jsonl"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: readers see the old or the new."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_log(run_dir: str | os.PathLike) -> list[dict]:
    """The records of RUN_DIR/log.jsonl, one dict per logged step ([] before the first)."""
    path = Path(run_dir) / LOG_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, incomplete or unreadable."""


def path_label(path: str | os.PathLike) -> str:
    """A path as one directory name, whole: runs/a/final and runs/b/final stay apart; a shipped name is itself."""
    return os.path.normpath(path).strip(os.sep).replace(os.sep, "_")

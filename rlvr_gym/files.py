"""Files every layer writes and reads: atomic text writes, and the JSONL log a training run keeps."""

from __future__ import annotations

import json
import os
from pathlib import Path

LOG_FILE = "log.jsonl"


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_log(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, incomplete or unreadable."""

"""Files every layer writes and reads: atomic text writes, the JSONL log a training run keeps, the fingerprint a cache
keys a model directory by, and the error a missing or damaged checkpoint raises."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

LOG_FILE = "log.jsonl"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: readers see the old or the new."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_write_jsonl_gz(path: Path, records: Iterable[dict]) -> None:
    """Records as gzipped JSON lines, written beside `path` and renamed over it (a killed write leaves no half file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(tmp, path)


def read_log(run_dir: str | os.PathLike) -> list[dict]:
    """The records of RUN_DIR/log.jsonl, one dict per logged step ([] before the first)."""
    path = Path(run_dir) / LOG_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


PROSE_FILES = ("CARD.md", "README.md")
"""A checkpoint's prose, which `content_fingerprint` of its directory leaves out."""


def content_fingerprint(path: str | os.PathLike) -> str:
    """A hash of a file's bytes, or of every file of a directory (relative names and bytes) but its prose (a model
    card): it changes when a weight, a setting or a start state changes, not when the card is edited, and stays the
    same in a fresh clone, where every mtime is new."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name not in PROSE_FILES)
    else:
        files = [path]
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.relative_to(path) if path.is_dir() else file.name}\0".encode())
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, incomplete or unreadable."""


def path_label(path: str | os.PathLike) -> str:
    """A path as one directory name, whole: runs/a/final and runs/b/final stay apart; a shipped name is itself."""
    return os.path.normpath(path).strip(os.sep).replace(os.sep, "_")

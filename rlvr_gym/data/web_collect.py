"""Recording real MiniWoB++ transitions in Chromium into a web dataset (`rlvr-gym collect web`), several browsers in
parallel processes; the format is `rlvr_gym.data.web`'s."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.util import Finalize
from pathlib import Path

from tqdm import tqdm

from envs.web import TASKS, WebTaskEnv, record_transitions, task_done
from envs.web.env import BROWSER_ERRORS
from envs.web.solvers import EXPERTS, MISTAKE_POLICIES, TRIVIAL_POLICIES
from rlvr_gym.data.web import FORMAT, FORMAT_VERSION, MANIFEST, SEEDS_PER_RUN, TRAIN_TASKS, read_manifest
from rlvr_gym.files import atomic_write_jsonl_gz, atomic_write_text
from rlvr_gym.logs import configure_logging

log = logging.getLogger(__name__)

Job = tuple[str, int, float | str]  # task, MiniWoB seed, scripted skill or trivial policy name


@dataclass
class WebCollectConfig:
    out: str = "runs/web/train"
    """Output directory: one <task>.jsonl.gz per task and manifest.json."""
    tasks: tuple[str, ...] = TRAIN_TASKS
    """Tasks to record (default: the 11 training tasks; the held-out set adds enter-text and click-collapsible-2)."""
    episodes: int = 40
    """Episodes per task."""
    seed: int = 0
    """Collection seed: episode i of a task plays MiniWoB seed seed * 1_000_000 + i; held-out sets use another one."""
    skills: tuple[float, ...] = (1.0, 0.7, 0.4, 0.1)
    """Scripted-policy skills, in turn (episode i gets skills[i % len]): the probability of an expert move at each
    step, otherwise a random action."""
    policies: tuple[str, ...] = ()
    """Trivial policies (`envs.web.solvers.TRIVIAL_POLICIES`: click-last-button, submit-with-nothing-filled,
    first-candidate, uniform-random) taking turns with the skills: episode i plays (skills + policies)[i % len].
    Their real transitions show a world model what the exploit probe's moves are paid; `--skills` with no value
    leaves only them. `fill-swapped` (`MISTAKE_POLICIES`) types the task's texts into each other's fields, then
    submits: login-user filled the wrong way round."""
    max_steps: int = 20
    """Steps per episode at most (truncated after)."""
    workers: int = 2
    """Browsers recording in parallel processes (~170 MB each); each restarts its browser when it fails."""
    overwrite: bool = False
    """Replace a dataset already in `out`."""


def collect_web(config: WebCollectConfig, env: WebTaskEnv | None = None) -> Path:
    """Record the transitions and write them with the manifest; returns the output directory.

    Pass `env` to record in a browser you already have (workers must be 1; it is left open and used with the
    config's max_steps).
    """
    out = Path(config.out)
    if env is not None and config.workers != 1:
        raise ValueError("a browser passed in records alone: set workers to 1")
    mix = (*config.skills, *config.policies)
    check_collection(config.tasks, config.episodes, config.seed, mix, config.max_steps, config.workers)
    if (out / MANIFEST).exists():
        if not config.overwrite:
            raise FileExistsError(
                f"{out} already holds a web dataset ({MANIFEST}): pick another --out or pass --overwrite"
            )
        for entry in read_manifest(out)["tasks"].values():
            (out / entry["file"]).unlink(missing_ok=True)
        (out / MANIFEST).unlink()
    out.mkdir(parents=True, exist_ok=True)
    tasks = {task: {"file": f"{task}.jsonl.gz", "seeds": [], "failed_seeds": [], "transitions": 0, "successes": 0}
             for task in config.tasks}  # fmt: skip
    started = time.perf_counter()
    current, kept = None, []

    def flush() -> None:
        atomic_write_jsonl_gz(out / tasks[current]["file"], kept)
        kept.clear()

    results = episode_results(config.tasks, config.episodes, config.seed, mix, config.max_steps, config.workers, env)
    for (task, seed, _), records, error in results:
        if task != current:
            if current is not None:
                flush()
            current = task
        entry = tasks[task]
        if error is not None:
            entry["failed_seeds"].append(seed)
            continue
        entry["seeds"].append(seed)
        entry["transitions"] += len(records)
        entry["successes"] += int(bool(records) and task_done(records[-1]["reward"]))
        kept.extend(records)
    flush()
    seconds = time.perf_counter() - started
    total = sum(e["transitions"] for e in tasks.values())
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "tasks": tasks,
        "transitions": total,
        "episodes": sum(len(e["seeds"]) for e in tasks.values()),
        "seconds": round(seconds, 1),
        "transitions_per_s": round(total / seconds, 2),
        "config": dataclasses.asdict(config),
        "command": command_line(["rlvr-gym", "collect", "web"], config),
    }
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1))
    log.info("wrote %d web transitions of %d tasks to %s (%.1f transitions/s)", total, len(tasks), out, total / seconds)
    return out


def collect_records(
    tasks: Sequence[str],
    episodes: int,
    seed: int,
    skills: Sequence[float | str] = (1.0, 0.7, 0.4, 0.1),
    max_steps: int = 20,
    workers: int = 1,
) -> tuple[list[dict], dict[str, list[int]]]:
    """Record transitions in memory: (records, task -> seeds of the episodes recorded), as `collect_web` would;
    `skills` may name trivial policies too."""
    check_collection(tasks, episodes, seed, skills, max_steps, workers)
    records, seeds = [], {task: [] for task in tasks}
    for (task, env_seed, _), episode, error in episode_results(tasks, episodes, seed, skills, max_steps, workers):
        if error is None:
            records += episode
            seeds[task].append(env_seed)
    return records, seeds


def check_collection(tasks: Sequence[str], episodes: int, seed: int, skills: Sequence[float | str], max_steps: int,
                     workers: int) -> None:  # fmt: skip
    unknown = [t for t in tasks if t not in EXPERTS]
    if unknown or not tasks:
        raise ValueError(f"unknown or no tasks {unknown}: choose from {', '.join(TASKS)}")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks repeat: {list(tasks)}; name each task once")
    known = TRIVIAL_POLICIES + MISTAKE_POLICIES
    unknown_policies = [s for s in skills if isinstance(s, str) and s not in known]
    if unknown_policies:
        raise ValueError(f"unknown policies {unknown_policies}: choose from {', '.join(known)}")
    if not skills or not all(isinstance(s, str) or 0.0 <= s <= 1.0 for s in skills):
        raise ValueError(f"skills must be values in [0, 1] (1 = expert), got {list(skills)}; or give --policies")
    if not 1 <= episodes <= SEEDS_PER_RUN:
        raise ValueError(f"episodes must be in 1..{SEEDS_PER_RUN} (more would reach the next seed's pages)")
    if seed < 0 or max_steps < 1 or workers < 1:
        raise ValueError(f"seed must be >= 0, max_steps and workers >= 1; got {seed}, {max_steps}, {workers}")


def episode_results(
    tasks: Sequence[str],
    episodes: int,
    seed: int,
    skills: Sequence[float | str],
    max_steps: int,
    workers: int,
    env: WebTaskEnv | None = None,
) -> Iterator[tuple[Job, list[dict], str | None]]:
    """Play every (task, episode) and yield (job, transitions, error) in task-major order, whatever the workers."""
    jobs = [(task, seed * SEEDS_PER_RUN + i, skills[i % len(skills)]) for task in tasks for i in range(episodes)]
    if workers == 1:
        recorder = _Recorder(max_steps, env)
        results = map(recorder, jobs)

        def stop() -> None:
            if recorder.env is not env:
                recorder.close()
    else:
        # fork, not spawn: a spawned worker would import torch and transformers again (seconds each) to unpickle
        # its job function; the parent holds no browser and has not used torch's or tokenizers' threads yet.
        pool = ProcessPoolExecutor(workers, multiprocessing.get_context("fork"), _init_worker, (max_steps,))
        results = pool.map(_run_in_worker, jobs)

        def stop() -> None:
            pool.shutdown(cancel_futures=True)

    bar = tqdm(total=len(jobs), desc="collect web", unit="ep", dynamic_ncols=True)
    count = 0
    try:
        for job, (records, error) in zip(jobs, results):
            count += len(records)
            bar.update()
            bar.set_postfix(transitions=count)
            yield job, records, error
    except BrokenProcessPool:
        raise RuntimeError("a collection worker died; rerun with --workers 1 to see why") from None
    finally:
        stop()
        bar.close()


class _Recorder:
    """Plays one episode per call in its browser; a browser that fails is replaced and the episode replayed once."""

    def __init__(self, max_steps: int, env: WebTaskEnv | None = None):
        self.max_steps = max_steps
        self.env = env
        if env is not None:
            env.max_steps = max_steps

    def __call__(self, job: Job) -> tuple[list[dict], str | None]:
        task, seed, skill = job
        error = None
        for _ in range(2):
            try:
                if self.env is None:
                    self.env = WebTaskEnv(task, max_steps=self.max_steps)
                return list(record_transitions([task], 1, seed, (skill,), env=self.env)), None
            except (*BROWSER_ERRORS, RuntimeError) as e:
                error = f"{type(e).__name__}: {e}"
                log.warning("browser failed on %s seed %d (%s); starting a fresh one", task, seed, error)
                self.close()
        log.warning("giving up on %s seed %d after two browsers failed", task, seed)
        return [], error

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


_worker_recorder: _Recorder | None = None


def _init_worker(max_steps: int) -> None:
    global _worker_recorder
    configure_logging(logging.WARNING)
    _worker_recorder = _Recorder(max_steps)
    # Quit the worker's browser when the pool shuts the worker down (multiprocessing runs these finalizers on exit).
    Finalize(_worker_recorder, _worker_recorder.close, exitpriority=10)


def _run_in_worker(job: Job) -> tuple[list[dict], str | None]:
    return _worker_recorder(job)


def command_line(words: Sequence[str], config) -> str:
    """The command line that reproduces a flat config dataclass."""
    out = list(words)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, (tuple, list)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return " ".join(out)

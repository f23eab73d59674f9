"""Robot episodes: the in-memory `Episode`, compressed NumPy shards with a manifest, and collection from the real env.

A dataset is one directory holding one split:
```
manifest.json          format, version, split, shard files, per-episode task/seed/policy/length/success, config
train-00000.npz        several episodes concatenated along time (np.savez_compressed, read with allow_pickle=False)
train-00001.npz
```
In a shard, step arrays (`actions`, `rewards`, `success`) hold sum(T_i) rows and frame arrays (`frames`,
`states`) sum(T_i + 1) rows; `episode_starts[i]` is episode i's first step row, so its first frame row is
`episode_starts[i] + i`. Strings are fixed-width unicode arrays, so no pickle is ever needed.

Collection seeds: episode i of a run with `--seed s` resets the env with seed `s * 1_000_000 + i`. A held-out
split is a run with another `--seed` (and fewer than a million episodes per run), so no initial state is shared;
`check_disjoint` verifies it from the manifests.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from tqdm import tqdm

if TYPE_CHECKING:
    from envs.robot import RealRT1Env

FORMAT = "rlvr-gym-episodes"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
IMAGE_SHAPE = (64, 64, 3)
ACTION_DIM = 7
SEEDS_PER_RUN = 1_000_000
"""Episode i of a collection run with seed s uses env seed s * SEEDS_PER_RUN + i."""
STATE_NAMES = (
    "gripper_x", "gripper_y", "gripper_z", "gripper_closedness",
    *(f"object{i}_{axis}" for i in range(3) for axis in "xyz"),
    "drawer_qpos",
)  # fmt: skip
"""Columns of `Episode.states`: palm position (m), measured closedness (0 open .. 1 closed), the three objects'
centres (m) in `envs.robot.OBJECT_NAMES` order, the drawer joint (m, 0 closed)."""

_STEP_KEYS = ("actions", "rewards", "success")
_FRAME_KEYS = ("frames", "states")
_STRING_KEYS = ("task", "instruction", "policy")


@dataclass
class Episode:
    """One episode of T steps: T + 1 frames (the reset frame, then one per step) and T actions."""

    frames: np.ndarray
    """uint8 (T + 1, 64, 64, 3) RGB frames"""
    actions: np.ndarray
    """float32 (T, 7) RT-1 actions in [-1, 1]: world_vector 3, rotation_delta 3, gripper_closedness 1"""
    rewards: np.ndarray
    """float32 (T,) reward of each step"""
    success: np.ndarray
    """bool (T,) whether the task is solved in the state after each step"""
    states: np.ndarray
    """float32 (T + 1, len(STATE_NAMES)) true state at each frame (see STATE_NAMES); NaN where unknown"""
    task: str
    """task name, e.g. `open_drawer`, or `rt1` for imported RT-1 episodes"""
    instruction: str
    """the natural-language instruction"""
    seed: int
    """env reset seed; -1 when there is none (imported episodes)"""
    policy: str
    """what acted: `scripted:<skill>`, `random`, `trivial:<name>` (the probe's open-loop policies), `agent`, or `rt1`
    (teleoperation in RT-1's data)"""

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def succeeded(self) -> bool:
        """Whether the task was solved at any step."""
        return bool(self.success.any())

    def validate(self) -> None:
        """Raise ValueError naming the field when shapes or dtypes break the format."""
        t = len(self.actions)
        expected = {
            "frames": ((t + 1, *IMAGE_SHAPE), np.uint8),
            "actions": ((t, ACTION_DIM), np.float32),
            "rewards": ((t,), np.float32),
            "success": ((t,), np.bool_),
            "states": ((t + 1, len(STATE_NAMES)), np.float32),
        }
        if t < 1:
            raise ValueError("an episode needs at least one step (actions of shape (T >= 1, 7))")
        for name, (shape, dtype) in expected.items():
            array = getattr(self, name)
            if not isinstance(array, np.ndarray) or array.shape != shape or array.dtype != dtype:
                got = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
                raise ValueError(f"Episode.{name} must be {np.dtype(dtype)} {shape} for T = {t} steps, got {got}")
        if not np.all(np.abs(self.actions) <= 1.0):
            raise ValueError("Episode.actions must be finite and within [-1, 1]; clip them before storing")


def write_shards(
    episodes: Iterable[Episode],
    out_dir: str | os.PathLike,
    split: str,
    episodes_per_shard: int = 100,
    config: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write episodes (any iterable, consumed once, streamed shard by shard) and then the manifest; returns out_dir.

    `config` (e.g. the collection config and the command) is stored in the manifest as it is. A directory that
    already holds a dataset is refused unless `overwrite`; the manifest is written last, so an interrupted write
    leaves no readable dataset behind.
    """
    out_dir = Path(out_dir)
    if episodes_per_shard < 1:
        raise ValueError(f"episodes_per_shard must be >= 1, got {episodes_per_shard}")
    if not split or not split.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"split must be a non-empty name of letters, digits, '-' and '_', got {split!r}")
    manifest_path = out_dir / MANIFEST
    if manifest_path.exists():
        if not overwrite:
            raise FileExistsError(f"{out_dir} already holds a dataset ({MANIFEST}); pick another directory or pass overwrite")
        _remove_dataset(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    shards, entries, buffer = [], [], []

    def flush() -> None:
        name = f"{split}-{len(shards):05d}.npz"
        _write_shard(out_dir / name, buffer)
        shards.append({"file": name, "episodes": len(buffer), "steps": sum(map(len, buffer))})
        for episode in buffer:
            entries.append({
                "shard": len(shards) - 1, "task": episode.task, "seed": episode.seed, "policy": episode.policy,
                "length": len(episode), "success": episode.succeeded, "instruction": episode.instruction,
            })  # fmt: skip
        buffer.clear()

    for episode in episodes:
        episode.validate()
        buffer.append(episode)
        if len(buffer) == episodes_per_shard:
            flush()
    if buffer:
        flush()
    if not entries:
        raise ValueError("no episodes to write")
    manifest = {
        "format": FORMAT, "version": FORMAT_VERSION, "split": split,
        "state_names": list(STATE_NAMES), "shards": shards, "episodes": entries, "config": config or {},
    }  # fmt: skip
    tmp = manifest_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, manifest_path)
    return out_dir


def read_manifest(data_dir: str | os.PathLike, split: str | None = None) -> dict[str, Any]:
    """The dataset's manifest, checked for format, version and (when given) split."""
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{data_dir}: no {MANIFEST}, so not an episode dataset (or its writing was interrupted); "
            f"collect one with `rlvr-gym collect rt1 --out {data_dir}` or write_shards()"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); collect the dataset again") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}")
    if manifest.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: episode format version {manifest.get('version')}, this rlvr-gym reads version {FORMAT_VERSION}; "
            "collect the dataset again with this version"
        )
    if split is not None and manifest["split"] != split:
        raise ValueError(f"{data_dir} holds split {manifest['split']!r}, not {split!r}; each split has its own directory")
    return manifest


def read_episodes(data_dir: str | os.PathLike, split: str | None = None) -> Iterator[Episode]:
    """Yield the dataset's episodes in order, one shard in memory at a time; `split` guards against a wrong directory."""
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir, split)
    for shard in manifest["shards"]:
        yield from _read_shard(data_dir / shard["file"], shard["episodes"])


def load_episodes(data_dir: str | os.PathLike, split: str | None = None) -> list[Episode]:
    """All episodes of the dataset in a list (see read_episodes)."""
    return list(read_episodes(data_dir, split))


def check_disjoint(dir_a: str | os.PathLike, dir_b: str | os.PathLike) -> None:
    """Raise ValueError if two datasets share an env seed (the same initial state); seeds < 0 (imported) are ignored."""
    seeds_a = {e["seed"] for e in read_manifest(dir_a)["episodes"] if e["seed"] >= 0}
    shared = sorted(seed for seed in {e["seed"] for e in read_manifest(dir_b)["episodes"]} if seed in seeds_a)
    if shared:
        raise ValueError(
            f"{dir_a} and {dir_b} share {len(shared)} env seeds (e.g. {shared[:5]}); "
            "collect the held-out split with another --seed"
        )


def _write_shard(path: Path, episodes: list[Episode]) -> None:
    lengths = np.array([len(e) for e in episodes], dtype=np.int64)
    arrays = {key: np.concatenate([getattr(e, key) for e in episodes]) for key in _STEP_KEYS + _FRAME_KEYS}
    arrays["episode_starts"] = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    arrays["seed"] = np.array([e.seed for e in episodes], dtype=np.int64)
    for key in _STRING_KEYS:
        arrays[key] = np.array([getattr(e, key) for e in episodes], dtype=str)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def _read_shard(path: Path, expected_episodes: int) -> Iterator[Episode]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: shard listed in {MANIFEST} is missing; copy the whole dataset directory")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in (*_STEP_KEYS, *_FRAME_KEYS, *_STRING_KEYS, "episode_starts", "seed")}
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, KeyError, EOFError, NotImplementedError) as e:
        raise ValueError(f"{path}: corrupt episode shard ({type(e).__name__}: {e}); collect the dataset again") from None
    starts = arrays["episode_starts"]
    n = len(starts)
    if n != expected_episodes:
        raise ValueError(f"{path}: holds {n} episodes, {MANIFEST} says {expected_episodes}; collect the dataset again")
    ends = np.append(starts[1:], len(arrays["actions"]))
    for i, (start, end) in enumerate(zip(starts, ends)):
        steps, frames = slice(start, end), slice(start + i, end + i + 1)
        episode = Episode(
            **{key: arrays[key][steps] for key in _STEP_KEYS},
            **{key: arrays[key][frames] for key in _FRAME_KEYS},
            **{key: str(arrays[key][i]) for key in _STRING_KEYS},
            seed=int(arrays["seed"][i]),
        )
        try:
            episode.validate()
        except ValueError as e:
            raise ValueError(f"{path}: episode {i} is malformed ({e}); collect the dataset again") from None
        yield episode


def _remove_dataset(out_dir: Path) -> None:
    old = read_manifest(out_dir)
    for shard in old["shards"]:
        (out_dir / shard["file"]).unlink(missing_ok=True)
    (out_dir / MANIFEST).unlink()


# Collection from the real env.

DEFAULT_TASKS = ("open_drawer", "close_drawer", "move_near", "push_to_target")


@dataclass
class CollectConfig:
    """Collect episodes from the real MuJoCo tabletop (`RealRT1-v0`) with a mix of scripted and random policies."""

    out: str
    """output directory for the shards and manifest.json (one split per directory)"""
    episodes: int = 1000
    """number of episodes to collect"""
    seed: int = 0
    """run seed: episode i resets the env with seed * 1_000_000 + i; collect held-out data with another seed"""
    split: str = "train"
    """split name recorded in the manifest"""
    tasks: tuple[str, ...] = DEFAULT_TASKS
    """tasks to collect, taken in turn (episode i gets tasks[i % len(tasks)])"""
    skills: tuple[float, ...] = (1.0, 0.7, 0.4, 0.1)
    """skill levels of the scripted policies (1 = expert); each scripted episode draws one uniformly"""
    random_fraction: float = 0.1
    """fraction of episodes driven by uniformly random actions instead of a scripted policy"""
    trivial_fraction: float = 0.0
    """fraction of episodes driven by one of the probe's open-loop policies, drawn uniformly: no action, or full scale
    on one axis alone (`envs.robot.policies.TRIVIAL_POLICIES`); their real failures teach a simulator not to pay them"""
    horizon: int = 50
    """steps before an episode is truncated (it ends earlier on success)"""
    workers: int = 1
    """processes collecting in parallel, each with its own env"""
    episodes_per_shard: int = 100
    """episodes per .npz shard"""
    overwrite: bool = False
    """replace a dataset already in `out`"""


def collect(config: CollectConfig) -> Path:
    """Collect `config.episodes` episodes with a progress bar and write them as shards; returns the directory."""
    _check_config(config)
    jobs = [(config.seed * SEEDS_PER_RUN + i, *_episode_plan(config, i)) for i in range(config.episodes)]
    record = {"command": _command(config), **asdict(config)}
    write_args = (config.out, config.split, config.episodes_per_shard, record, config.overwrite)
    bar = tqdm(total=config.episodes, desc=f"collect {config.split}", unit="ep")
    successes = 0

    def tracked(episodes: Iterable[Episode]) -> Iterator[Episode]:
        nonlocal successes
        for episode in episodes:
            successes += episode.succeeded
            bar.update()
            bar.set_postfix(success=f"{successes / bar.n:.2f}")
            yield episode

    try:
        if config.workers == 1:
            runner = _Runner(config.horizon)
            try:
                return write_shards(tracked(map(runner, jobs)), *write_args)
            finally:
                runner.close()
        # spawn, not fork: each worker opens its own OpenGL context, which must not be inherited.
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(config.workers, context, _init_worker, (config.horizon,))
        try:
            return write_shards(tracked(pool.map(_run_in_worker, jobs)), *write_args)
        finally:
            pool.shutdown(cancel_futures=True)
    except BrokenProcessPool:
        raise RuntimeError(
            "a collection worker died; rerun with --workers 1 to see why. A script that calls collect() with "
            "workers > 1 must do so under `if __name__ == '__main__':` (workers are spawned and import it)"
        ) from None
    finally:
        bar.close()


def named_policy(task: str, policy: str, seed: int) -> Callable[[np.ndarray, dict], np.ndarray]:
    """The collection policy `policy` names: 'random', 'scripted:<skill in [0, 1]>' or 'trivial:<name>', seeded."""
    from envs.robot import make_scripted_policy
    from envs.robot.policies import trivial_action

    if policy == "random":
        rng = np.random.default_rng(seed)
        return lambda obs, info: rng.uniform(-1.0, 1.0, ACTION_DIM)
    if policy.startswith("scripted:"):
        return make_scripted_policy(task, float(policy.split(":", 1)[1]), seed)
    if policy.startswith("trivial:"):
        action = trivial_action(policy.split(":", 1)[1])
        return lambda obs, info: action
    raise ValueError(f"unknown policy {policy!r}: use 'random', 'scripted:<skill in [0, 1]>' or 'trivial:<name>'")


def collect_episode(env: RealRT1Env, task: str, policy: str, seed: int,
                    act: Callable[[np.ndarray, dict], np.ndarray] | None = None) -> Episode:
    """Run one episode in a RealRT1Env made for `task`: reset with `seed`, act until it ends. `act` (frame, info) ->
    action acts when given, and `policy` only names it in the data; else `policy` names the policy that acts."""
    act = act or named_policy(task, policy, seed)
    recorder = EpisodeRecorder(env, policy, lambda: seed)
    obs, info = recorder.reset()
    while True:
        obs, _, terminated, truncated, info = recorder.step(act(obs, info))
        if terminated or truncated:
            return recorder.finish()[0]


class EpisodeRecorder(gym.Wrapper):
    """Records every episode played through a RealRT1Env, whoever steps it (a scripted policy, or an SB3 agent
    learning in the real env inside a VecEnv): each reset takes its seed from `next_seed`, so the episodes come from
    a known collection run. `finish()` returns them, the one in progress up to its last step."""

    def __init__(self, env: RealRT1Env, policy: str, next_seed: Callable[[], int]):
        super().__init__(env)
        self.policy, self.next_seed, self.episodes = policy, next_seed, []
        self._current: dict[str, Any] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Ends the episode in progress; the new one starts from `next_seed()`, whatever `seed` a VecEnv passes."""
        self._close_episode()
        seed = self.next_seed()
        obs, info = self.env.reset(seed=seed, options=options)
        self._current = {"seed": seed, "frames": [obs], "states": [info_state(info)], "actions": [], "rewards": [],
                         "success": [], "task": info["task"], "instruction": info["instruction"]}
        return obs, info

    def step(self, action):
        if self._current is None:
            raise RuntimeError("call reset() before step()")
        action = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        obs, reward, terminated, truncated, info = self.env.step(action)
        for key, value in (("frames", obs), ("states", info_state(info)), ("actions", action), ("rewards", reward),
                           ("success", info["success"])):
            self._current[key].append(value)
        return obs, reward, terminated, truncated, info

    def finish(self) -> list[Episode]:
        self._close_episode()
        return self.episodes

    def _close_episode(self) -> None:
        current, self._current = self._current, None
        if current and current["actions"]:
            self.episodes.append(Episode(
                frames=np.stack(current["frames"]), actions=np.stack(current["actions"]),
                rewards=np.array(current["rewards"], np.float32), success=np.array(current["success"], bool),
                states=np.stack(current["states"]), task=current["task"], instruction=current["instruction"],
                seed=current["seed"], policy=self.policy))


def info_state(info: dict[str, Any]) -> np.ndarray:
    """The true state (STATE_NAMES) in a tabletop env's info."""
    return np.concatenate([
        info["gripper_pos"], [info["gripper_closedness"]], np.ravel(info["object_pos"]), [info["drawer_qpos"]],
    ]).astype(np.float32)  # fmt: skip


def _episode_plan(config: CollectConfig, i: int) -> tuple[str, str]:
    """Task and policy of episode i, fixed by (seed, i) alone so that any number of workers gives the same data."""
    from envs.robot.policies import TRIVIAL_POLICIES

    rng = np.random.default_rng([config.seed, i])
    draw = rng.random()
    if draw < config.random_fraction:
        policy = "random"
    elif draw < config.random_fraction + config.trivial_fraction:
        policy = f"trivial:{TRIVIAL_POLICIES[rng.integers(len(TRIVIAL_POLICIES))]}"
    else:
        policy = f"scripted:{config.skills[rng.integers(len(config.skills))]:g}"
    return config.tasks[i % len(config.tasks)], policy


def _check_config(config: CollectConfig) -> None:
    from envs.robot import TASKS

    unknown = [t for t in config.tasks if t not in TASKS]
    if unknown or not config.tasks:
        raise ValueError(f"unknown or no tasks {unknown}: choose from {TASKS}")
    if not config.skills or not all(0.0 <= s <= 1.0 for s in config.skills):
        raise ValueError(f"skills must be values in [0, 1] (1 = expert), got {config.skills}")
    if not (0.0 <= config.random_fraction and 0.0 <= config.trivial_fraction
            and config.random_fraction + config.trivial_fraction <= 1.0):
        raise ValueError("random_fraction and trivial_fraction must be >= 0 and sum to at most 1, got "
                         f"{config.random_fraction} and {config.trivial_fraction}")
    if not 1 <= config.episodes <= SEEDS_PER_RUN:
        raise ValueError(f"episodes must be in 1..{SEEDS_PER_RUN} (more would reach the next seed's env seeds)")
    if config.seed < 0 or config.horizon < 1 or config.workers < 1:
        raise ValueError(f"seed must be >= 0, horizon and workers >= 1; got {config.seed}, {config.horizon}, {config.workers}")


def _command(config: CollectConfig) -> str:
    """The `rlvr-gym collect rt1` command line that reproduces this config."""
    words = ["rlvr-gym", "collect", "rt1"]
    for field in fields(config):
        value = getattr(config, field.name)
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, tuple):
            words += [flag, *map(str, value)]
        else:
            words += [flag, str(value)]
    return shlex.join(words)


class _Runner:
    """The envs of one process, one per task: a RealRT1Env's task is fixed when it is made."""

    def __init__(self, horizon: int):
        self.horizon = horizon
        self.envs: dict[str, Any] = {}

    def __call__(self, job: tuple[int, str, str]) -> Episode:
        from envs.robot import RealRT1Env

        seed, task, policy = job
        if task not in self.envs:
            self.envs[task] = RealRT1Env(task=task, horizon=self.horizon)
        return collect_episode(self.envs[task], task, policy, seed)

    def close(self) -> None:
        for env in self.envs.values():
            env.close()


_worker_runner: _Runner | None = None


def _init_worker(horizon: int) -> None:
    global _worker_runner
    _worker_runner = _Runner(horizon)


def _run_in_worker(job: tuple[int, str, str]) -> Episode:
    return _worker_runner(job)

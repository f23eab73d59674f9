"""The learned robot simulator: the RT-1-style video world model as a Gymnasium env and a batched VectorEnv.

A world-model checkpoint directory (see `rlvr_gym.models.robot_world_model`) also holds the initial states the
simulator starts from, real first frames of collected episodes, as DIAMOND and RLVR-World do:
    initial_states.npz   frames uint8 (N, 64, 64, 3), tasks (N,) str, instructions (N,) str, seeds (N,) int
"""

from __future__ import annotations

import os
import zipfile
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from rlvr_gym.data.episodes import Episode
from rlvr_gym.domains import robot as R
from rlvr_gym.models.lm import CheckpointError
from rlvr_gym.models.robot_world_model import RobotWorldModel
from rlvr_gym.models.sampler import SamplingConfig

INITIAL_STATES = "initial_states.npz"
IMAGE_SHAPE = (64, 64, 3)
DEFAULT_CHECKPOINT = "rt1-rlvr"
DEFAULT_HORIZON = 50
SUCCESS_THRESHOLD = 0.5


# ---------------------------------------------------------------------------------------------------- initial states


@dataclass
class InitialStates:
    """Real first frames the simulator resets to, with the task each episode was collected for."""

    frames: np.ndarray
    """uint8 (N, 64, 64, 3)"""
    tasks: np.ndarray
    """(N,) unicode task names"""
    instructions: np.ndarray
    """(N,) unicode instructions"""
    seeds: np.ndarray
    """(N,) int64 real-env reset seeds (-1 for imported episodes)"""

    def __len__(self) -> int:
        return len(self.frames)

    def select(self, rows: np.ndarray) -> InitialStates:
        return InitialStates(self.frames[rows], self.tasks[rows], self.instructions[rows], self.seeds[rows])


def save_initial_states(world_dir: str | os.PathLike, episodes: Sequence[Episode], n: int = 64) -> Path:
    """Store the first frames of up to n episodes, taken in turn from each task, as WORLD_DIR/initial_states.npz."""
    if n < 1:
        raise ValueError(f"n must be a positive number of initial states, got {n}")
    if not episodes:
        raise ValueError("no episodes to take initial states from; pass the world model's training episodes")
    by_task: dict[str, deque[Episode]] = {}
    for episode in episodes:
        by_task.setdefault(episode.task, deque()).append(episode)
    chosen: list[Episode] = []
    while len(chosen) < n and any(by_task.values()):
        for queue in by_task.values():
            if queue and len(chosen) < n:
                chosen.append(queue.popleft())
    path = Path(world_dir) / INITIAL_STATES
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(
        tmp,
        frames=np.stack([e.frames[0] for e in chosen]).astype(np.uint8),
        tasks=np.array([e.task for e in chosen], dtype=str),
        instructions=np.array([e.instruction for e in chosen], dtype=str),
        seeds=np.array([e.seed for e in chosen], dtype=np.int64),
    )
    os.replace(tmp, path)
    return path


def load_initial_states(world_dir: str | os.PathLike) -> InitialStates:
    """Read WORLD_DIR/initial_states.npz (no pickles), checked for shapes and types."""
    path = Path(world_dir) / INITIAL_STATES
    if not path.is_file():
        raise CheckpointError(
            f"{world_dir} has no {INITIAL_STATES}, so the simulator has no real frames to start from; "
            "write them with rlvr_gym.sim.robot.save_initial_states(world_dir, episodes)"
        )
    try:
        with np.load(path, allow_pickle=False) as npz:
            states = InitialStates(npz["frames"], npz["tasks"], npz["instructions"], npz["seeds"])
    except (zipfile.BadZipFile, ValueError, OSError, KeyError, EOFError) as error:
        raise CheckpointError(f"{path} is corrupt ({type(error).__name__}: {error}); write it again with save_initial_states") from None
    n = len(states.frames)
    if states.frames.dtype != np.uint8 or states.frames.shape[1:] != IMAGE_SHAPE or n == 0:
        raise CheckpointError(f"{path}: frames must be uint8 (N >= 1, 64, 64, 3), got {states.frames.dtype} {states.frames.shape}")
    for name in ("tasks", "instructions", "seeds"):
        array = getattr(states, name)
        kind = "i" if name == "seeds" else "U"
        if array.shape != (n,) or array.dtype.kind != kind:
            raise CheckpointError(f"{path}: {name} must be a ({n},) {'int' if kind == 'i' else 'unicode'} array, got {array.dtype} {array.shape}")
    return states


# ---------------------------------------------------------------------------------------------------- simulator core


@dataclass
class _Rollout:
    """One episode in the learned sim: the sliding window of (codes, flag, action) the next prompt is built from."""

    index: int
    """Row of the initial state (in the simulator's task-filtered initial states)."""
    sample_seed: int
    """Seed of the single env's sampler, drawn at reset."""
    codes: deque
    flags: deque
    actions: deque
    frame: np.ndarray
    steps: int = 0
    success_prob: float = 0.0
    error: str | None = None


@dataclass
class _Simulator:
    """The world model and initial states behind both envs; `advance` steps any number of rollouts in one batch."""

    world: RobotWorldModel
    states: InitialStates
    first_codes: np.ndarray
    sampling: SamplingConfig

    @classmethod
    def load(cls, checkpoint: str | os.PathLike, task: str | None, temperature: float) -> _Simulator:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        world = RobotWorldModel.load(checkpoint)
        states = load_initial_states(RobotWorldModel.resolve(checkpoint))
        if task is not None:
            rows = np.flatnonzero(states.tasks == task)
            if len(rows) == 0:
                raise ValueError(f"the checkpoint has no initial states for task {task!r}; it has {sorted(set(states.tasks.tolist()))}")
            states = states.select(rows)
        first_codes = np.concatenate([world.encode(f, f) for f in np.array_split(states.frames, -(-len(states) // 256))])
        return cls(world, states, first_codes, SamplingConfig(temperature=temperature))

    @property
    def device(self) -> torch.device:
        return next(self.world.lm.parameters()).device

    def start(self, rng: np.random.Generator, index: int | None = None) -> _Rollout:
        """A new rollout from initial state `index`, or one drawn with `rng`."""
        if index is None:
            index = int(rng.integers(len(self.states)))
        elif not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.states):
            raise ValueError(f"options['index'] must be an int in [0, {len(self.states)}), got {index!r}")
        n = self.world.settings.context_steps
        # Drawn even when greedy, so that the sequence of initial states a seed gives never depends on the temperature.
        sample_seed = int(rng.integers(2**63 - 1))
        # After each step `codes` holds one more frame than the prompt uses and `actions` one fewer; appending
        # the next action (which drops the oldest) makes them line up again.
        codes = deque([self.first_codes[index]], maxlen=n)
        return _Rollout(int(index), sample_seed, codes, deque([False], maxlen=n), deque(maxlen=n), self.states.frames[index].copy())

    def advance(self, rollouts: list[_Rollout], actions: np.ndarray, generator: torch.Generator | None) -> None:
        """Predict the next frame of every rollout under its action with one batched `predict` call."""
        for rollout, action in zip(rollouts, actions):
            rollout.actions.append(action)
        prompts = [self.world.prompt(list(r.codes), list(r.flags), list(r.actions)) for r in rollouts]
        codes, success, errors = self.world.predict(prompts, k=1, sampling=self.sampling, generator=generator)
        codes, success = codes[:, 0], success[:, 0]
        for i, (rollout, error) in enumerate(zip(rollouts, errors)):
            if error is not None:  # the layout mask makes this unreachable for a sane model; repeat the last frame
                codes[i] = rollout.codes[-1]
        contexts = self.states.frames[[r.index for r in rollouts]]
        frames = self.world.decode(codes, contexts)
        for rollout, code, prob, frame, error in zip(rollouts, codes, success, frames, errors):
            rollout.codes.append(code)
            rollout.flags.append(bool(prob > SUCCESS_THRESHOLD))
            rollout.frame, rollout.success_prob, rollout.error = frame, float(prob), error
            rollout.steps += 1

    def info(self, rollout: _Rollout) -> dict[str, Any]:
        info = {
            "success_prob": rollout.success_prob,
            "is_success": rollout.success_prob > SUCCESS_THRESHOLD,
            "task": str(self.states.tasks[rollout.index]),
            "instruction": str(self.states.instructions[rollout.index]),
            "step": rollout.steps,
            "initial_state": rollout.index,
        }
        if rollout.error is not None:
            info["error"] = rollout.error
        return info


def _check_actions(actions: Any, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(actions)
    if array.dtype.kind not in "fiu":
        raise ValueError(f"actions must be real numbers (float32 like the action space), got dtype {array.dtype}")
    if array.shape != shape:
        raise ValueError(
            f"action must have shape {shape}: world_vector (3), rotation_delta (3), gripper_closedness (1) per env; "
            f"got shape {array.shape}"
        )
    if not np.isfinite(array).all():
        raise ValueError(f"actions must be finite, got NaN or inf in {array.tolist()}")
    return np.clip(array.astype(np.float32), -1.0, 1.0)


def _check_args(horizon: int, render_mode: str | None, render_modes: list[str]) -> None:
    if horizon < 1:
        raise ValueError(f"horizon must be a positive number of steps, got {horizon}")
    if render_mode is not None and render_mode not in render_modes:
        raise ValueError(f"render_mode must be None or one of {render_modes}, got {render_mode!r}")


def _spaces() -> tuple[gym.spaces.Box, gym.spaces.Box]:
    return gym.spaces.Box(0, 255, IMAGE_SHAPE, np.uint8), gym.spaces.Box(-1.0, 1.0, (R.ACTION_DIM,), np.float32)


# ---------------------------------------------------------------------------------------------------- single env


class RT1WorldEnv(gym.Env):
    """The MuJoCo tabletop (`envs.robot.RealRT1Env`) as its learned video world model predicts it.

    ## Description
    Each step appends the action to the episode's sliding window of past (frame codes, success flag, action),
    asks the world model for the next frame's 64 codes and success flag (one frame, k = 1), and decodes the
    codes into a 64x64 frame with the episode's first real frame as the tokenizer's context. Nothing of the
    real env runs: frames, reward and termination all come from the model.

    ## Action Space
    `Box(-1, 1, (7,), float32)`, RT-1's end-effector action as in the real env: `[0:3]` world_vector,
    `[3:6]` rotation_delta, `[6]` gripper_closedness. Values outside [-1, 1] are clipped; the model sees each
    dimension in one of 256 bins. An action of the wrong shape, a non-numeric dtype, or NaN / inf raises ValueError.

    ## Observation Space
    `Box(0, 255, (64, 64, 3), uint8)`: the real first frame after reset, then the decoded predicted frames.

    ## Rewards
    1.0 when the model's success probability for the predicted frame exceeds 0.5, else 0.0 (the real env's
    reward is 1.0 on the step that reaches success, which also ends its episode).

    ## Starting State
    A real first frame from the checkpoint's `initial_states.npz`, drawn uniformly with the env's `np_random`
    (restricted to `task` when given); `reset(options={"index": i})` picks row i instead.

    ## Episode End
    Terminated when the predicted success probability exceeds 0.5; truncated after `horizon` steps.
    `info`: `success_prob`, `is_success`, `task`, `instruction`, `step`, `initial_state` (the row), and
    `error` when the model's output could not be parsed (the last frame is repeated then).

    ## Arguments
    - `checkpoint`: a world-model directory or shipped name (default "rt1-rlvr").
    - `horizon`: steps before truncation (default 50, as the real env).
    - `task`: start only from initial states of this task (default: all).
    - `temperature`: 0 for greedy frames; > 0 samples them, seeded from `np_random` at reset, so the same
      reset seed gives the same rollout.
    - `render_mode`: None or "rgb_array"; `render()` returns the last frame.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
        horizon: int = DEFAULT_HORIZON,
        task: str | None = None,
        temperature: float = 0.0,
        render_mode: str | None = None,
    ):
        _check_args(horizon, render_mode, self.metadata["render_modes"])
        self.sim = _Simulator.load(checkpoint, task, temperature)
        self.horizon = horizon
        self.task = task
        self.temperature = temperature
        self.render_mode = render_mode
        self.observation_space, self.action_space = _spaces()
        self._rollout: _Rollout | None = None
        self._generator = torch.Generator(device=self.sim.device)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._rollout = self.sim.start(self.np_random, (options or {}).get("index"))
        self._generator.manual_seed(self._rollout.sample_seed)
        return self._rollout.frame.copy(), self.sim.info(self._rollout)

    def step(self, action):
        if self._rollout is None:
            raise RuntimeError("call reset() before step()")
        action = _check_actions(action, (R.ACTION_DIM,))
        self.sim.advance([self._rollout], action[None], self._generator)
        info = self.sim.info(self._rollout)
        terminated = info["is_success"]
        truncated = self._rollout.steps >= self.horizon and not terminated
        return self._rollout.frame.copy(), float(terminated), terminated, truncated, info

    def render(self):
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode: make the env with render_mode='rgb_array'")
            return None
        if self._rollout is None:
            return np.zeros(IMAGE_SHAPE, np.uint8)
        return self._rollout.frame.copy()


# ---------------------------------------------------------------------------------------------------- vector env


class RT1WorldVectorEnv(VectorEnv):
    """`num_envs` copies of RT1WorldEnv sharing one world model, stepped with one batched `predict` per step.

    Spaces, rewards, termination and truncation are RT1WorldEnv's (see its docstring), batched along axis 0.

    ## Seeding
    `reset(seed=s)` seeds sub-env i with s + i (a list gives one seed per sub-env), the same way SyncVectorEnv
    does, and each sub-env draws its initial states exactly as an RT1WorldEnv reset with that seed: greedy
    rollouts equal those of single envs with the same seeds. With temperature > 0 the batch shares one sampler
    seeded from the reset seed: rollouts are reproducible but not those of the single envs.
    `options`: `{"index": i}` (one row for all sub-envs, or a list of num_envs rows) and gymnasium's
    `{"reset_mask": bool array}` to reset only some sub-envs.

    ## Autoreset
    `autoreset_mode` is recorded in `metadata["autoreset_mode"]`:
    - NEXT_STEP (default, gymnasium's): the step after a sub-env ends ignores its action and resets it,
      returning its first frame with reward 0, terminated and truncated False; it takes no model step.
    - SAME_STEP: an ending sub-env is reset within the same step; the returned observation is its new first
      frame, `info["final_obs"]` / `info["final_info"]` hold the last frame and info of the ended episode.
    - DISABLED: the caller resets ended sub-envs with `reset(options={"reset_mask": ...})`.

    `info` is gymnasium's dict of arrays (each key with a `_key` mask); `render()` returns a tuple of frames.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10, "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int = 1,
        checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
        horizon: int = DEFAULT_HORIZON,
        task: str | None = None,
        temperature: float = 0.0,
        render_mode: str | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        _check_args(horizon, render_mode, self.metadata["render_modes"])
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": self.autoreset_mode}
        self.sim = _Simulator.load(checkpoint, task, temperature)
        self.num_envs = num_envs
        self.horizon = horizon
        self.task = task
        self.temperature = temperature
        self.render_mode = render_mode
        self.single_observation_space, self.single_action_space = _spaces()
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._rngs = [seeding.np_random()[0] for _ in range(num_envs)]
        self._rollouts: list[_Rollout | None] = [None] * num_envs
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._generator = torch.Generator(device=self.sim.device)

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is None:
            mask = np.ones(self.num_envs, dtype=bool)
        elif not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (self.num_envs,):
            raise ValueError(f"options['reset_mask'] must be a bool numpy array of shape ({self.num_envs},), got {mask!r}")
        seeds = [seed + i for i in range(self.num_envs)] if isinstance(seed, (int, np.integer)) else seed
        if seeds is None:
            seeds = [None] * self.num_envs
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset needs one seed per sub-env ({self.num_envs}), got {len(seeds)}")
        if any(s is not None for s in seeds):
            self._np_random = np.random.default_rng([int(s) for s in seeds if s is not None])
            self._np_random_seed = int(seed) if isinstance(seed, (int, np.integer)) else -1
        if mask.all():
            self._generator.manual_seed(int(self.np_random.integers(2**63 - 1)))
        indices = options.pop("index", None)
        if indices is None or isinstance(indices, (int, np.integer)):
            indices = [indices] * self.num_envs
        if len(indices) != self.num_envs:
            raise ValueError(f"options['index'] must be one int or a list of {self.num_envs}, got {len(indices)}")
        for i in np.flatnonzero(mask):
            if seeds[i] is not None:
                self._rngs[i] = seeding.np_random(int(seeds[i]))[0]
            self._rollouts[i] = self.sim.start(self._rngs[i], indices[i])
        self._needs_reset[mask] = False
        return self._observations(), self._infos(np.flatnonzero(mask))

    def step(self, actions):
        if any(r is None for r in self._rollouts):
            raise RuntimeError("call reset() before step()")
        actions = _check_actions(actions, (self.num_envs, R.ACTION_DIM))
        if self.autoreset_mode == AutoresetMode.DISABLED and self._needs_reset.any():
            raise RuntimeError(
                f"sub-envs {np.flatnonzero(self._needs_reset).tolist()} have ended; with autoreset DISABLED reset them "
                "with reset(options={'reset_mask': mask})"
            )
        resetting = self._needs_reset.copy() if self.autoreset_mode == AutoresetMode.NEXT_STEP else np.zeros(self.num_envs, bool)
        for i in np.flatnonzero(resetting):
            self._rollouts[i] = self.sim.start(self._rngs[i])
        stepping = np.flatnonzero(~resetting)
        rewards = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        if len(stepping):
            rollouts = [self._rollouts[i] for i in stepping]
            self.sim.advance(rollouts, actions[stepping], self._generator)
            success = np.array([r.success_prob > SUCCESS_THRESHOLD for r in rollouts])
            terminated[stepping] = success
            truncated[stepping] = np.array([r.steps >= self.horizon for r in rollouts]) & ~success
            rewards[stepping] = success
        ended = terminated | truncated
        self._needs_reset = ended & (self.autoreset_mode != AutoresetMode.SAME_STEP)
        final: dict[str, Any] = {}
        if self.autoreset_mode == AutoresetMode.SAME_STEP and ended.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            final_infos = [None] * self.num_envs
            for i in np.flatnonzero(ended):
                final_obs[i], final_infos[i] = self._rollouts[i].frame.copy(), self.sim.info(self._rollouts[i])
                self._rollouts[i] = self.sim.start(self._rngs[i])
            final = {"final_obs": final_obs, "_final_obs": ended.copy(), "final_info": self._batch_infos(final_infos),
                     "_final_info": ended.copy()}  # fmt: skip
        return self._observations(), rewards, terminated, truncated, {**self._infos(np.arange(self.num_envs)), **final}

    def render(self) -> tuple[np.ndarray, ...] | None:
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode: make the env with render_mode='rgb_array'")
            return None
        return tuple(r.frame.copy() if r is not None else np.zeros(IMAGE_SHAPE, np.uint8) for r in self._rollouts)

    def _observations(self) -> np.ndarray:
        return np.stack([r.frame if r is not None else np.zeros(IMAGE_SHAPE, np.uint8) for r in self._rollouts])

    def _infos(self, rows: np.ndarray) -> dict[str, Any]:
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[rows] = True
        return self._batch_infos([self.sim.info(r) if m else None for r, m in zip(self._rollouts, mask)])

    def _batch_infos(self, infos: list[dict | None]) -> dict[str, Any]:
        """Gymnasium's vector info layout: each key's values in an array, with a `_key` mask of the envs that have it."""
        out: dict[str, Any] = {}
        for i, info in enumerate(infos):
            if info is not None:
                out = self._add_info(out, info, i)
        return out

"""The learned robot simulator: the RT-1-style video world model as a Gymnasium env and a batched VectorEnv,
starting from the real first frames its checkpoint holds (`rlvr_gym.data.robot.load_initial_states`).
(Longer than 500 lines: the simulator core, the env, the vector env and the success calibration share one state.)
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from tqdm import tqdm

from envs.robot.tasks import Task, task_from_instruction
from rlvr_gym.data import video_tokens as V
from rlvr_gym.data.episodes import STATE_NAMES, Episode, load_episodes, write_shards
from rlvr_gym.data.robot import InitialStates, concatenate_starts, episode_starts, load_initial_states
from rlvr_gym.domains.robot import balanced_accuracy
from rlvr_gym.files import CheckpointError
from rlvr_gym.models.robot_world_model import DEFAULT_SUCCESS_THRESHOLD, RobotWorldModel, RolloutStart
from rlvr_gym.models.sampler import SamplingConfig
from rlvr_gym.models.state_dynamics import dynamics_reach_distance, dynamics_success_probability
from rlvr_gym.models.state_reader import READ_NAMES, success_probability
from rlvr_gym.sim.guard import Guard
from rlvr_gym.sim.vector import reset_arguments

IMAGE_SHAPE = (64, 64, 3)
DEFAULT_CHECKPOINT = "rt1-rlvr"
DEFAULT_HORIZON = 50
OBSERVATIONS = ("frame", "state")
STATE_OBSERVATION_NAMES = (*STATE_NAMES, "target_x", "target_y")
"""What an agent observing the tabletop's state sees (`RLVRWorld-RT1-v0` with `observation="state"`, the real env
through `agents.robot.StateObservation`): the state, then the target marker's centre (m)."""
STATE_OBSERVATION_BOUND = 2.0
"""Every state observation lies within +-2: metres in a scene whose floor is 0.75 m below the table, closedness in
[0, 1]."""


def check_observation(observation: str) -> None:
    if observation not in OBSERVATIONS:
        raise ValueError(f"observation must be one of {OBSERVATIONS}, got {observation!r}")


def state_observation(state: np.ndarray, target_xy: np.ndarray) -> np.ndarray:
    """A state (STATE_NAMES) and the target marker's centre as an observation (STATE_OBSERVATION_NAMES)."""
    return np.concatenate([state, np.asarray(target_xy)[:2]]).astype(np.float32)


def state_observation_space() -> gym.spaces.Box:
    """What an agent on the tabletop's state sees, in the learned env and the real one (STATE_OBSERVATION_NAMES)."""
    bound = STATE_OBSERVATION_BOUND
    return gym.spaces.Box(-bound, bound, (len(STATE_OBSERVATION_NAMES),), np.float32)


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
    threshold: float
    """Success probability above which a predicted frame counts as success (the checkpoint's, for this task)."""
    first_frame: np.ndarray
    """The real first frame: the context of a frame tokenizer conditioned on it (else the last frame is)."""
    before: np.ndarray
    """The frame before `frame` (`frame` itself at the start), which a motion refiner reads."""
    task: Task
    """What the episode asks (which objects), for success read off the frames by a state reader."""
    first_state: np.ndarray | None = None
    """The state reader's reading of `first_frame` (where the target marker is), if the world model has a reader."""
    state: np.ndarray | None = None
    """The state reader's reading of `frame`, if the world model has a reader (`info["read_state"]`)."""
    predicted_state: np.ndarray | None = None
    """With state dynamics: the state they predict for `frame` (the real one at reset; `info["predicted_state"]`)."""
    target: np.ndarray | None = None
    """With state dynamics: the target marker's centre (the real start state's)."""
    prev_action: np.ndarray = field(default_factory=lambda: np.zeros(7, np.float32))
    """The action before the last (zero at the start): the state dynamics' stand-in for velocities."""
    state_disagreement: float = 0.0
    """With state dynamics: its members' disagreement about the last step (`StateDynamics.step`)."""
    steps: int = 0
    success_prob: float = 0.0
    uncertainty: float = 0.0
    """The transformer's mean negative log-likelihood (nats per code) of the codes of `frame`."""
    error: str | None = None
    hold: int = 1
    """Consecutive frames above the threshold that make a success (the checkpoint's `success_hold`)."""
    held: int = 0
    """Consecutive frames, up to `frame`, whose success probability exceeded the threshold."""

    @property
    def succeeded(self) -> bool:
        return self.held >= self.hold


def _read_starts(world: RobotWorldModel, states: InitialStates):
    """What a rollout from each initial state starts with: the frame's tokens, the state reader's reading (None
    without a reader) and, with state dynamics, the true state and target marker (ValueError where not recorded)."""
    first_codes = np.concatenate([world.encode(f, f) for f in np.array_split(states.frames, -(-len(states) // 256))])
    first_states = world.state_reader.read(states.frames) if world.state_reader is not None else None
    true_starts = None
    if world.state_dynamics is not None:
        true_starts = states.true_states()
        if np.isnan(true_starts[0]).any() or np.isnan(true_starts[1]).any():
            raise ValueError("the world model has state dynamics, which start from the true start states, but the "
                             "initial states do not record them all")
    return first_codes, first_states, true_starts


@dataclass
class _Simulator:
    """The world model and initial states behind both envs; `advance` steps any number of rollouts in one batch."""

    world: RobotWorldModel
    states: InitialStates
    first_codes: np.ndarray
    sampling: SamplingConfig
    first_states: np.ndarray | None = None
    """The state reader's reading of each initial state, if the world model has a reader."""
    guard: Guard = field(default_factory=Guard)
    true_starts: tuple[np.ndarray, np.ndarray] | None = None
    """With state dynamics: each initial state's true state and target marker centre (`InitialStates.true_states`)."""
    observation: str = "frame"
    """"frame": the video model draws each step's frame; "state": only the state dynamics step, no frame is drawn."""

    @classmethod
    def load(cls, checkpoint: str | os.PathLike, task: str | None, temperature: float,
             device: str | torch.device = "cpu", guard: Guard | None = None, success_hold: int | None = None,
             precision: str = "float32", observation: str = "frame") -> _Simulator:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        check_observation(observation)
        world = RobotWorldModel.load(checkpoint, device, precision)
        if observation == "state" and world.state_dynamics is None:
            raise ValueError(f"observation='state' shows the state the world model's state dynamics predict: "
                             f"{checkpoint} has none (rlvr-gym train state-dynamics; rt1-dynamics has them)")
        if success_hold is not None:  # None: the checkpoint's; the settings check the value
            world.settings = replace(world.settings, success_hold=success_hold)
        states = load_initial_states(RobotWorldModel.resolve(checkpoint))
        if task is not None:
            rows = np.flatnonzero(states.tasks == task)
            if len(rows) == 0:
                raise ValueError(f"the checkpoint has no initial states for task {task!r}; it has {sorted(set(states.tasks.tolist()))}")
            states = states.select(rows)
        try:
            first_codes, first_states, true_starts = _read_starts(world, states)
        except ValueError as error:
            raise CheckpointError(f"{checkpoint}: {error}; add them with `rlvr-gym train state-dynamics --world-model` "
                                  "(it records them by resetting the real env at each seed)") from None
        return cls(world, states, first_codes, SamplingConfig(temperature=temperature), first_states, guard or Guard(),
                   true_starts, observation)

    def add_starts(self, states: InitialStates) -> np.ndarray:
        """Append `states` (real first frames, e.g. the held-out starts an agent is scored from in the real env) to
        the initial states; returns their rows, for `reset(options={"index": rows})`."""
        first_codes, first_states, true_starts = _read_starts(self.world, states)
        rows = np.arange(len(self.states), len(self.states) + len(states))
        self.states = concatenate_starts(self.states, states)
        self.first_codes = np.concatenate([self.first_codes, first_codes])
        if first_states is not None:
            self.first_states = np.concatenate([self.first_states, first_states])
        if true_starts is not None:
            self.true_starts = tuple(np.concatenate(pair) for pair in zip(self.true_starts, true_starts))
        return rows

    def start(self, rng: np.random.Generator, index: int | None = None) -> _Rollout:
        """A new rollout from initial state `index`, or one drawn with `rng`."""
        if index is None:
            index = int(rng.integers(len(self.states)))
        elif not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.states):
            raise ValueError(f"options['index'] must be an int in [0, {len(self.states)}), got {index!r}")
        # Drawn even when greedy, so that the sequence of initial states a seed gives never depends on the temperature.
        sample_seed = int(rng.integers(2**63 - 1))
        first_state = self.first_states[index] if self.first_states is not None else None
        true_start = (None, None) if self.true_starts is None else (self.true_starts[0][index], self.true_starts[1][index])
        return self._rollout(int(index), sample_seed, self.first_codes[index], first_state, self.states.frames[index],
                             str(self.states.tasks[index]), str(self.states.instructions[index]), *true_start)  # fmt: skip

    def start_from_frame(self, frame: np.ndarray, task: str, instruction: str, true_state: np.ndarray | None = None,
                         target: np.ndarray | None = None) -> _Rollout:
        """A rollout from any real first frame (not one of the initial states: index -1, no info); a world model
        with state dynamics also needs the frame's true state and the target marker's centre."""
        if self.world.state_dynamics is not None and (true_state is None or target is None):
            raise ValueError("this world model steps the true state beside the frames: start_from_frame needs the "
                             f"frame's true_state ({', '.join(STATE_NAMES)}) and the target marker's centre")
        reader = self.world.state_reader
        first_state = reader.read(frame[None])[0] if reader is not None else None
        return self._rollout(-1, 0, self.world.encode(frame[None], frame[None])[0], first_state, frame, task, instruction,
                             true_state, target)

    def _rollout(self, index: int, sample_seed: int, first_code: np.ndarray, first_state: np.ndarray | None,
                 frame: np.ndarray, task: str, instruction: str, true_state: np.ndarray | None = None,
                 target: np.ndarray | None = None) -> _Rollout:
        n = self.world.settings.context_steps
        # After each step `codes` holds one more frame than the prompt uses and `actions` one fewer; appending
        # the next action (which drops the oldest) makes them line up again.
        codes = deque([first_code], maxlen=n)
        threshold = self.world.settings.success_threshold(task)
        as_array = lambda x: None if x is None else np.asarray(x, np.float32).copy()  # noqa: E731
        return _Rollout(index, sample_seed, codes, deque([False], maxlen=n), deque(maxlen=n), frame.copy(), threshold,
                        frame, frame.copy(), self._task(task, instruction), first_state, first_state,
                        as_array(true_state), as_array(target), hold=self.world.settings.success_hold)

    def _task(self, name: str, instruction: str) -> Task:
        if self.world.state_reader is None and self.world.state_dynamics is None:
            return Task(name)  # only the name matters to the success flag
        task = task_from_instruction(instruction)
        if task.name != name:
            raise ValueError(f"instruction {instruction!r} asks for {task.name}, not {name}")
        return task

    def advance(self, rollouts: list[_Rollout], actions: np.ndarray, generator: torch.Generator | None) -> None:
        """Predict the next frame of every rollout under its action with one batched `rollout` call (with
        `observation="state"`, the next state alone)."""
        if self.observation == "state":
            for rollout, probability in zip(rollouts, self._step_states(rollouts, actions)):
                rollout.success_prob, rollout.uncertainty = float(probability), rollout.state_disagreement
                rollout.held = rollout.held + 1 if probability > rollout.threshold else 0
                rollout.steps += 1
            return
        for rollout, action in zip(rollouts, actions):
            rollout.actions.append(action)
        prompts = [self.world.prompt(list(r.codes), list(r.flags), list(r.actions)) for r in rollouts]
        start = RolloutStart(np.stack([r.frame for r in rollouts]), np.stack([r.first_frame for r in rollouts]),
                             np.stack([r.before for r in rollouts]), np.asarray(actions))
        result = self.world.rollout(prompts, start, k=1, sampling=self.sampling, generator=generator)
        if self.world.state_dynamics is not None:
            # Success on the state the dynamics predicts under the same actions: the frames lose what a large move
            # does (the gripper smears, the drawer is not shown closing), the state keeps it.
            result.success[:, 0] = self._step_states(rollouts, actions)
        elif self.world.state_reader is not None:
            # Success read off the frames shown: the task's own test on the state the reader sees in them.
            states = self.world.state_reader.read(result.frames[:, 0])
            for i, rollout in enumerate(rollouts):
                rollout.state = states[i]
                result.success[i, 0] = success_probability(rollout.task, states[i : i + 1], rollout.first_state)[0]
        for i, rollout in enumerate(rollouts):
            rollout.codes.append(result.context[i, 0])
            rollout.before = rollout.frame
            rollout.held = rollout.held + 1 if result.success[i, 0] > rollout.threshold else 0
            # A frame on its way to a held success goes back unflagged: in the training episodes a flagged frame
            # is always the last.
            rollout.flags.append(rollout.succeeded)
            rollout.frame, rollout.success_prob, rollout.error = result.frames[i, 0], float(result.success[i, 0]), result.errors[i]
            rollout.uncertainty = float(result.uncertainty[i, 0])
            rollout.steps += 1

    def _step_states(self, rollouts: list[_Rollout], actions: np.ndarray) -> np.ndarray:
        """Step every rollout's predicted state under its action; returns the task's success probability on each."""
        actions = np.asarray(actions, np.float32)
        states, spread = self.world.state_dynamics.step(np.stack([r.predicted_state for r in rollouts]), actions,
                                                        np.stack([r.prev_action for r in rollouts]))
        probabilities = np.empty(len(rollouts))
        for i, rollout in enumerate(rollouts):
            rollout.predicted_state, rollout.prev_action = states[i], actions[i]
            rollout.state_disagreement = float(spread[i])
            probabilities[i] = dynamics_success_probability(rollout.task, states[i : i + 1], rollout.target)[0]
        return probabilities

    def observe(self, rollout: _Rollout | None) -> np.ndarray:
        """What the agent sees of a rollout: its frame, or its predicted state and the target marker's centre."""
        if self.observation == "state":
            return (np.zeros(len(STATE_OBSERVATION_NAMES), np.float32) if rollout is None
                    else state_observation(rollout.predicted_state, rollout.target))
        return np.zeros(IMAGE_SHAPE, np.uint8) if rollout is None else rollout.frame.copy()

    def spaces(self) -> tuple[gym.spaces.Box, gym.spaces.Box]:
        """Observation and action space of one env."""
        actions = gym.spaces.Box(-1.0, 1.0, (V.ACTION_DIM,), np.float32)
        if self.observation == "state":
            return state_observation_space(), actions
        return gym.spaces.Box(0, 255, IMAGE_SHAPE, np.uint8), actions

    def halted(self, rollout: _Rollout) -> bool:
        return rollout.steps > 0 and self.guard.halts(rollout.uncertainty)

    def outcome(self, rollout: _Rollout, horizon: int) -> tuple[float, bool, bool]:
        """(reward, terminated, truncated) of a rollout's last step: paid on predicted success (held for `hold`
        frames), less the uncertainty penalty; a halted rollout ends truncated and unpaid."""
        halted = self.halted(rollout)
        success = rollout.succeeded and not halted
        reward = float(success) - self.guard.penalty * rollout.uncertainty
        return reward, success, not success and (halted or rollout.steps >= horizon)

    def info(self, rollout: _Rollout) -> dict[str, Any]:
        halted = self.halted(rollout)
        info = {
            "success_prob": rollout.success_prob,
            "success_threshold": rollout.threshold,
            "is_success": rollout.succeeded and not halted,
            "task": str(self.states.tasks[rollout.index]),
            "instruction": str(self.states.instructions[rollout.index]),
            "step": rollout.steps,
            "initial_state": rollout.index,
            "uncertainty": rollout.uncertainty,
            "halted": halted,
        }
        if rollout.predicted_state is not None:
            info["predicted_state"] = dict(zip(STATE_NAMES, rollout.predicted_state.tolist()))
            info["state_disagreement"] = rollout.state_disagreement
            info["reach_distance"] = float(dynamics_reach_distance(rollout.task, rollout.predicted_state[None],
                                                                   rollout.target)[0])
        elif rollout.state is not None:
            info["read_state"] = dict(zip(READ_NAMES, rollout.state.tolist()))
        if rollout.error is not None:
            info["error"] = rollout.error
        return info


# ---------------------------------------------------------------------------------------------------- calibration


@dataclass
class CalibrateConfig:
    checkpoint: str = "runs/rt1/rlvr/world_model"
    """World-model directory whose world_model.json receives the thresholds (a path, not a shipped name: the shipped
    ones were calibrated in place as `rlvr_gym/checkpoints/rt1-rlvr`)."""
    data: tuple[str, ...] = ("runs/rt1/train2",)
    """Episode directories (`rlvr-gym collect rt1`) replayed in the learned env: training episodes, and episodes of
    trivial policies (`--trivial-fraction`), whose real failures keep the thresholds from paying them. The
    checkpoint's own initial states are left out, so policy evaluation and the probe from those states never see
    their calibration episodes."""
    episodes_per_task: int = 64
    """Episodes replayed per task from each directory (64: about 5 CPU-minutes for the four tasks)."""
    max_trivial_success: float = 1.0
    """Most of the trivial policies' failed episodes (`trivial:*` and `random`, `collect rt1 --trivial-fraction`) a
    task's threshold may call a success; 1: no limit, the best balanced accuracy. A limit trades true successes in
    the learned env for fewer paid exploits (see the checkpoint card)."""
    num_envs: int = 64
    """Rollouts stepped together."""
    seed: int = 0
    """Seeds the choice of episodes."""


def held_score(probs: Sequence[float], hold: int) -> float:
    """The highest probability an episode's frames keep for `hold` consecutive frames (0 if it is shorter): the
    simulator calls success in it exactly when this exceeds the threshold."""
    probs = np.asarray(probs, dtype=np.float64)
    if len(probs) < hold:
        return 0.0
    return float(np.lib.stride_tricks.sliding_window_view(probs, hold).min(axis=1).max())


def first_held_step(probs: Sequence[float], threshold: float, hold: int) -> int | None:
    """The step at which the simulator calls success on these per-step success probabilities: the first at which the
    last `hold` of them all exceed the threshold (None: never; exactly when `held_score` <= threshold)."""
    held = 0
    for t, prob in enumerate(probs):
        held = held + 1 if prob > threshold else 0
        if held >= hold:
            return t
    return None


def replay_open_loop(sim: _Simulator, episodes: Sequence[Episode], num_envs: int = 64,
                     keep_frames: bool = False) -> tuple[list[list[float]], list[np.ndarray]]:
    """Replay each episode's real actions open loop from its first frame (greedy), `num_envs` at a time: each one's
    success probability after every step and, with `keep_frames`, its frames as the simulator drew them (T + 1, the
    real first frame and then the predicted ones; else an empty list)."""
    probs: list[list[float]] = [[] for _ in episodes]
    frames: list[list[np.ndarray]] = [[e.frames[0]] for e in episodes] if keep_frames else []
    generator = torch.Generator().manual_seed(0)
    for start in range(0, len(episodes), num_envs):
        batch = list(episodes[start : start + num_envs])
        starts = episode_starts(batch)
        rollouts = [sim.start_from_frame(e.frames[0], e.task, e.instruction, starts.states[i], starts.targets[i])
                    for i, e in enumerate(batch)]
        for t in range(max(len(e) for e in batch)):
            live = [i for i, e in enumerate(batch) if t < len(e)]
            sim.advance([rollouts[i] for i in live], np.stack([batch[i].actions[t] for i in live]), generator)
            for i in live:
                probs[start + i].append(rollouts[i].success_prob)
                if keep_frames:
                    frames[start + i].append(rollouts[i].frame)
    return probs, [np.stack(f) for f in frames]


def replay_success_scores(sim: _Simulator, episodes: Sequence[Episode], num_envs: int = 64) -> np.ndarray:
    """Each episode's `held_score` under the checkpoint's `success_hold`, replayed open loop (`replay_open_loop`; with a
    hold of 1, the highest success probability of any predicted frame)."""
    probs, _ = replay_open_loop(sim, episodes, num_envs)
    return np.array([held_score(p, sim.world.settings.success_hold) for p in probs])


def success_agreement(checkpoint: str | os.PathLike, episodes: Sequence[Episode],
                      precision: str = "float32") -> dict[str, dict[str, float]]:
    """How the simulator's success calls on real episodes replayed open loop (`replay_success_scores`, the
    checkpoint's own thresholds) agree with the real outcomes, per task: balanced accuracy, the share of real
    successes it pays and of real failures it pays, episodes and real successes. A world model with state dynamics
    calls success on the state they predict alone, so its replays draw no frame."""
    has_dynamics = (Path(RobotWorldModel.resolve(checkpoint)) / "state_dynamics").is_dir()
    sim = _Simulator.load(checkpoint, None, 0.0, precision=precision, observation="state" if has_dynamics else "frame")
    result = {}
    for task in sorted({e.task for e in episodes}):
        mine = [e for e in episodes if e.task == task]
        scores, threshold = replay_success_scores(sim, mine), sim.world.settings.success_threshold(task)
        paid, real = scores > threshold, np.array([e.succeeded for e in mine])
        result[task] = {"balanced_accuracy": balanced_accuracy(scores, real, threshold),
                        "successes_paid": float(paid[real].mean()) if real.any() else float("nan"),
                        "failures_paid": float(paid[~real].mean()) if (~real).any() else float("nan"),
                        "episodes": len(mine), "real_successes": int(real.sum())}
    return result


def best_threshold(scores: np.ndarray, succeeded: np.ndarray, trivial: np.ndarray | None = None,
                   max_trivial_success: float = 1.0) -> tuple[float, float]:
    """The threshold on an episode's score (`held_score`) that best separates real successes from failures
    (balanced accuracy, so the calibration set's mix does not matter), and that balanced accuracy. With `trivial`
    (which episodes a trivial policy played), only thresholds that call at most `max_trivial_success` of those that
    really failed a success are allowed."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) == 0 or len(scores) != len(succeeded):
        raise ValueError(f"need one success label per episode, got {len(scores)} scores and {len(succeeded)} labels")
    values = np.unique(scores)
    # Midpoints between neighbouring values, one below all (everything succeeds) and one above all (nothing does).
    candidates = np.concatenate([[values[0] / 2], (values[:-1] + values[1:]) / 2, [(values[-1] + 1) / 2]])
    accuracy = np.array([balanced_accuracy(scores, succeeded, t) for t in candidates])
    failed = np.zeros(len(scores), bool) if trivial is None else np.asarray(trivial, bool) & ~np.asarray(succeeded, bool)
    if failed.any():
        paid = np.array([np.mean(scores[failed] > t) for t in candidates])
        accuracy = np.where(paid <= max_trivial_success, accuracy, -1.0)  # the top candidate pays none: always allowed
    best = int(np.argmax(accuracy))  # the lowest of equally good thresholds
    return float(candidates[best]), float(accuracy[best])


def calibrate(config: CalibrateConfig) -> dict[str, Any]:
    """Set the checkpoint's per-task success thresholds from open-loop replays of training episodes.

    The success head (the transformer's flag, or a state reader) sees imagined frames, which blur what decides
    success; under good real actions its probabilities stay well below 0.5 (rt1-rlvr's flag: an expert scored 1.0
    real, 0.19 in the learned env; a reader finds the drawer short of open in long rollouts). The threshold per task
    is the one that best separates the replays of episodes that really succeeded from those that did not, among
    those that call at most `max_trivial_success` of the trivial policies' failures a success; an episode's score
    is the probability its frames hold for the checkpoint's `success_hold` frames (`held_score`).
    """
    if not 0 <= config.max_trivial_success <= 1:
        raise ValueError(f"max_trivial_success is a fraction in [0, 1], got {config.max_trivial_success}")
    path = Path(config.checkpoint)
    if not path.is_dir():
        raise ValueError(f"--checkpoint must be a world-model directory you can write to, got {config.checkpoint!r}")
    if config.episodes_per_task < 2:
        raise ValueError(f"episodes_per_task must be >= 2, got {config.episodes_per_task}")
    torch.set_num_threads(1)
    sim = _Simulator.load(path, None, 0.0)
    sim.world.settings.success_thresholds = {}  # a task without episodes goes back to the default threshold
    excluded = set(sim.states.seeds.tolist())
    rng = np.random.default_rng(config.seed)
    by_task: dict[str, list[Episode]] = {}
    for directory in [config.data] if isinstance(config.data, str) else config.data:
        in_directory: dict[str, list[Episode]] = {}
        for episode in load_episodes(directory):
            if episode.seed not in excluded:
                in_directory.setdefault(episode.task, []).append(episode)
        for task, episodes in in_directory.items():
            chosen = [episodes[i] for i in sorted(rng.permutation(len(episodes))[: config.episodes_per_task])]
            by_task.setdefault(task, []).extend(chosen)
    result: dict[str, Any] = {"checkpoint": str(path), "tasks": {}}
    for task, chosen in sorted(by_task.items()):
        trivial = np.array([e.policy.startswith("trivial:") or e.policy == "random" for e in chosen])
        result["tasks"][task] = calibrate_task(sim, task, chosen, trivial, config.max_trivial_success, config.num_envs)
    sim.world.save_settings(path)
    return result


def calibrate_task(sim: _Simulator, task: str, episodes: Sequence[Episode], trivial: np.ndarray | None = None,
                   max_trivial_success: float = 1.0, num_envs: int = 64) -> dict[str, Any]:
    """Set `task`'s success threshold in `sim.world.settings` (not saved) to the one that best separates the open-loop
    replays of the real episodes that succeeded from those that did not (`best_threshold`); returns how well."""
    succeeded = np.array([e.succeeded for e in episodes], dtype=bool)
    # Replays feed back success flags at the default threshold, so a recalibration does not depend on the last one.
    sim.world.settings.success_thresholds.pop(task, None)
    scores = replay_success_scores(sim, episodes, num_envs)
    threshold, accuracy = best_threshold(scores, succeeded, trivial, max_trivial_success)
    sim.world.settings.success_thresholds[task] = threshold
    failed_trivial = np.zeros(len(episodes), bool) if trivial is None else np.asarray(trivial, bool) & ~succeeded
    return {
        "threshold": threshold, "balanced_accuracy": accuracy,
        "balanced_accuracy_at_0.5": balanced_accuracy(scores, succeeded, DEFAULT_SUCCESS_THRESHOLD),
        "episodes": len(episodes), "real_successes": int(succeeded.sum()),
        "successes_called": float(np.mean(scores[succeeded] > threshold)) if succeeded.any() else None,
        "trivial_failures_called": float(np.mean(scores[failed_trivial] > threshold)) if failed_trivial.any() else None,
    }


def recalibrate_task(checkpoint: str | os.PathLike, task: str, episodes: Sequence[Episode]) -> dict[str, Any]:
    """Set one task's success threshold in a world-model directory from real episodes of it (`calibrate_task`, by
    balanced accuracy alone) and save it there; returns how well it separates them."""
    sim = _Simulator.load(checkpoint, task, 0.0)
    result = calibrate_task(sim, task, episodes, num_envs=min(len(episodes), 64))
    sim.world.save_settings(Path(checkpoint))
    return result


@dataclass
class ImagineConfig:
    """Replay real episodes open loop in a learned tabletop and write them with the frames it drew."""

    out: str
    """Output directory: the episodes as collected (actions, true states, success, policy), the simulator's frames."""
    checkpoint: str = DEFAULT_CHECKPOINT
    """World model (a shipped name or a directory) that draws the frames."""
    data: str = "runs/rt1/train"
    """Real episodes (`rlvr-gym collect rt1`) whose actions are replayed from their first frames."""
    episodes: int = 0
    """Replay only the first this many (0: all)."""
    num_envs: int = 64
    """Rollouts stepped together."""
    overwrite: bool = False
    """Replace a dataset already in `out`."""


def imagine(config: ImagineConfig) -> Path:
    """Write `config.data`'s episodes with each frame after the first replaced by the one the world model predicts
    under the episode's real actions (greedy, open loop, as `calibrate` replays them); true states and success stay
    the real env's. They show what the simulator makes of real behaviour, and a state reader can train on them
    (`train state-reader --data REAL IMAGINED`) to read frames as the simulator draws them (the rt1-rlvr card
    measures what that gives)."""
    if config.num_envs < 1 or config.episodes < 0:
        raise ValueError(f"num_envs must be >= 1 and episodes >= 0, got {config.num_envs} and {config.episodes}")
    torch.set_num_threads(1)
    sim = _Simulator.load(config.checkpoint, None, 0.0)
    episodes = load_episodes(config.data)[: config.episodes or None]
    bar = tqdm(total=len(episodes), desc="imagine", unit="ep")

    def imagined() -> Iterator[Episode]:
        for start in range(0, len(episodes), config.num_envs):
            batch = episodes[start : start + config.num_envs]
            _, frames = replay_open_loop(sim, batch, config.num_envs, keep_frames=True)
            for episode, drawn in zip(batch, frames):
                bar.update()
                yield replace(episode, frames=drawn)

    record = {"imagined_by": str(config.checkpoint), "source": str(config.data), "num_envs": config.num_envs}
    try:
        return write_shards(imagined(), config.out, "imagined", config=record, overwrite=config.overwrite)
    finally:
        bar.close()


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


def _check_args(horizon: int, render_mode: str | None, render_modes: list[str], observation: str) -> None:
    if horizon < 1:
        raise ValueError(f"horizon must be a positive number of steps, got {horizon}")
    if render_mode is not None and observation == "state":
        raise ValueError("observation='state' draws no frames to render: use render_mode=None")
    if render_mode is not None and render_mode not in render_modes:
        raise ValueError(f"render_mode must be None or one of {render_modes}, got {render_mode!r}")


def _metadata(metadata: dict[str, Any], observation: str) -> dict[str, Any]:
    """An env's metadata: no render mode where no frame is drawn."""
    return {**metadata, "render_modes": []} if observation == "state" else metadata


# ---------------------------------------------------------------------------------------------------- single env


class RT1WorldEnv(gym.Env):
    """The MuJoCo tabletop (`envs.robot.RealRT1Env`) as its learned video world model predicts it.

    ## Description
    Each step appends the action to the episode's sliding window of past (frame codes, success flag, action),
    asks the world model for the next frame's 64 codes and success flag (one frame, k = 1), and decodes the
    codes into a 64x64 frame with the episode's first real frame as the tokenizer's context; a motion refiner, where
    the checkpoint has one, then redraws it from the two frames before. With `context_from_frames` (the shipped
    checkpoints) the window takes the codes of the frame shown, not the ones generated, so the env's state is what
    the agent sees. Nothing of the real env runs: frames, reward and termination all come from the model.

    ## Action Space
    `Box(-1, 1, (7,), float32)`, RT-1's end-effector action as in the real env: `[0:3]` world_vector,
    `[3:6]` rotation_delta, `[6]` gripper_closedness. Values outside [-1, 1] are clipped; the model sees each
    dimension in one of 256 bins. An action of the wrong shape, a non-numeric dtype, or NaN / inf raises ValueError.

    ## Observation Space
    `Box(0, 255, (64, 64, 3), uint8)`: the real first frame after reset, then the decoded predicted frames. With
    `observation="state"` (a checkpoint with state dynamics): `Box(-inf, inf, (16,), float32)`, the state the dynamics
    predict and the target marker's centre (`rlvr_gym.sim.robot.STATE_OBSERVATION_NAMES`: palm position,
    closedness, object centres, drawer joint, target x and y, in metres), the real start state's at reset; no frame
    is drawn, so a step costs the dynamics' small MLPs alone, and the real env shows an agent the same numbers through
    `agents.robot.StateObservation`.

    ## Rewards
    1.0 when the model's success probability has exceeded the checkpoint's threshold for the episode's task
    (`rlvr-gym calibrate rt1` sets them; 0.5 where it did not) on the last `success_hold` predicted frames, else 0.0 (the real env's
    reward is 1.0 on the step that reaches success, which also ends its episode). With a state reader in the
    checkpoint (`rlvr-gym train state-reader`) the probability is the task's own success test on the state read
    off the frame shown, sigmoid(margin / 1 cm), the target marker read off the first frame; without one it is
    the transformer's success flag.

    ## Starting State
    A real first frame from the checkpoint's `initial_states.npz`, drawn uniformly with the env's `np_random`
    (restricted to `task` when given); `reset(options={"index": i})` picks row i instead.

    ## Episode End
    Terminated on that success; truncated after `horizon` steps.
    `info`: `success_prob`, `success_threshold` (what it is compared with), `is_success`, `task`, `instruction`,
    `step`, `initial_state` (the row), `read_state` (with a state reader: object centres, drawer joint and target
    marker in metres, as read off the frame), `predicted_state`, `state_disagreement` and `reach_distance` (with state
    dynamics: the state they predict, their members' spread, and the palm's distance in metres to where the task's
    work starts, `envs.robot.policies.reach_point`), `uncertainty` and `halted` (see the arguments) and `error` when the
    model's output could not be parsed (the last frame is repeated then).

    ## Arguments
    - `checkpoint`: a world-model directory or shipped name (default "rt1-rlvr").
    - `horizon`: steps before truncation (default 50, as the real env).
    - `task`: start only from initial states of this task (default: all).
    - `temperature`: 0 for greedy frames; > 0 samples them, seeded from `np_random` at reset, so the same
      reset seed gives the same rollout.
    - `render_mode`: None or "rgb_array"; `render()` returns the last frame.
    - `device`: where the world model runs: "cpu" (default), "cuda", "cuda:1", or "auto" (the first GPU if there is
      one). Greedy frames agree across devices up to floating-point rounding; samples are drawn on the CPU, so a
      seed draws the same numbers everywhere.
    - `uncertainty_penalty` (MOPO, default 0: off): the reward less this times `info["uncertainty"]`, the
      transformer's mean negative log-likelihood of the codes it generated for the frame shown (nats per code).
    - `halt_uncertainty` (MOReL, default None: off): once `info["uncertainty"]` exceeds it the episode ends,
      truncated and unpaid, with `info["halted"]` True: the agent has driven the model where it is guessing.
    - `success_hold`: consecutive frames the success probability must stay above the threshold (None: the
      checkpoint's `success_hold`, 2 for rt1-rlvr). A success the real env gives persists; many the model invents
      last one frame.
    - `observation`: "frame" (default) or "state" (above; `info["uncertainty"]` is then the dynamics' disagreement,
      `info["state_disagreement"]`, and `render_mode` must be None).
    - `precision`: "float32" (default) or "bfloat16": the world model's weight products in bfloat16 (`PRECISIONS`
      in rlvr_gym.models.robot_world_model), faster on a CPU with AVX-512 BF16 or a GPU; its frames and success
      calls differ slightly from float32's (`python -m bench.rt1_sim` measures both), and batched greedy rollouts
      no longer equal single ones bit for bit.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
        horizon: int = DEFAULT_HORIZON,
        task: str | None = None,
        temperature: float = 0.0,
        render_mode: str | None = None,
        device: str = "cpu",
        uncertainty_penalty: float = 0.0,
        halt_uncertainty: float | None = None,
        success_hold: int | None = None,
        precision: str = "float32",
        observation: str = "frame",
    ):
        _check_args(horizon, render_mode, self.metadata["render_modes"], observation)
        self.metadata = _metadata(self.metadata, observation)
        self.sim = _Simulator.load(checkpoint, task, temperature, device, Guard(uncertainty_penalty, halt_uncertainty),
                                   success_hold, precision, observation)
        self.horizon = horizon
        self.task = task
        self.temperature = temperature
        self.render_mode = render_mode
        self.observation_space, self.action_space = self.sim.spaces()
        self._rollout: _Rollout | None = None
        # On the CPU wherever the model runs: the same seed draws the same samples on any device.
        self._generator = torch.Generator()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._rollout = self.sim.start(self.np_random, (options or {}).get("index"))
        self._generator.manual_seed(self._rollout.sample_seed)
        return self.sim.observe(self._rollout), self.sim.info(self._rollout)

    def step(self, action):
        if self._rollout is None:
            raise RuntimeError("call reset() before step()")
        action = _check_actions(action, (V.ACTION_DIM,))
        self.sim.advance([self._rollout], action[None], self._generator)
        info = self.sim.info(self._rollout)
        reward, terminated, truncated = self.sim.outcome(self._rollout, self.horizon)
        return self.sim.observe(self._rollout), reward, terminated, truncated, info

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

    Spaces, rewards, termination and truncation are RT1WorldEnv's (see its docstring), batched along axis 0; so are
    the arguments, with `num_envs` and `autoreset_mode` added.

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
        device: str = "cpu",
        uncertainty_penalty: float = 0.0,
        halt_uncertainty: float | None = None,
        success_hold: int | None = None,
        precision: str = "float32",
        observation: str = "frame",
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        _check_args(horizon, render_mode, self.metadata["render_modes"], observation)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = _metadata({**self.metadata, "autoreset_mode": self.autoreset_mode}, observation)
        self.sim = _Simulator.load(checkpoint, task, temperature, device, Guard(uncertainty_penalty, halt_uncertainty),
                                   success_hold, precision, observation)
        self.num_envs = num_envs
        self.horizon = horizon
        self.task = task
        self.temperature = temperature
        self.render_mode = render_mode
        self.single_observation_space, self.single_action_space = self.sim.spaces()
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._rngs = [seeding.np_random()[0] for _ in range(num_envs)]
        self._rollouts: list[_Rollout | None] = [None] * num_envs
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        # On the CPU wherever the model runs: the same seed draws the same samples on any device.
        self._generator = torch.Generator()

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        mask, seeds, indices = reset_arguments(self.num_envs, seed, options)
        if any(s is not None for s in seeds):
            self._np_random = np.random.default_rng([int(s) for s in seeds if s is not None])
            self._np_random_seed = int(seed) if isinstance(seed, (int, np.integer)) else -1
        if mask.all():
            self._generator.manual_seed(int(self.np_random.integers(2**63 - 1)))
        for i in np.flatnonzero(mask):
            if seeds[i] is not None:
                self._rngs[i] = seeding.np_random(int(seeds[i]))[0]
            self._rollouts[i] = self.sim.start(self._rngs[i], indices[i])
        self._needs_reset[mask] = False
        return self._observations(), self._infos(np.flatnonzero(mask))

    def step(self, actions):
        if any(r is None for r in self._rollouts):
            raise RuntimeError("call reset() before step()")
        actions = _check_actions(actions, (self.num_envs, V.ACTION_DIM))
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
            outcomes = [self.sim.outcome(r, self.horizon) for r in rollouts]
            rewards[stepping] = [o[0] for o in outcomes]
            terminated[stepping] = [o[1] for o in outcomes]
            truncated[stepping] = [o[2] for o in outcomes]
        ended = terminated | truncated
        self._needs_reset = ended & (self.autoreset_mode != AutoresetMode.SAME_STEP)
        final: dict[str, Any] = {}
        if self.autoreset_mode == AutoresetMode.SAME_STEP and ended.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            final_infos = [None] * self.num_envs
            for i in np.flatnonzero(ended):
                final_obs[i], final_infos[i] = self.sim.observe(self._rollouts[i]), self.sim.info(self._rollouts[i])
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
        return np.stack([self.sim.observe(r) for r in self._rollouts])

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

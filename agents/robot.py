"""SB3 agents on the RT-1 tabletop: the learned simulator they train in, and the real env they are scored in.

    venv = make_sim_env("rt1-rlvr", num_envs=16, task="open_drawer")     # batched world model, 32x32 frames
    model = stable_baselines3.PPO("MlpPolicy", venv).learn(5_000)
    evaluate_in_real(model, episodes=16, task="open_drawer")             # held-out start states, MuJoCo

Agents see frames block-averaged to `frame_size` (32 by default) through an MLP. Measured on this 2-core CPU (8
envs of random frames, one thread): PPO ran 3,200 steps/s with an MLP on 32x32 frames, 1,640 with a small two-layer
CNN on 64x64 and 600 with SB3's NatureCNN (CnnPolicy); SAC 89, 62 and 24. Besides being fastest, the MLP leaves no
custom class in the checkpoint, so `rlvr_gym.evaluation.policies` loads it without importing `agents`.

With `observation="state"` an agent sees the state instead (palm, closedness, object centres, drawer joint, target
marker: 16 numbers): in a simulator with state dynamics the state they predict, with no frame drawn (thousands of
steps/s), in the real env its true state (`StateObservation`). PPO on frames does not learn to open the drawer in
the real env within 131,072 steps, on the state it does (`python -m bench.rt1_reach`).
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecEnvWrapper, VecMonitor

from envs.robot import TASKS, RealRT1Env
from envs.robot.tasks import task_from_instruction
from rlvr_gym.data.episodes import SEEDS_PER_RUN, info_state
from rlvr_gym.data.robot import load_initial_states, real_initial_states
from rlvr_gym.evaluation.policies import Job, learned_rollouts, policy_frames, real_rollout, sb3_actor, sb3_real_actor
from rlvr_gym.models.robot_world_model import RobotWorldModel
from rlvr_gym.models.state_dynamics import dynamics_reach_distance, dynamics_success_probability
from rlvr_gym.sim.robot import (
    DEFAULT_CHECKPOINT,
    DEFAULT_HORIZON,
    RT1WorldVectorEnv,
    check_observation,
    state_observation,
    state_observation_space,
)
from rlvr_gym.sim.sb3 import SB3VecEnv

DEFAULT_FRAME_SIZE = 32
EVAL_SEED_RUN = 9
"""Real start states for scoring agents: env seeds 9_000_000 + i, a collection run never used for training data."""


class VecFrames(VecEnvWrapper):
    """Block-average a VecEnv's 64x64 frames (and the terminal frames in its infos) to size x size."""

    def __init__(self, venv: VecEnv, size: int):
        shape = (size, size, venv.observation_space.shape[-1])
        super().__init__(venv, observation_space=gym.spaces.Box(0, 255, shape, np.uint8))
        self.size = size

    def reset(self) -> np.ndarray:
        return policy_frames(self.venv.reset(), self.size)

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        for info in infos:
            if "terminal_observation" in info:
                info["terminal_observation"] = policy_frames(info["terminal_observation"], self.size)
        return policy_frames(obs, self.size), rewards, dones, infos


class VecShaped(VecEnvWrapper):
    """Add potential-based shaping (Ng, Harada and Russell 1999, undiscounted) to a VecEnv's sparse reward: the step's
    change in `weight` x the log-odds of success the learned simulator reports (`info["success_prob"]`; with a state
    reader, the task's success margin read off the imagined frame over `state_reader.MARGIN_SCALE`; with state
    dynamics, the margin on the predicted state), less `reach` x the palm's distance in metres to where the task's
    work starts (`info["reach_distance"]`, `envs.robot.policies.reach_point`). The margin gives no gradient until the
    drawer or the object moves, which PPO rarely brings about by chance; the reach term leads the gripper there.
    The first step of an episode has no previous value and gets no shaping."""

    def __init__(self, venv: VecEnv, weight: float, reach: float = 0.0):
        super().__init__(venv)
        self.weight = weight
        self.reach = reach
        self.previous = np.full(venv.num_envs, np.nan)

    def reset(self) -> np.ndarray:
        self.previous[:] = np.nan
        return self.venv.reset()

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        potential = self.weight * self._log_odds(infos) if self.weight else np.zeros(len(infos))
        if self.reach:
            if any("reach_distance" not in info for info in infos):
                raise ValueError("reach shaping needs info['reach_distance']: a simulator with state dynamics "
                                 "(e.g. rt1-dynamics) or the real env through TrueSuccessProbability")
            potential = potential - self.reach * np.array([info["reach_distance"] for info in infos], np.float64)
        change = np.nan_to_num(potential - self.previous)
        self.previous = np.where(dones, np.nan, potential)
        return obs, rewards + change.astype(rewards.dtype), dones, infos

    @staticmethod
    def _log_odds(infos: list[dict]) -> np.ndarray:
        probs = np.clip(np.array([info["success_prob"] for info in infos], dtype=np.float64), 1e-12, 1 - 1e-12)
        return np.log(probs) - np.log1p(-probs)


class StateObservation(gym.Wrapper):
    """The real tabletop observed as `RLVRWorld-RT1-v0(observation="state")` shows the learned one: its true state and
    the target marker's centre (`rlvr_gym.sim.robot.STATE_OBSERVATION_NAMES`) instead of its frame."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = state_observation_space()

    def reset(self, **kwargs):
        _, info = self.env.reset(**kwargs)
        return state_observation(info_state(info), info["target_pos"]), info

    def step(self, action):
        _, reward, terminated, truncated, info = self.env.step(action)
        return state_observation(info_state(info), info["target_pos"]), reward, terminated, truncated, info


class TrueSuccessProbability(gym.Wrapper):
    """The real tabletop with `info["success_prob"]` and `info["reach_distance"]`: the task's success margin on the
    env's true state as a probability and the palm's distance to where the task's work starts, what a learned
    simulator with state dynamics reports on its predicted state (`dynamics_success_probability`,
    `dynamics_reach_distance`), so that `VecShaped` shapes an agent's reward in the real env as in that simulator
    (the baseline that trains in the real env then gets the same dense signal as the loop's agent)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, self._with_probability(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._with_probability(info)

    @staticmethod
    def _with_probability(info: dict) -> dict:
        task = task_from_instruction(info["instruction"])
        state, target = info_state(info)[None], np.asarray(info["target_pos"])[:2]
        return {**info, "success_prob": float(dynamics_success_probability(task, state, target)[0]),
                "reach_distance": float(dynamics_reach_distance(task, state, target)[0])}


def make_sim_env(
    checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
    num_envs: int = 16,
    task: str | None = None,
    horizon: int = DEFAULT_HORIZON,
    frame_size: int = DEFAULT_FRAME_SIZE,
    temperature: float = 0.0,
    shaping: float = 0.0,
    precision: str = "float32",
    reach: float = 0.0,
    observation: str = "frame",
    uncertainty_penalty: float = 0.0,
) -> VecEnv:
    """The batched learned simulator as an SB3 VecEnv (episode stats of the sparse reward via VecMonitor), frames at
    `frame_size` or with `observation="state"` the predicted state, with `shaping` or `reach` > 0 the reward shaped by
    `VecShaped`, the world model in `precision`, the reward less `uncertainty_penalty` x `info["uncertainty"]` (MOPO;
    `RLVRWorld-RT1-v0`'s argument)."""
    _check_shaping(shaping, reach)
    check_observation(observation)
    venv = gym.make_vec("RLVRWorld-RT1-v0", num_envs=num_envs, vectorization_mode="vector_entry_point",
                        checkpoint=checkpoint, horizon=horizon, task=task, temperature=temperature, precision=precision,
                        observation=observation, uncertainty_penalty=uncertainty_penalty)
    if reach and venv.unwrapped.sim.world.state_dynamics is None:
        venv.close()
        raise ValueError(f"reach shaping reads the gripper off the predicted state: {checkpoint} has no state dynamics "
                         "(rlvr-gym train state-dynamics; the shipped rt1-dynamics has them)")
    monitored = VecMonitor(SB3VecEnv(venv))
    shaped = VecShaped(monitored, shaping, reach) if shaping or reach else monitored
    return shaped if observation == "state" else VecFrames(shaped, frame_size)


def make_real_env(task: str, horizon: int = DEFAULT_HORIZON, frame_size: int = DEFAULT_FRAME_SIZE,
                  shaping: float = 0.0, reach: float = 0.0, observation: str = "frame", num_envs: int = 1) -> VecEnv:
    """The real tabletop as `make_sim_env` gives the learned one: `num_envs` envs, frames at `frame_size` (or with
    `observation="state"` the true state, `StateObservation`), episode stats of the sparse reward, with `shaping` or
    `reach` > 0 the reward shaped by `VecShaped` on the true state (`TrueSuccessProbability`)."""
    _check_shaping(shaping, reach)
    check_observation(observation)

    def make() -> gym.Env:
        env = RealRT1Env(task=task, horizon=horizon)
        env = TrueSuccessProbability(env) if shaping or reach else env
        return StateObservation(env) if observation == "state" else env

    monitored = VecMonitor(DummyVecEnv([make] * num_envs))
    shaped = VecShaped(monitored, shaping, reach) if shaping or reach else monitored
    return shaped if observation == "state" else VecFrames(shaped, frame_size)


def _check_shaping(shaping: float, reach: float) -> None:
    if shaping < 0 or reach < 0:
        raise ValueError(f"shaping and reach are weights >= 0, got {shaping} and {reach}")


def real_start_states(episodes: int, task: str | None = None, run: int = EVAL_SEED_RUN,
                      first: int = 0) -> list[tuple[str, int]]:
    """(task, env seed) of held-out real start states: seeds run * 1_000_000 + i for i from `first`, tasks in turn
    unless `task`."""
    if task is not None and task not in TASKS:
        raise ValueError(f"unknown task {task!r}: use one of {TASKS}")
    return [(task or TASKS[i % len(TASKS)], run * SEEDS_PER_RUN + i) for i in range(first, first + episodes)]


def check_held_out(checkpoint: str | os.PathLike, starts: list[tuple[str, int]]) -> None:
    """Raise if a real start state is one the learned simulator starts from (scores would not be held out)."""
    shared = set(load_initial_states(RobotWorldModel.resolve(checkpoint)).seeds.tolist()) & {s for _, s in starts}
    if shared:
        raise ValueError(f"real evaluation seeds {sorted(shared)[:5]} are initial states of {checkpoint}; "
                         "pick another evaluation seed run")


def evaluate_in_real(model: BaseAlgorithm, episodes: int = 16, task: str | None = None, horizon: int = DEFAULT_HORIZON,
                     run: int = EVAL_SEED_RUN, first: int = 0) -> dict[str, float]:
    """Score an SB3 model (deterministic actions on frames at its own size, or on the true state for a model trained
    on the state) in the real tabletop from held-out starts (`real_start_states(episodes, task, run, first)`).

    Returns `success_rate`, `mean_return` (the real reward: 1 on the success step), `mean_length` and `episodes`.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    act = sb3_real_actor(model)
    envs: dict[str, RealRT1Env] = {}
    outcomes = []
    try:
        for name, seed in real_start_states(episodes, task, run, first):
            env = envs.setdefault(name, RealRT1Env(task=name, horizon=horizon))
            outcomes.append(real_rollout(env, seed, act))
    finally:
        for env in envs.values():
            env.close()
    successes = np.array([o.success for o in outcomes], dtype=float)
    return {"success_rate": float(successes.mean()), "mean_return": float(successes.mean()),
            "mean_length": float(np.mean([o.steps for o in outcomes])), "episodes": episodes}


def evaluate_in_learned(model: BaseAlgorithm, checkpoint: str | os.PathLike, episodes: int = 16, task: str | None = None,
                        horizon: int = DEFAULT_HORIZON, run: int = EVAL_SEED_RUN, first: int = 0, *,
                        precision: str = "float32", observation: str = "frame", num_envs: int = 16,
                        seed: int = 0) -> float:
    """`evaluate_in_real`'s held-out starts in the learned simulator of `checkpoint`, from each start's real first
    frame and true state, the model acting greedily: the share of episodes the simulator pays a success.
    Beside the real score, it says how far the simulator is from the real env on this agent's own play."""
    venv = RT1WorldVectorEnv(num_envs=min(episodes, num_envs), checkpoint=checkpoint, horizon=horizon, task=task,
                             autoreset_mode=AutoresetMode.DISABLED, precision=precision, observation=observation)
    try:
        rows = venv.sim.add_starts(real_initial_states(real_start_states(episodes, task, run, first)))
        actor = sb3_actor(model)
        results = learned_rollouts(venv, [Job(int(row), actor=actor) for row in rows], seed)
    finally:
        venv.close()
    return float(np.mean([success for success, _, _ in results]))

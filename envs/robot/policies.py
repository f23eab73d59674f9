"""Scripted policies for the tabletop tasks, with a skill knob that makes a ladder of policies.

A policy reads the true state from `info` (not the frame) and returns RT-1's 7-d action. Skill 1 is the
expert (59-60 of 60 seeds per task under the locked MuJoCo). Lower skill adds, with d = 1 - skill: Gaussian action noise of
std 0.2 d; a delay (1-3 steps holding still) starting with probability 0.4 d per step; and, once per
episode with probability 0.6 d, a wrong target: the drawer moved the wrong way, the wrong object pushed
onto the target, or the object pushed near the wrong one. Measured success (30 seeds per cell, see
bench/robot_env.py): about 100% / 90% / 65% / 30% at skill 1.0 / 0.7 / 0.4 / 0.1.
"""

import gymnasium as gym
import numpy as np

from envs.robot.env import MAX_TRANSLATION, MAX_YAW
from envs.robot.scene import (
    CABINET_POS,
    FINGER_HALF_THICKNESS,
    FINGER_PAD_HALF_WIDTH,
    GRIPPER_YAW_LIMIT,
    HANDLE_OFFSET,
    OBJECT_HALF_SIZE,
    OBJECT_NAMES,
)
from envs.robot.tasks import TASKS, Task

TRAVEL_Z = 0.23
"""Palm height (m) for moves above everything: fingertips clear the cabinet top (0.135 m)."""
PUSH_TRAVEL_Z = 0.16
"""Palm height (m) for moves between pushes: fingertips 2 cm above the objects."""
PUSH_Z = 0.096
"""Palm height (m) for pushing: fingertips 6 mm above the table."""
GRASP_Z = 0.12
"""Palm height (m) that puts the drawer handle between the fingers, below the palm."""
HANDLE_X_OFFSET = -0.008
"""Palm x relative to the handle: the finger nearer the drawer keeps clear of its front."""
PUSHER_HALF_DEPTH = 2 * FINGER_HALF_THICKNESS
"""Half depth (m) of the closed fingers along the push (the gripper's x axis)."""
PRE_PUSH_GAP = 0.035
"""Gap (m) between pushing face and object before a push starts."""
PUSH_STEP = 0.024
"""Most the pushing face advances per step (m): slower than free moves, so objects slide without toppling."""
DETOUR_ANGLES = (0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5)
"""Push directions tried, in radians from straight to the goal, when another object sits where the fingers go."""
PATH_HALF_WIDTH = 0.06
"""Another object closer than this (m) to a push's straight path is in the way: two half widths and a margin."""
PASS_DISTANCE = 0.1
"""How far beside an object in the way (m) the pushed object goes around it."""
NEAR_GAP = 0.06
"""move_near aims object A's centre this far (m) from object B's, inside tasks.NEAR_DISTANCE."""
MAX_NOISE_STD = 0.2
"""Action noise std at skill 0."""
MAX_DELAY_PROB = 0.4
"""Per-step probability of starting a delay at skill 0."""
MAX_WRONG_TARGET_PROB = 0.6
"""Per-episode probability of a wrong target at skill 0."""


def _towards(delta: np.ndarray, speed: float = 1.0) -> np.ndarray:
    """World-vector action that covers `delta` (m), capped at `speed` times the full step."""
    action = delta / MAX_TRANSLATION
    norm = np.linalg.norm(action)
    return action * (speed / norm) if norm > speed else action


def _yaw_error(yaw: float, desired: float) -> float:
    """Rotation (rad) to the nearest reachable angle equivalent to `desired` under the fingers' half-turn symmetry."""
    candidates = desired + np.pi * np.arange(-2, 3)
    reachable = candidates[np.abs(candidates) <= GRIPPER_YAW_LIMIT]
    return float(reachable[np.argmin(np.abs(reachable - yaw))] - yaw)


def _action(world: np.ndarray, yaw: float, closed: bool) -> np.ndarray:
    """RT-1 action from a world_vector action, a yaw action (both in [-1, 1] units) and the gripper state."""
    return np.array([*world, 0.0, 0.0, yaw, 1.0 if closed else -1.0])


def drawer_action(info: dict, pull: bool) -> np.ndarray:
    """Expert for the drawer: above the handle, down around it, close the fingers, then pull or push."""
    gripper = info["gripper_pos"]
    handle = info["handle_pos"]
    yaw = np.clip(_yaw_error(info["gripper_yaw"], 0.0) / MAX_YAW, -1.0, 1.0)
    grasp = np.array([handle[0] + HANDLE_X_OFFSET, handle[1], GRASP_Z])
    error = grasp - gripper
    lowered = gripper[2] < GRASP_Z + 0.015
    around_handle = -0.045 < gripper[0] - handle[0] < 0.012 and abs(error[1]) < 0.02
    if lowered and around_handle:
        if info["gripper_closedness"] < 0.5:
            return _action(_towards(np.array([0.0, 0.0, error[2]])), yaw, closed=True)
        return _action(np.array([-0.6 if pull else 0.6, error[1] / MAX_TRANSLATION, 0.0]), yaw, closed=True)
    if lowered:
        return _action(_towards(np.array([0.0, 0.0, TRAVEL_Z - gripper[2]])), 0.0, closed=False)
    if np.linalg.norm(error[:2]) > 0.01 or abs(yaw) * MAX_YAW > 0.1:
        return _action(_towards(np.array([error[0], error[1], TRAVEL_Z - gripper[2]])), yaw, closed=False)
    return _action(_towards(error), yaw, closed=False)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-9)


def _rotate(u: np.ndarray, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([c * u[0] - s * u[1], s * u[0] + c * u[1]])


def _pre_push(obj: np.ndarray, u: np.ndarray) -> np.ndarray:
    return obj - u * (OBJECT_HALF_SIZE + PUSHER_HALF_DEPTH + PRE_PUSH_GAP)


def _blocked(info: dict, index: int, u: np.ndarray) -> bool:
    """Would the closed fingers, lowered behind object `index` to push it along u, land on another object?"""
    others = np.delete(info["object_pos"][:, :2], index, axis=0) - _pre_push(info["object_pos"][index, :2], u)
    n = np.array([-u[1], u[0]])
    clearance = OBJECT_HALF_SIZE * np.sqrt(2) + 0.005
    across = np.abs(others @ n) < FINGER_PAD_HALF_WIDTH + clearance
    along = np.abs(others @ u) < PUSHER_HALF_DEPTH + clearance
    return bool((across & along).any())


def push_direction(info: dict, index: int, goal: np.ndarray) -> np.ndarray:
    """Unit push direction: straight to the goal, or the least detour whose pre-push spot is free."""
    straight = _unit(goal - info["object_pos"][index, :2])
    for angle in DETOUR_ANGLES:
        u = _rotate(straight, angle)
        if not _blocked(info, index, u):
            return u
    return straight


def _push_lane(info: dict, index: int, u: np.ndarray) -> tuple[float, float, float, bool]:
    """Yaw error, and the gripper's offsets along / across u from the object; True when lowered behind it."""
    gripper = info["gripper_pos"]
    relative = gripper[:2] - info["object_pos"][index, :2]
    along, lateral = relative @ u, relative @ np.array([-u[1], u[0]])
    # A finger's 5 cm pad faces along the gripper's x axis: push along it.
    yaw_error = _yaw_error(info["gripper_yaw"], np.arctan2(u[1], u[0]))
    contact = OBJECT_HALF_SIZE + PUSHER_HALF_DEPTH
    behind = -contact - PRE_PUSH_GAP - 0.02 < along < -contact + 0.01 and abs(lateral) < 0.02
    ready = gripper[2] < PUSH_Z + 0.02 and behind and abs(yaw_error) < 0.3
    return yaw_error, along, lateral, ready


def via_point(info: dict, index: int, goal: np.ndarray) -> np.ndarray:
    """Where to push object `index` first: beside the nearest other object on its straight path to `goal`, or `goal`.

    Pushing through another object shoves both, and can push a whole row off the table.
    """
    obj = info["object_pos"][index, :2]
    u = _unit(goal - obj)
    n = np.array([-u[1], u[0]])
    others = np.delete(info["object_pos"][:, :2], index, axis=0) - obj
    along, across = others @ u, others @ n
    in_path = (along > 0.02) & (along < float(np.linalg.norm(goal - obj))) & (np.abs(across) < PATH_HALF_WIDTH)
    if not in_path.any():
        return goal
    nearest = np.flatnonzero(in_path)[np.argmin(along[in_path])]
    side = -1.0 if across[nearest] > 0 else 1.0
    return obj + others[nearest] + n * side * PASS_DISTANCE


def push_action(info: dict, index: int, goal: np.ndarray) -> np.ndarray:
    """Expert for pushing object `index` to `goal` (xy): get behind it at table height, face it, push."""
    gripper = info["gripper_pos"]
    obj = info["object_pos"][index, :2]
    goal = via_point(info, index, goal)
    distance = float(np.linalg.norm(goal - obj))
    u = _unit(goal - obj)
    yaw_error, along, lateral, ready = _push_lane(info, index, u)
    if not ready:
        u = push_direction(info, index, goal)
        yaw_error, along, lateral, ready = _push_lane(info, index, u)
    yaw = np.clip(yaw_error / MAX_YAW, -1.0, 1.0)
    if ready:
        contact = OBJECT_HALF_SIZE + PUSHER_HALF_DEPTH
        advance = np.clip(-contact + min(distance, 0.04) - along, 0.0, PUSH_STEP)
        world = np.array([*(u * advance - np.array([-u[1], u[0]]) * lateral), PUSH_Z - gripper[2]])
        return _action(world / MAX_TRANSLATION, yaw, closed=True)
    error = _pre_push(obj, u) - gripper[:2]
    if np.linalg.norm(error) < 0.015 and abs(yaw_error) < 0.15:
        return _action(_towards(np.array([*error, PUSH_Z - gripper[2]])), yaw, closed=True)
    if gripper[2] < PUSH_Z + 0.02 and np.linalg.norm(error) < 0.03 and abs(yaw_error) < 0.3:
        return _action(_towards(np.array([*error, PUSH_Z - gripper[2]])), yaw, closed=True)
    if gripper[2] < PUSH_TRAVEL_Z - 0.015:
        # Straight up without turning: turning the 5 cm pads among the objects would sweep them through one.
        return _action(_towards(np.array([0.0, 0.0, PUSH_TRAVEL_Z - gripper[2]])), 0.0, closed=True)
    return _action(_towards(np.array([*error, PUSH_TRAVEL_Z - gripper[2]])), yaw, closed=True)


def reach_point(task: Task, object_pos: np.ndarray, drawer_qpos: np.ndarray, target_xy: np.ndarray) -> np.ndarray:
    """Where the expert's palm starts the task's work, for a batch of states (object positions (N, n, 3), drawer
    joints (N,), target centres (N, 2)) -> (N, 3): around the drawer handle at grasp height for the drawer tasks;
    for move_near and push_to_target, at push height behind object A on its straight line to object B or the target.
    The distance to it is a reach term for shaping an agent's reward (`agents.robot.VecShaped`): the success margin
    alone gives no gradient until the drawer or the object moves, which PPO rarely brings about by chance."""
    object_pos, drawer_qpos = np.asarray(object_pos, np.float64), np.asarray(drawer_qpos, np.float64)
    if task.name in ("open_drawer", "close_drawer"):
        handle_x = CABINET_POS[0] - HANDLE_OFFSET - drawer_qpos
        return np.stack([handle_x + HANDLE_X_OFFSET, np.full_like(handle_x, CABINET_POS[1]),
                         np.full_like(handle_x, GRASP_Z)], axis=-1)
    a = object_pos[:, task.object_a, :2]
    goal = object_pos[:, task.object_b, :2] if task.name == "move_near" else np.asarray(target_xy, np.float64)
    u = (goal - a) / np.maximum(np.linalg.norm(goal - a, axis=-1, keepdims=True), 1e-9)
    return np.concatenate([_pre_push(a, u), np.full((len(a), 1), PUSH_Z)], axis=-1)


def near_goal(info: dict, a: int, b: int) -> np.ndarray:
    """Where move_near pushes object a: NEAR_GAP short of object b, on the line from a to b."""
    pa, pb = info["object_pos"][a, :2], info["object_pos"][b, :2]
    return pb - (pb - pa) / max(float(np.linalg.norm(pb - pa)), 1e-6) * NEAR_GAP


class ScriptedPolicy:
    """Callable `policy(obs, info) -> action`; draws its per-episode choices when info["step"] is 0."""

    def __init__(self, task: str, skill: float, seed: int):
        if task != "random" and task not in TASKS:
            raise ValueError(f"unknown task {task!r}: use one of {TASKS} or 'random' (follow info['task'])")
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"skill must be in [0, 1] (1 = expert), got {skill}")
        self.task = task
        self.skill = skill
        # A stream of its own: gymnasium seeds the env with SeedSequence(seed), and the same seed is natural here.
        self.rng = np.random.default_rng([seed, 1])
        self.noise_std = MAX_NOISE_STD * (1.0 - skill)
        self.delay_prob = MAX_DELAY_PROB * (1.0 - skill)
        self.wrong_target_prob = MAX_WRONG_TARGET_PROB * (1.0 - skill)
        self._wrong = False
        self._other = -1
        self._delay = 0
        self._last = np.zeros(7)

    def __call__(self, obs: np.ndarray, info: dict) -> np.ndarray:
        if self.task != "random" and info["task"] != self.task:
            raise ValueError(f"policy made for {self.task!r} got an episode of {info['task']!r}")
        if info["step"] == 0:
            self._new_episode(info)
        if self._delay == 0 and self.rng.random() < self.delay_prob:
            self._delay = int(self.rng.integers(1, 4))
        if self._delay > 0:
            self._delay -= 1
            action = np.zeros(7)
            action[6] = self._last[6]
        else:
            action = self._expert(info)
            action = action + self.rng.normal(0.0, self.noise_std, 7) if self.noise_std > 0 else action
        self._last = np.clip(action, -1.0, 1.0)
        return self._last.astype(np.float32)

    def _new_episode(self, info: dict) -> None:
        self._wrong = bool(self.rng.random() < self.wrong_target_prob)
        self._delay = 0
        self._last = np.zeros(7)
        involved = {info["object_a"], info["object_b"]}
        others = [i for i in range(len(OBJECT_NAMES)) if i not in involved]
        self._other = int(self.rng.choice(others)) if others else -1

    def _expert(self, info: dict) -> np.ndarray:
        task, a, b = info["task"], info["object_a"], info["object_b"]
        if task in ("open_drawer", "close_drawer"):
            return drawer_action(info, pull=(task == "open_drawer") != self._wrong)
        if task == "move_near":
            return push_action(info, a, near_goal(info, a, self._other if self._wrong else b))
        return push_action(info, self._other if self._wrong else a, info["target_pos"][:2])


AXES = ("x", "y", "z", "roll", "pitch", "yaw", "gripper")
"""RT-1's seven action dimensions: world_vector, rotation_delta, gripper_closedness."""
TRIVIAL_POLICIES = ("no-op", *(f"{sign}{axis}" for axis in AXES for sign in "+-"))
"""Open-loop policies that do no task on purpose: no action, or full scale on one axis alone (`trivial_action`). An
agent that a learned simulator pays for these has found its exploit (`rlvr-gym probe rt1`)."""


def trivial_action(name: str) -> np.ndarray:
    """The constant action of a TRIVIAL_POLICIES name: zeros, or +-1 on the named axis."""
    if name not in TRIVIAL_POLICIES:
        raise ValueError(f"unknown trivial policy {name!r}: use one of {TRIVIAL_POLICIES}")
    action = np.zeros(len(AXES), np.float32)
    if name != "no-op":
        action[AXES.index(name[1:])] = 1.0 if name[0] == "+" else -1.0
    return action


def make_scripted_policy(task: str, skill: float = 1.0, seed: int = 0) -> ScriptedPolicy:
    """A scripted policy for `task` (or "random": whatever info["task"] says) at `skill` in [0, 1], 1 = expert."""
    return ScriptedPolicy(task, skill, seed)


def rollout(env: gym.Env, policy: ScriptedPolicy, seed: int) -> tuple[list[np.ndarray], list[np.ndarray], list[dict]]:
    """One episode from `env.reset(seed=seed)` until it ends: frames (the reset frame first), actions, infos."""
    frame, info = env.reset(seed=seed)
    frames, actions, infos = [frame], [], [info]
    done = False
    while not done:
        actions.append(policy(frame, info))
        frame, _, terminated, truncated, info = env.step(actions[-1])
        frames.append(frame)
        infos.append(info)
        done = terminated or truncated
    return frames, actions, infos

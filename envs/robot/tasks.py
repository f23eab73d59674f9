"""RT-1-style tasks: what an episode asks, how its start is drawn from the seed, and when it has succeeded."""

from dataclasses import dataclass

import numpy as np

from envs.robot.scene import DRAWER_TRAVEL, OBJECT_HALF_SIZE, OBJECT_NAMES, TARGET_RADIUS

TASKS = ("open_drawer", "close_drawer", "move_near", "push_to_target")
DRAWER_OPEN = 0.09
"""Drawer joint (m) at or above which the drawer is open; its travel is 0.13 m."""
DRAWER_CLOSED = 0.015
"""Drawer joint (m) at or below which the drawer is closed."""
NEAR_DISTANCE = 0.09
"""Object centres closer than this in the table plane (m) are near each other; a cube is 0.05 m wide."""
ON_TARGET_DISTANCE = TARGET_RADIUS
"""An object whose centre is within this of the target's centre (m) is on it: the marker's radius, 3.5 cm."""
OBJECT_REGION_LOW = np.array([-0.26, -0.15])
OBJECT_REGION_HIGH = np.array([-0.04, 0.15])
MIN_OBJECT_SPACING = 0.12
MIN_TRAVEL = 0.15
"""Start distance (m) between what move_near / push_to_target must bring together, so neither starts solved."""


@dataclass(frozen=True)
class Task:
    """One episode's task; object indices refer to OBJECT_NAMES and are -1 where the task has none."""

    name: str
    object_a: int = -1
    object_b: int = -1

    @property
    def instruction(self) -> str:
        if self.name == "open_drawer":
            return "open the drawer"
        if self.name == "close_drawer":
            return "close the drawer"
        if self.name == "move_near":
            return f"move the {OBJECT_NAMES[self.object_a]} near the {OBJECT_NAMES[self.object_b]}"
        return f"push the {OBJECT_NAMES[self.object_a]} to the yellow target"


@dataclass
class Layout:
    """An initial state: gripper palm pose, objects on the table, drawer opening, target marker."""

    gripper_pos: np.ndarray
    gripper_yaw: float
    object_xy: np.ndarray
    object_yaw: np.ndarray
    drawer_qpos: float
    target_xy: np.ndarray


def sample_task(name: str, rng: np.random.Generator) -> Task:
    """Draw which objects the task is about."""
    if name in ("open_drawer", "close_drawer"):
        return Task(name)
    a, b = rng.choice(len(OBJECT_NAMES), size=2, replace=False)
    return Task(name, int(a), int(b) if name == "move_near" else -1)


def sample_layout(task: Task, rng: np.random.Generator) -> Layout:
    """Draw a start state for the task: objects and target marker spaced apart, nothing already solved."""
    if task.name == "open_drawer":
        drawer = rng.uniform(0.0, 0.02)
    elif task.name == "close_drawer":
        drawer = rng.uniform(DRAWER_OPEN, DRAWER_TRAVEL)
    else:
        drawer = rng.uniform(0.0, DRAWER_TRAVEL)
    n_points = len(OBJECT_NAMES) + 1
    while True:
        points = rng.uniform(OBJECT_REGION_LOW, OBJECT_REGION_HIGH, size=(n_points, 2))
        gaps = np.linalg.norm(points[:, None] - points[None], axis=-1) + np.eye(n_points)
        if gaps.min() < MIN_OBJECT_SPACING:
            continue
        if task.name == "move_near" and gaps[task.object_a, task.object_b] < MIN_TRAVEL:
            continue
        if task.name == "push_to_target" and gaps[task.object_a, -1] < MIN_TRAVEL:
            continue
        break
    return Layout(
        gripper_pos=rng.uniform([-0.2, -0.15, 0.2], [0.0, 0.1, 0.26]),
        gripper_yaw=float(rng.uniform(-0.6, 0.6)),
        object_xy=points[: len(OBJECT_NAMES)],
        object_yaw=rng.uniform(-np.pi, np.pi, size=len(OBJECT_NAMES)),
        drawer_qpos=float(drawer),
        target_xy=points[-1],
    )


def is_success(task: Task, object_pos: np.ndarray, drawer_qpos: float, target_pos: np.ndarray) -> bool:
    """The task's success test on the true state (object positions (n, 3), drawer joint, target centre): its
    `success_margin` is positive."""
    margin = success_margin(task, np.asarray(object_pos)[None], np.array([drawer_qpos]), np.asarray(target_pos)[None, :2])
    return bool(margin[0] > 0)


def success_margin(task: Task, object_pos: np.ndarray, drawer_qpos: np.ndarray, target_xy: np.ndarray) -> np.ndarray:
    """How far (m) each of a batch of states is inside the task's success region (> 0 succeeded): object positions
    (N, n, 3), drawer joints (N,), target centres (N, 2). The drawer open, or closed; the object on the table and
    near the other one, or on the target marker."""
    object_pos, drawer_qpos, target_xy = np.asarray(object_pos), np.asarray(drawer_qpos), np.asarray(target_xy)
    if task.name == "open_drawer":
        return drawer_qpos - DRAWER_OPEN
    if task.name == "close_drawer":
        return DRAWER_CLOSED - drawer_qpos
    a = object_pos[:, task.object_a]
    on_table = a[:, 2] - OBJECT_HALF_SIZE / 2
    if task.name == "move_near":
        return np.minimum(on_table, NEAR_DISTANCE - np.linalg.norm(a[:, :2] - object_pos[:, task.object_b, :2], axis=-1))
    return np.minimum(on_table, ON_TARGET_DISTANCE - np.linalg.norm(a[:, :2] - target_xy, axis=-1))


def all_tasks() -> list[Task]:
    """Every task an episode can ask: both drawer tasks and each choice of objects for the other two."""
    n = len(OBJECT_NAMES)
    return ([Task("open_drawer"), Task("close_drawer")]
            + [Task("move_near", a, b) for a in range(n) for b in range(n) if a != b]
            + [Task("push_to_target", a) for a in range(n)])


def task_from_instruction(instruction: str) -> Task:
    """The task whose instruction this is (`Task.instruction` read back)."""
    for task in all_tasks():
        if task.instruction == instruction:
            return task
    raise ValueError(f"{instruction!r} is none of the tabletop's instructions, e.g. {all_tasks()[2].instruction!r}")


def task_and_layout(name: str, seed: int) -> tuple[Task, Layout]:
    """The task and start state `RealRT1Env(task=name).reset(seed=seed)` draws."""
    from gymnasium.utils import seeding

    rng, _ = seeding.np_random(seed)
    task = sample_task(name, rng)
    return task, sample_layout(task, rng)

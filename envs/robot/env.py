"""RealRT1Env: the MuJoCo tabletop as a Gymnasium env with RT-1's action interface and 64x64 frames."""

import os
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

from envs.robot.gl_backend import HELP as GL_HELP
from envs.robot.scene import (
    FINGER_TRAVEL,
    IMAGE_SIZE,
    GRIPPER_HIGH,
    GRIPPER_LOW,
    GRIPPER_YAW_LIMIT,
    OBJECT_BODIES,
    OBJECT_HALF_SIZE,
    TARGET_HALF_HEIGHT,
    load_model,
)
from envs.robot.tasks import TASKS, Layout, Task, is_success, sample_layout, sample_task

MAX_TRANSLATION = 0.07
"""Palm displacement (m) per step for world_vector = +-1."""
MAX_YAW = 0.3
"""Yaw change (rad) per step for rotation_delta[2] = +-1."""
FRAME_SKIP = 20
"""Physics steps (5 ms each) per env step: 0.1 s, long enough for the palm to reach its new target."""
DEFAULT_HORIZON = 50


class RealRT1Env(gym.Env):
    """A tabletop with a drawer, three objects and a parallel gripper, controlled like RT-1 and seen from a camera.

    ## Description
    A MuJoCo scene: a table, a cabinet with a drawer (slide joint, handle facing -x), a red cube, a green
    cube and a blue can, a flat yellow target marker (push_to_target's goal, a distractor otherwise) and a
    parallel gripper on a wrist rod. The gripper is position-controlled: each step sets targets for its x, y, z, yaw and
    finger joints, then the physics runs FRAME_SKIP = 20 steps of 5 ms (0.1 s, 10 Hz). Tasks, in RT-1's
    spirit: `open_drawer`, `close_drawer`, `move_near` (push object A near object B) and `push_to_target`
    (push object A onto the marker); `task="random"` draws one per reset.

    The control rate is chosen so that consecutive frames differ: a full-scale world_vector moves the
    palm 7 cm, which is about 7.5 px sideways, 6 px in depth and 4.5 px vertically at 64x64, as RT-1's
    3 Hz frames do. (A world model trained on frames that move 2-3 px per step learns to copy the last frame.)

    ## Action Space
    `Box(-1, 1, (7,), float32)`, RT-1's end-effector action; values outside [-1, 1] are clipped:
    - `[0:3]` world_vector: palm displacement along world x (right), y (away from the camera) and z (up),
      times MAX_TRANSLATION = 0.07 m, from the palm's current position; the target is clipped to the
      workspace x in [-0.34, 0.24], y in [-0.24, 0.24], z in [0.094, 0.30] m (table top at z = 0).
    - `[3:6]` rotation_delta (roll, pitch, yaw): only yaw acts, times MAX_YAW = 0.3 rad, clipped to
      [-pi, pi]; roll and pitch are ignored (the gripper always points down).
    - `[6]` gripper_closedness: absolute, -1 fully open (5 cm between the fingers) to +1 fully closed.
    An action of the wrong shape, or with NaN or inf, raises ValueError.

    ## Observation Space
    `Box(0, 255, (64, 64, 3), uint8)`: the RGB frame from the fixed front camera, no shadows, no MSAA.

    ## Rewards
    Sparse: 1.0 on the step that reaches success, 0.0 otherwise.

    ## Starting State
    Drawn from the reset seed: the task's objects; positions of the objects and the target marker (at
    least 12 cm apart, in a region clear of the drawer) and object yaws; the palm 20-26 cm above the table,
    yaw in [-0.6, 0.6] rad, fingers open; the drawer nearly closed (open_drawer), open (close_drawer) or
    anywhere (other tasks). What a task must bring together starts at least 15 cm apart.

    ## Episode End
    Terminated when the task succeeds (`envs.robot.tasks.is_success` on the true state: drawer joint
    >= 9 cm open / <= 1.5 cm closed, object centres < 9 cm apart, object centre within the marker's 3.5 cm);
    truncated after `horizon` steps.

    `info` carries the true state: `task`, `instruction`, `object_a`, `object_b` (indices into
    OBJECT_NAMES, -1 if unused), `gripper_pos` (3,), `gripper_yaw`, `gripper_closedness` (measured, 0 open
    to 1 closed), `object_pos` (3, 3), `drawer_qpos` (m, 0 closed), `handle_pos` (3,), `target_pos` (3,),
    `success` (and `is_success`, the key SB3 reads), `step`.

    ## Arguments
    - `task`: one of TASKS or "random" (default).
    - `horizon`: steps before truncation (default 50; experts need 9-36).
    - `render_mode`: None or "rgb_array"; `render()` returns the current observation frame.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, task: str = "random", horizon: int = DEFAULT_HORIZON, render_mode: str | None = None):
        if task != "random" and task not in TASKS:
            raise ValueError(f"unknown task {task!r}: use one of {TASKS} or 'random'")
        if horizon < 1:
            raise ValueError(f"horizon must be a positive number of steps, got {horizon}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.task_name = task
        self.horizon = horizon
        self.render_mode = render_mode
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.observation_space = gym.spaces.Box(0, 255, (IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)

        self.model = load_model()
        self.data = mujoco.MjData(self.model)
        self._renderer = _make_renderer(self.model)
        self._camera = self.model.camera("front").id
        self._gripper_qpos = np.array([self.model.joint(f"gripper_{a}").qposadr[0] for a in ("x", "y", "z", "yaw")])
        self._finger_qpos = np.array([self.model.joint(f"finger_{s}").qposadr[0] for s in ("left", "right")])
        self._drawer_qpos = self.model.joint("drawer").qposadr[0]
        self._object_qpos = np.array([self.model.joint(name).qposadr[0] for name in OBJECT_BODIES])
        self._object_bodies = np.array([self.model.body(name).id for name in OBJECT_BODIES])
        self._handle = self.model.geom("handle").id
        self._target = self.model.geom("target").id
        self._task: Task | None = None
        self._steps = 0
        self._frame = np.zeros(self.observation_space.shape, np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        name = self.task_name if self.task_name != "random" else TASKS[self.np_random.integers(len(TASKS))]
        self._task = sample_task(name, self.np_random)
        self._apply_layout(sample_layout(self._task, self.np_random))
        self._steps = 0
        self._frame = self._render_frame()
        return self._frame.copy(), self._info()

    def step(self, action):
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (7,):
            raise ValueError(
                f"action must have shape (7,) = world_vector (3), rotation_delta (3), gripper_closedness (1); "
                f"got shape {action.shape}"
            )
        if not np.all(np.isfinite(action)):
            raise ValueError(f"action must be finite, got {action}")
        action = np.clip(action, -1.0, 1.0)
        qpos = self.data.qpos
        position = np.clip(qpos[self._gripper_qpos[:3]] + action[:3] * MAX_TRANSLATION, GRIPPER_LOW, GRIPPER_HIGH)
        yaw = np.clip(qpos[self._gripper_qpos[3]] + action[5] * MAX_YAW, -GRIPPER_YAW_LIMIT, GRIPPER_YAW_LIMIT)
        fingers = (action[6] + 1.0) / 2.0 * FINGER_TRAVEL
        self.data.ctrl[:] = [*position, yaw, fingers, fingers]
        mujoco.mj_step(self.model, self.data, nstep=FRAME_SKIP)
        self._steps += 1
        self._frame = self._render_frame()
        info = self._info()
        terminated = info["success"]
        truncated = self._steps >= self.horizon and not terminated
        return self._frame.copy(), float(terminated), terminated, truncated, info

    def render(self):
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode: make the env with render_mode='rgb_array'")
            return None
        return self._frame.copy()

    def close(self):
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def _apply_layout(self, layout: Layout) -> None:
        mujoco.mj_resetData(self.model, self.data)
        qpos = self.data.qpos
        qpos[self._gripper_qpos] = [*layout.gripper_pos, layout.gripper_yaw]
        qpos[self._drawer_qpos] = layout.drawer_qpos
        for adr, xy, yaw in zip(self._object_qpos, layout.object_xy, layout.object_yaw):
            qpos[adr : adr + 7] = [*xy, OBJECT_HALF_SIZE, np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)]
        self.data.ctrl[:] = [*layout.gripper_pos, layout.gripper_yaw, 0.0, 0.0]
        self.model.geom_pos[self._target] = [*layout.target_xy, TARGET_HALF_HEIGHT]
        mujoco.mj_forward(self.model, self.data)

    def _render_frame(self) -> np.ndarray:
        self._renderer.update_scene(self.data, camera=self._camera)
        return self._renderer.render()

    def _info(self) -> dict[str, Any]:
        qpos = self.data.qpos
        object_pos = self.data.xpos[self._object_bodies].copy()
        drawer = float(qpos[self._drawer_qpos])
        target_pos = self.model.geom_pos[self._target].copy()
        success = is_success(self._task, object_pos, drawer, target_pos)
        return {
            "task": self._task.name,
            "instruction": self._task.instruction,
            "object_a": self._task.object_a,
            "object_b": self._task.object_b,
            "gripper_pos": qpos[self._gripper_qpos[:3]].copy(),
            "gripper_yaw": float(qpos[self._gripper_qpos[3]]),
            "gripper_closedness": float(qpos[self._finger_qpos].mean() / FINGER_TRAVEL),
            "object_pos": object_pos,
            "drawer_qpos": drawer,
            "handle_pos": self.data.geom_xpos[self._handle].copy(),
            "target_pos": target_pos,
            "success": success,
            "is_success": success,
            "step": self._steps,
        }


def _make_renderer(model: mujoco.MjModel) -> mujoco.Renderer:
    try:
        return mujoco.Renderer(model, IMAGE_SIZE, IMAGE_SIZE)
    except Exception as error:
        if "MUJOCO_GL" not in os.environ:
            cause = "mujoco was imported before envs.robot with MUJOCO_GL unset, so it chose GLFW (needs a display)"
        else:
            cause = f"MUJOCO_GL={os.environ['MUJOCO_GL']} failed: {error}"
        raise RuntimeError(f"MuJoCo cannot render offscreen: {cause}. {GL_HELP}") from error

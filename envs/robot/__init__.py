"""The real robot environment: a MuJoCo tabletop with RT-1's action interface, its tasks and scripted policies.

`import envs.robot` registers `RealRT1-v0` (kwargs `task=`, `horizon=`, `render_mode=`).
"""

from envs.robot.gl_backend import choose_gl_backend

# MuJoCo reads MUJOCO_GL once, when it is first imported (by envs.robot.env below).
choose_gl_backend()

import gymnasium as gym  # noqa: E402

from envs.robot.env import RealRT1Env  # noqa: E402
from envs.robot.policies import ScriptedPolicy, make_scripted_policy, rollout  # noqa: E402
from envs.robot.scene import OBJECT_NAMES  # noqa: E402
from envs.robot.tasks import TASKS, Task, is_success  # noqa: E402

ENV_ID = "RealRT1-v0"


def register_envs() -> None:
    """Register RealRT1-v0 with gymnasium; ids already registered are left as they are."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="envs.robot.env:RealRT1Env", kwargs={"task": "random"})


register_envs()

__all__ = [
    "ENV_ID",
    "OBJECT_NAMES",
    "TASKS",
    "RealRT1Env",
    "ScriptedPolicy",
    "Task",
    "is_success",
    "make_scripted_policy",
    "register_envs",
    "rollout",
]

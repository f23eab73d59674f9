"""Learned simulators as Gymnasium envs; `register_envs()` (called by `import rlvr_gym`) makes their ids known.

Entry points are strings, so registering imports no torch or transformers: an env module loads only when an env is made.
"""

import gymnasium as gym

ENVS = {
    "RLVRWorld-RT1-v0": {
        "entry_point": "rlvr_gym.sim.robot:RT1WorldEnv",
        "vector_entry_point": "rlvr_gym.sim.robot:RT1WorldVectorEnv",
    },
    "RLVRWorld-TextGame-v0": {"entry_point": "rlvr_gym.sim.textgame:TextGameWorldEnv"},
    "RLVRWorld-Web-v0": {"entry_point": "rlvr_gym.sim.web:WebWorldEnv"},
}


def register_envs() -> None:
    """Register every rlvr-gym env id with gymnasium; ids already registered are left as they are."""
    for env_id, spec in ENVS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, **spec)

"""Stable-Baselines3's VecEnv API over a Gymnasium 1.x VectorEnv, so SB3 trains in a batched learned simulator.

    venv = gym.make_vec("RLVRWorld-RT1-v0", num_envs=64, vectorization_mode="vector_entry_point", checkpoint=DIR)
    model = PPO("CnnPolicy", SB3VecEnv(venv)).learn(10_000)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from stable_baselines3.common.env_util import is_wrapped
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn


def split_infos(infos: dict[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Gymnasium's vector info (arrays with `_key` masks) -> one dict per env, as SB3 expects."""
    out: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, values in infos.items():
        if key.startswith("_") and key[1:] in infos:
            continue
        mask = infos.get(f"_{key}", np.ones(num_envs, dtype=bool))
        per_env = split_infos(values, num_envs) if isinstance(values, dict) else values
        for i in np.flatnonzero(mask):
            value = per_env[i]
            out[i][key] = value.item() if isinstance(value, np.generic) else value
    return out


class SB3VecEnv(VecEnv):
    """SB3's VecEnv over a gymnasium VectorEnv in NEXT_STEP, SAME_STEP or DISABLED autoreset mode.

    SB3 wants an ended sub-env reset within the step that ended it, with the last frame in
    `info["terminal_observation"]` and `info["TimeLimit.truncated"]` set. SAME_STEP vector envs do that already
    (their `final_obs` / `final_info` become the step's info); NEXT_STEP and DISABLED ones are reset here at once
    with `reset(options={"reset_mask": ended})`, which gymnasium's vector envs accept in any mode.

    `get_attr`, `set_attr` and `env_method` use the vector env's per-sub-env `get_attr` / `set_attr` / `call`
    when it has them (SyncVectorEnv, AsyncVectorEnv); otherwise the sub-envs share the vector env's attributes
    (as in RT1WorldVectorEnv): `get_attr` returns its attribute for each index, `set_attr` sets it for all
    sub-envs at once, and `env_method` calls its method once and returns the result for each index.
    """

    def __init__(self, venv: VectorEnv):
        self.venv = venv
        self.autoreset_mode = AutoresetMode(venv.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self._actions: np.ndarray | None = None

    def reset(self) -> VecEnvObs:
        seeds = self._seeds if any(s is not None for s in self._seeds) else None
        options = self._options[0]
        if any(o != options for o in self._options):
            raise ValueError("a gymnasium VectorEnv takes one options dict for all sub-envs; set_options with a single dict")
        obs, infos = self.venv.reset(seed=seeds, options=options or None)
        self.reset_infos = split_infos(infos, self.num_envs)
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        obs, rewards, terminated, truncated, infos = self.venv.step(self._actions)
        dones = np.logical_or(terminated, truncated)
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            step_infos = split_infos({k: v for k, v in infos.items() if k.lstrip("_") not in ("final_obs", "final_info")}, self.num_envs)
            final_infos = split_infos(infos.get("final_info", {}), self.num_envs)
            out_infos = []
            for i, done in enumerate(dones):
                if done:
                    self.reset_infos[i] = step_infos[i]
                    out_infos.append({**final_infos[i], "terminal_observation": infos["final_obs"][i]})
                else:
                    out_infos.append(step_infos[i])
        else:
            out_infos = split_infos(infos, self.num_envs)
            if dones.any():
                for i in np.flatnonzero(dones):
                    out_infos[i]["terminal_observation"] = obs[i].copy()
                reset_obs, reset_infos = self.venv.reset(options={"reset_mask": dones})
                obs = np.array(obs, copy=True)
                obs[dones] = reset_obs[dones]
                for i, info in enumerate(split_infos(reset_infos, self.num_envs)):
                    if dones[i]:
                        self.reset_infos[i] = info
        for i in range(self.num_envs):
            out_infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        return obs, np.asarray(rewards, dtype=np.float32), dones, out_infos

    def close(self) -> None:
        self.venv.close()

    def get_images(self) -> Sequence[np.ndarray | None]:
        return list(self.venv.render() or [None] * self.num_envs)

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        if self._per_env("get_attr"):
            values = self.venv.unwrapped.get_attr(attr_name)
            return [values[i] for i in self._get_indices(indices)]
        value = getattr(self._shared(attr_name), attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        targets = list(self._get_indices(indices))
        if self._per_env("set_attr"):
            values = list(self.venv.unwrapped.get_attr(attr_name))
            for i in targets:
                values[i] = value
            self.venv.unwrapped.set_attr(attr_name, values)
            return
        if sorted(targets) != list(range(self.num_envs)):
            raise ValueError(f"{type(self.venv.unwrapped).__name__}'s sub-envs share {attr_name!r}: set it for all of them (indices=None)")
        setattr(self._shared(attr_name), attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        if self._per_env("call"):
            values = self.venv.unwrapped.call(method_name, *method_args, **method_kwargs)
            return [values[i] for i in self._get_indices(indices)]
        value = getattr(self._shared(method_name), method_name)(*method_args, **method_kwargs)
        return [value for _ in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        envs = getattr(self.venv.unwrapped, "envs", None)
        return [envs is not None and is_wrapped(envs[i], wrapper_class) for i in self._get_indices(indices)]

    def _per_env(self, method: str) -> bool:
        return callable(getattr(self.venv.unwrapped, method, None))

    def _shared(self, name: str) -> Any:
        """The vector env (or, when a vector wrapper lacks `name`, the env it wraps) that holds a shared attribute."""
        return self.venv if hasattr(self.venv, name) else self.venv.unwrapped

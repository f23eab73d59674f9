"""Agents for the text game: the learned simulator they train in, and the real TextWorld game they are scored in.

    env = make_sim_env("textgame-rlvr", seed=0)           # Discrete commands, Box observation, learned dynamics
    model = stable_baselines3.DQN(SlotDQNPolicy, env).learn(5_000)       # or PPO(SlotActorCriticPolicy, env)
    evaluate_in_real(model, "textgame-rlvr", episodes=16, seed=0)   # the same start states, real TextWorld

Both envs index commands and encode observations the same way (`rlvr_gym.sim.textgame`), so a policy trained in
one acts in the other unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.dqn.policies import DQNPolicy, QNetwork
from torch import nn

from envs.textworld import DEFAULT_GAME_DIR, TextWorldGame
from rlvr_gym.sim.discrete import action_mask
from rlvr_gym.sim.textgame import (
    DEFAULT_CHECKPOINT,
    DEFAULT_MAX_CANDIDATES,
    DEFAULT_MAX_STEPS,
    DEFAULT_OBS_DIM,
    SLOT_FEATURES,
    TextGameDiscreteEnv,
    TextGameDiscreteVectorEnv,
    TextGameWorldEnv,
    candidate_commands,
    command_for,
    discrete_spaces,
    draw_start,
    encode_observation,
    load_start_states,
    open_real_game,
)


class RealTextWorldDiscreteEnv(gym.Env):
    """The real TextWorld games of a checkpoint's start states, with TextGameDiscreteEnv's spaces.

    ## Description
    `reset` regenerates the game of a start state from its seed and starts it in the Inform 7 engine (checked to
    start where the recorded state does); `step` sends the command an action names. A reset seed draws the same
    start state as the learned env's reset with that seed.

    ## Action Space
    `Discrete(max_candidates)` over `candidate_commands(state)` (on real states: the game's admissible commands);
    past the end of the list it wraps around (`command_for`), as in the learned env.

    ## Observation Space
    `Box(0, 1, (obs_dim,), float32)`: `encode_observation` of the real state.

    ## Rewards
    The score gained by the command.

    ## Episode End
    Terminated when the game is won or lost; truncated after `max_steps` steps.
    `info`: `state`, `candidates`, `step`, `start_index`, `game_seed`, `objective`, `is_success` (won), `command`.

    ## Arguments
    - `checkpoint`: whose `textworld_start_states.json` to play (a shipped name or a directory).
    - `max_steps`, `max_candidates`, `obs_dim`: as the learned env and its discrete wrapper.
    - `game_dir`: where regenerated games are compiled and cached.
    """

    metadata = {"render_modes": [], "render_fps": 4}

    def __init__(
        self,
        checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
        max_steps: int = DEFAULT_MAX_STEPS,
        max_candidates: int = DEFAULT_MAX_CANDIDATES,
        obs_dim: int = DEFAULT_OBS_DIM,
        game_dir: str | os.PathLike = DEFAULT_GAME_DIR,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be a positive number of steps, got {max_steps}")
        self.observation_space, self.action_space = discrete_spaces(max_candidates, obs_dim)
        self.starts = load_start_states(checkpoint)
        self.max_steps = max_steps
        self.max_candidates = max_candidates
        self.obs_dim = obs_dim
        self.game_dir = Path(game_dir)
        self._games: dict[int, TextWorldGame] = {}
        self._game: TextWorldGame | None = None
        self._index = 0
        self._steps = 0
        self._sent: set[str] = set()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._index, _ = draw_start(self.np_random, len(self.starts), (options or {}).get("index"))
        if self._index not in self._games:
            self._games[self._index] = open_real_game(self.starts[self._index], self.game_dir)
        self._game = self._games[self._index]
        self._game.reset()
        self._steps = 0
        self._sent = set()
        return self._observation(), self._info()

    def step(self, action):
        if self._game is None:
            raise RuntimeError("call reset() before step()")
        command = command_for(action, candidate_commands(self._game.state), self.action_space)
        _, reward, done = self._game.step(command)
        self._steps += 1
        self._sent.add(command)
        truncated = not done and self._steps >= self.max_steps
        return self._observation(), reward, done, truncated, {**self._info(), "command": command}

    def action_masks(self) -> np.ndarray:
        return action_mask(candidate_commands(self._game.state) if self._game else [], self.max_candidates)

    def close(self) -> None:
        for game in self._games.values():
            game.close()
        self._games.clear()
        self._game = None

    def _observation(self) -> np.ndarray:
        state = self._game.state
        return encode_observation(state, self._game.objective, candidate_commands(state), self._steps / self.max_steps,
                                  self.obs_dim, self.max_candidates, self._sent)

    def _info(self) -> dict[str, Any]:
        state = self._game.state
        start = self.starts[self._index]
        return {
            "state": state,
            "candidates": candidate_commands(state),
            "step": self._steps,
            "start_index": self._index,
            "game_seed": start.seed,
            "objective": start.objective,
            "is_success": self._game.won,
        }


def bag_size(features_dim: int, slots: int) -> int:
    """The length of the hashed state at the head of an observation (`encode_observation`) with `slots` action slots."""
    bag = features_dim - slots * SLOT_FEATURES - 1
    if bag < 1:
        raise ValueError(f"an observation of {features_dim} values has no room for {slots} slots of {SLOT_FEATURES}")
    return bag


def state_features(x: torch.Tensor, bag: int) -> torch.Tensor:
    """The observations' state without their action slots: the hashed state and the step fraction."""
    return torch.cat([x[:, :bag], x[:, -1:]], dim=1)


class SlotScorer(nn.Module):
    """Q-values of the text games' discrete actions from the observation (`encode_observation`): one network scores
    every action slot from the state's embedding and that slot's command features, so what it learns about "take
    the key the objective names" holds at any index (as DRRN scores each candidate command with shared weights;
    an MLP over the flat observation would have to learn it once per index)."""

    def __init__(self, features_dim: int, slots: int, width: int, activation_fn: type[nn.Module] = nn.ReLU):
        super().__init__()
        self.slots = slots
        self.bag = bag_size(features_dim, slots)
        self.state = nn.Sequential(nn.Linear(self.bag + 1, width), activation_fn())
        self.score = nn.Sequential(nn.Linear(width + SLOT_FEATURES, width), activation_fn(), nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slots = x[:, self.bag : -1].reshape(len(x), self.slots, SLOT_FEATURES)
        state = self.state(state_features(x, self.bag))
        return self.score(torch.cat([state[:, None].expand(-1, self.slots, -1), slots], dim=-1)).squeeze(-1)


class SlotQNetwork(QNetwork):
    """SB3's QNetwork with a SlotScorer (width: the first entry of net_arch) as its q_net."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.q_net = SlotScorer(self.features_dim, int(self.action_space.n), self.net_arch[0], self.activation_fn)


class SlotDQNPolicy(DQNPolicy):
    """`DQN(SlotDQNPolicy, env)`: DQN for TextGameDiscreteEnv and RealTextWorldDiscreteEnv with SlotQNetwork."""

    def make_q_net(self) -> SlotQNetwork:
        net_args = self._update_features_extractor(self.net_args, features_extractor=None)
        return SlotQNetwork(**net_args).to(self.device)


class SlotCritic(nn.Module):
    """SB3's `mlp_extractor` for SlotActorCriticPolicy: the actor's latent is the observation itself (its SlotScorer
    reads the slots from it), the critic's the state's embedding (the hashed state and the step fraction): a state's
    value does not depend on the order in which the commands are listed."""

    def __init__(self, features_dim: int, slots: int, width: int, activation_fn: type[nn.Module] = nn.ReLU):
        super().__init__()
        self.bag = bag_size(features_dim, slots)
        self.state = nn.Sequential(nn.Linear(self.bag + 1, width), activation_fn(), nn.Linear(width, width),
                                   activation_fn())
        self.latent_dim_pi, self.latent_dim_vf = features_dim, width

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        return self.state(state_features(features, self.bag))


class SlotActorCriticPolicy(ActorCriticPolicy):
    """`PPO(SlotActorCriticPolicy, env)`: PPO for TextGameDiscreteEnv and RealTextWorldDiscreteEnv. The action logits
    come from a SlotScorer (one network scores every slot, as SlotDQNPolicy's Q-values do), the value from the state
    alone (SlotCritic); width: the first entry of net_arch. SB3's MlpPolicy over the same observation has to learn
    each slot on its own, and did not learn the games (docs/text_cotraining.md)."""

    def _width(self) -> int:
        arch = self.net_arch.get("pi", []) if isinstance(self.net_arch, dict) else self.net_arch
        return arch[0] if arch else 64

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = SlotCritic(self.features_dim, int(self.action_space.n), self._width(), self.activation_fn)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        self.action_net = SlotScorer(self.features_dim, int(self.action_space.n), self._width(), self.activation_fn)
        if self.ortho_init:  # as SB3 does for its own action net: a near-uniform first policy
            self.action_net.score[-1].apply(partial(self.init_weights, gain=0.01))
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)


def make_sim_env(checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT, seed: int = 0, **kwargs: Any) -> TextGameDiscreteEnv:
    """The learned text-game env for SB3 (Discrete commands, Box observation), seeded; `kwargs` go to TextGameWorldEnv."""
    env = TextGameDiscreteEnv(TextGameWorldEnv(checkpoint, **kwargs))
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def scored_games(starts: int, episodes: int, seed: int) -> list[tuple[int, int]]:
    """(start index, reset seed) of each episode `evaluate_in_real` plays: the start states in a seeded random order,
    cycling when there are fewer."""
    order = np.random.default_rng(seed).permutation(starts)
    return [(int(order[e % len(order)]), seed + e) for e in range(episodes)]


def evaluate_in_real(
    policy: Callable[[np.ndarray, dict[str, Any]], int] | Any,
    checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
    episodes: int = 16,
    seed: int = 0,
    max_steps: int = DEFAULT_MAX_STEPS,
    game_dir: str | os.PathLike = DEFAULT_GAME_DIR,
) -> dict[str, float]:
    """Play `episodes` episodes of the real games from the checkpoint's start states (taken in a seeded random
    order, cycling) with an SB3 model (deterministic `predict`, the wrapper sizes read from its spaces) or a function
    `(obs, info) -> action` (default sizes).

    Returns `success_rate` (games won), `mean_return` (score gained), `mean_length` (steps) and `episodes`.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    is_model = hasattr(policy, "predict")
    # A model trained with other wrapper sizes sees the real env with those sizes.
    sizes = {"max_candidates": int(policy.action_space.n), "obs_dim": int(policy.observation_space.shape[0])} if is_model else {}
    env = RealTextWorldDiscreteEnv(checkpoint, max_steps, game_dir=game_dir, **sizes)
    games = scored_games(len(env.starts), episodes, seed)
    wins, returns, lengths = [], [], []
    try:
        for e in range(episodes):
            index, reset_seed = games[e]
            obs, info = env.reset(seed=reset_seed, options={"index": index})
            total, done = 0.0, False
            while not done:
                action = policy.predict(obs, deterministic=True)[0] if is_model else policy(obs, info)
                obs, reward, terminated, truncated, info = env.step(action)
                total += reward
                done = terminated or truncated
            wins.append(info["is_success"])
            returns.append(total)
            lengths.append(info["step"])
    finally:
        env.close()
    return {"success_rate": float(np.mean(wins)), "mean_return": float(np.mean(returns)),
            "mean_length": float(np.mean(lengths)), "episodes": episodes}


def evaluate_in_learned(model: Any, checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT, episodes: int = 16,
                        seed: int = 0, max_steps: int = DEFAULT_MAX_STEPS, num_envs: int = 16) -> float:
    """`evaluate_in_real`'s games, in the same order, in the learned simulator of `checkpoint`, the SB3 model acting
    greedily: the share of them it wins there."""
    games = [index for index, _ in scored_games(len(load_start_states(checkpoint)), episodes, seed)]
    width = min(episodes, num_envs)
    venv = TextGameDiscreteVectorEnv(width, checkpoint, max_steps=max_steps, max_candidates=int(model.action_space.n),
                                     obs_dim=int(model.observation_space.shape[0]))
    wins = []
    try:
        for first in range(0, episodes, width):
            chunk = games[first : first + width]
            obs, _ = venv.reset(seed=seed, options={"index": chunk + [chunk[0]] * (width - len(chunk))})
            won = np.zeros(width, dtype=bool)
            ended = np.zeros(width, dtype=bool)
            while not ended[: len(chunk)].all():
                obs, _, terminated, truncated, infos = venv.step(np.asarray(model.predict(obs, deterministic=True)[0]))
                won |= ~ended & infos["is_success"]
                ended |= terminated | truncated
            wins += won[: len(chunk)].tolist()
    finally:
        venv.close()
    return float(np.mean(wins))

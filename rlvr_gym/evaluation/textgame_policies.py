"""Does the learned text-game simulator rank text policies the way real TextWorld does?

    rlvr-gym evaluate-policies textgame --checkpoint textgame-rlvr --episodes 8

The ladder: policies that follow the real game's walkthrough (a fixed command list recorded with the start state),
except that with probability `noise`, and always once the list is spent, they take a random candidate command;
noise 0 is the walkthrough, noise 1 the random policy. Each policy is played from the same start states, with the same random
stream, in the real game (Inform 7) and in the learned env, where it acts on the predicted state: candidates are
built from that state, and success is the predicted gameWon, never the real game's. Metrics (Pearson r, MMRV,
MAE) are `rlvr_gym.evaluation.policies`'.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from tqdm import tqdm

from rlvr_gym.evaluation.policies import mae, mmrv, pearson
from rlvr_gym.sim.textgame import (
    DEFAULT_CHECKPOINT,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_STEPS,
    NOOP_COMMAND,
    StartState,
    TextGameSimulator,
    candidate_commands,
    open_real_game,
)

log = logging.getLogger("rlvr_gym")


def _default_game_dir() -> str:
    from envs.textworld import DEFAULT_GAME_DIR

    return str(DEFAULT_GAME_DIR)


@dataclass
class TextGamePolicyEvalConfig:
    checkpoint: str = DEFAULT_CHECKPOINT
    """Text world model with its start states: a shipped name or a Hugging Face directory."""
    episodes: int = 8
    """Episodes per policy, from the start states in a seeded random order (cycling when there are fewer)."""
    seed: int = 0
    """Seed of the start-state order, the policies' random choices and the model's sampling."""
    noise_levels: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    """One policy per level: the probability of a random candidate instead of the walkthrough's next command."""
    max_steps: int = DEFAULT_MAX_STEPS
    """Steps per episode at most, in both envs."""
    temperature: float = 0.0
    """Sampling temperature of the world model (0: greedy)."""
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    """Completion length limit of the world model."""
    batch_size: int = 16
    """Learned-env episodes stepped together in one batched generation."""
    halt_uncertainty: float | None = None
    """The learned env's guard (`RLVRWorld-TextGame-v0`'s `halt_uncertainty`); None: off."""
    win_check: str = ""
    """The learned env's second world model (`RLVRWorld-TextGame-v0`'s `win_check`); empty: off."""
    game_dir: str = field(default_factory=_default_game_dir)
    """Where the real games are regenerated (a cache)."""
    threads: int = 1
    """torch threads."""


@dataclass
class PlanPolicy:
    """Follows a fixed command plan; with probability `noise`, or once the plan is spent, a random candidate."""

    plan: list[str]
    noise: float
    rng: np.random.Generator
    taken: int = 0
    """Plan commands sent so far."""

    def __call__(self, candidates: list[str]) -> str:
        if self.rng.random() < self.noise or self.taken >= len(self.plan):
            return candidates[self.rng.integers(len(candidates))] if candidates else NOOP_COMMAND
        self.taken += 1
        return self.plan[self.taken - 1]


def policy_name(noise: float) -> str:
    return {0.0: "walkthrough", 1.0: "random"}.get(noise, f"noisy-walkthrough-{noise:g}")


def run_textgame_policy_eval(config: TextGamePolicyEvalConfig) -> dict:
    """Score the ladder in real TextWorld and in the learned env; per-policy success and return in both, the fraction
    of learned episodes cut by unusable model output, and pearson / mmrv / mae of the success rates (sim, real)."""
    levels = list(config.noise_levels)
    if len(levels) < 2 or not all(0.0 <= p <= 1.0 for p in levels):
        raise ValueError(f"noise_levels needs at least two probabilities in [0, 1] to rank, got {levels}")
    if config.episodes < 1 or config.max_steps < 1:
        raise ValueError(f"episodes and max_steps must be at least 1, got {config.episodes} and {config.max_steps}")
    torch.set_num_threads(config.threads)
    started = time.perf_counter()
    sim = TextGameSimulator(config.checkpoint, config.temperature, config.max_new_tokens, config.batch_size,
                            halt_uncertainty=config.halt_uncertainty, win_check=config.win_check)
    order = np.random.default_rng(config.seed).permutation(len(sim.starts))
    indices = [int(order[e % len(order)]) for e in range(config.episodes)]
    runs = [(k, e) for k in range(len(levels)) for e in range(config.episodes)]

    def policy(k: int, e: int) -> PlanPolicy:
        return PlanPolicy(sim.starts[indices[e]].walkthrough, levels[k], np.random.default_rng([config.seed, k, e]))

    real_won, real_return = play_real(sim.starts, [indices[e] for _, e in runs], [policy(k, e) for k, e in runs],
                                       config.max_steps, config.game_dir)
    sim_won, sim_return, sim_error = play_learned(sim, [indices[e] for _, e in runs], [policy(k, e) for k, e in runs],
                                                   config.max_steps, config.seed)

    def per_policy(values: list[float]) -> list[float]:
        return [float(np.mean(values[k * config.episodes : (k + 1) * config.episodes])) for k in range(len(levels))]

    real_success, sim_success = per_policy(real_won), per_policy(sim_won)
    result = {
        "checkpoint": str(config.checkpoint),
        "halt_uncertainty": config.halt_uncertainty,
        "win_check": config.win_check,
        "episodes": config.episodes,
        "policies": [policy_name(p) for p in levels],
        "noise_levels": levels,
        "real_success": real_success,
        "sim_success": sim_success,
        "real_return": per_policy(real_return),
        "sim_return": per_policy(sim_return),
        "sim_error_rate": per_policy(sim_error),
        "pearson": pearson(sim_success, real_success),
        "mmrv": mmrv(sim_success, real_success),
        "mae": mae(sim_success, real_success),
        "seconds": round(time.perf_counter() - started, 1),
    }
    log.info("text policies (real / learned success): %s; pearson %.3f, mmrv %.3f",
             ", ".join(f"{n} {r:.2f}/{s:.2f}" for n, r, s in zip(result["policies"], real_success, sim_success)),
             result["pearson"], result["mmrv"])
    return result


def play_real(
    starts: list[StartState], indices: list[int], policies: list[Callable[[list[str]], str]], max_steps: int,
    game_dir: str,
) -> tuple[list[float], list[float]]:
    """Episode i from start state indices[i] in the real game, policies[i] choosing each command from the candidate
    list: (won, return) per episode."""
    games = {i: open_real_game(starts[i], game_dir) for i in sorted(set(indices))}
    won, returns = [], []
    try:
        for index, policy in zip(tqdm(indices, desc="real episodes", leave=False), policies):
            game = games[index]
            state, total = game.reset(), 0.0
            for _ in range(max_steps):
                state, reward, done = game.step(policy(candidate_commands(state)))
                total += reward
                if done:
                    break
            won.append(float(game.won))
            returns.append(total)
    finally:
        for game in games.values():
            game.close()
    return won, returns


def play_learned(
    sim: TextGameSimulator, indices: list[int], policies: list[Callable[[list[str]], str]], max_steps: int, seed: int
) -> tuple[list[float], list[float], list[float]]:
    """All episodes at once: each step sends every running episode's command through one batched generation."""
    rollouts = [sim.start(np.random.default_rng(seed), index) for index in indices]
    returns = [0.0] * len(rollouts)
    running = list(range(len(rollouts)))
    with tqdm(total=max_steps, desc="learned-env steps", leave=False) as bar:
        for step in range(max_steps):
            commands = [policies[i](candidate_commands(rollouts[i].state)) for i in running]
            sim.advance([rollouts[i] for i in running], commands, seed=seed * 1_000 + step)
            for i in running:
                returns[i] += rollouts[i].reward
            running = [i for i in running if not rollouts[i].ended]
            bar.update()
            if not running:
                break
    won = [float(r.won) for r in rollouts]
    return won, returns, [float(r.error is not None) for r in rollouts]

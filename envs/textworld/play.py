"""Play compiled TextWorld games in the real engine, with states in the ByteSized32 schema, and the policies that
collect transitions from them."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import textworld
from textworld import EnvInfos

from envs.textworld.state import state_from_facts

_INFOS = EnvInfos(
    facts=True, admissible_commands=True, policy_commands=True, score=True, max_score=True,
    won=True, lost=True, objective=True, game=True,
)


class TextWorldGame:
    """One compiled TextWorld game (`.z8` with its `.json`), stepped by text commands in the Inform 7 engine.

    `reset()` and `step()` return states as `state_from_facts` builds them; the engine's own view is kept in
    `infos` (facts, feedback, admissible and policy commands).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file() or not self.path.with_suffix(".json").is_file():
            raise FileNotFoundError(
                f"no compiled TextWorld game at {self.path} (with its .json); make one with "
                "envs.textworld.make_game(seed, out_dir)"
            )
        self._env = textworld.start(str(self.path), request_infos=_INFOS)
        self.infos: dict[str, Any] = {}

    def reset(self) -> dict[str, Any]:
        """Start the game over; return the initial state."""
        self.infos = self._env.reset()
        return self.state

    def step(self, command: str) -> tuple[dict[str, Any], float, bool]:
        """Send one command; return (next state, score gained, game over)."""
        if not self.infos:
            raise RuntimeError("call reset() before step()")
        score = self.infos["score"]
        self.infos, _, done = self._env.step(command)
        return self.state, float(self.infos["score"] - score), bool(done)

    @property
    def state(self) -> dict[str, Any]:
        """The current state in the ByteSized32 schema."""
        return state_from_facts(self.infos["facts"], self.infos["game"], score=self.infos["score"],
                                game_over=self.won or self.lost, game_won=self.won)

    @property
    def admissible_commands(self) -> list[str]:
        """Commands the game accepts now, sorted."""
        return list(self.infos["admissible_commands"])

    @property
    def policy_commands(self) -> list[str]:
        """The shortest command sequence that wins from here (empty once the game cannot be won)."""
        return list(self.infos["policy_commands"])

    @property
    def objective(self) -> str:
        return self.infos["objective"]

    @property
    def feedback(self) -> str:
        """The engine's text reply to the last command."""
        return self.infos["feedback"]

    @property
    def score(self) -> float:
        return float(self.infos["score"])

    @property
    def max_score(self) -> float:
        return float(self.infos["max_score"])

    @property
    def won(self) -> bool:
        return bool(self.infos["won"])

    @property
    def lost(self) -> bool:
        return bool(self.infos["lost"])

    def close(self) -> None:
        self._env.close()


Policy = Callable[[TextWorldGame, np.random.Generator], str]


def random_policy(game: TextWorldGame, rng: np.random.Generator) -> str:
    """A uniformly random admissible command."""
    commands = game.admissible_commands
    return commands[rng.integers(len(commands))]


def walkthrough(game: TextWorldGame, rng: np.random.Generator) -> str:
    """The next command of the game's winning policy, recomputed from the current state."""
    commands = game.policy_commands
    # A game made unwinnable (say, by eating a quest item) has no policy left: keep playing at random.
    return commands[0] if commands else random_policy(game, rng)


def noisy_walkthrough(p: float) -> Policy:
    """The walkthrough, except that with probability `p` a random admissible command is taken instead."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"noisy_walkthrough needs a probability p in [0, 1], got {p}")

    def policy(game: TextWorldGame, rng: np.random.Generator) -> str:
        return random_policy(game, rng) if rng.random() < p else walkthrough(game, rng)

    return policy


@dataclass
class Transition:
    state: dict[str, Any]
    """State before the command (ByteSized32 schema)."""
    command: str
    next_state: dict[str, Any]
    """State after the command."""
    reward: float
    """Score gained by the command."""
    done: bool
    """The game is over (won or lost) after the command."""
    won: bool
    admissible_commands: list[str]
    """Commands the game accepted before this one: the candidates a simulator offers in `state`."""


def play_episode(game_path: str | Path, policy: Policy, seed: int, max_steps: int = 50) -> Iterator[Transition]:
    """Play one episode of a compiled game with `policy` (seeded); yield its transitions, at most `max_steps`."""
    rng = np.random.default_rng(seed)
    game = TextWorldGame(game_path)
    try:
        state = game.reset()
        for _ in range(max_steps):
            commands = game.admissible_commands
            command = policy(game, rng)
            next_state, reward, done = game.step(command)
            yield Transition(state, command, next_state, reward, done, game.won, commands)
            if done:
                return
            state = next_state
    finally:
        game.close()

"""The learned envs' guard against an agent that drives the world model where it guesses: a reward penalty on the
model's uncertainty (MOPO) and an unpaid end to the episode above a threshold (MOReL). Each env defines its own
uncertainty (RT-1: mean surprisal of a frame's codes; text: surprisal of the least likely token of a step)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Guard:
    """What the env does with the model's uncertainty about the step it shows (`info["uncertainty"]`)."""

    penalty: float = 0.0
    """MOPO: reward minus penalty x uncertainty (0: off)."""
    halt_above: float | None = None
    """MOReL: end the episode, truncated and unpaid, once the uncertainty exceeds this (None: off)."""

    def __post_init__(self):
        if self.penalty < 0 or (self.halt_above is not None and self.halt_above <= 0):
            raise ValueError(f"uncertainty_penalty must be >= 0 and halt_uncertainty > 0 (or None); got {self.penalty} "
                             f"and {self.halt_above}")

    def halts(self, uncertainty: float) -> bool:
        return self.halt_above is not None and uncertainty > self.halt_above

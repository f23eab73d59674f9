"""Real TextWorld games: generated and compiled by seed, played in the Inform 7 engine, with states converted to the
ByteSized32 object schema so that one text world model serves both sources."""

from envs.textworld.games import DEFAULT_GAME_DIR, game_name, make_game
from envs.textworld.play import (
    Policy,
    TextWorldGame,
    Transition,
    noisy_walkthrough,
    play_episode,
    random_policy,
    walkthrough,
)
from envs.textworld.state import OBJECT_TYPES, entity_uuids, in_uuid_order, state_from_facts

__all__ = [
    "DEFAULT_GAME_DIR",
    "OBJECT_TYPES",
    "Policy",
    "TextWorldGame",
    "Transition",
    "entity_uuids",
    "game_name",
    "in_uuid_order",
    "make_game",
    "noisy_walkthrough",
    "play_episode",
    "random_policy",
    "state_from_facts",
    "walkthrough",
]

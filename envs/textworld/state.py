"""TextWorld facts -> the ByteSized32 state schema (objects with name, uuid, type, properties, contains)."""

import copy
import re
from collections.abc import Iterable
from typing import Any

from textworld import Game
from textworld.logic import Proposition

# TextWorld entity type -> ByteSized32-style object type. The inventory `I` is no object of its own:
# as in ByteSized32, the agent contains what it carries.
OBJECT_TYPES = {
    "P": "Agent",
    "r": "Room",
    "d": "Door",
    "c": "Container",
    "s": "Supporter",
    "t": "Thing",
    "o": "Item",
    "k": "Key",
    "f": "Food",
}
_UUID_ORDER = list(OBJECT_TYPES)
_DIRECTIONS = {"north_of": "north", "south_of": "south", "east_of": "east", "west_of": "west"}


_FIXED = {"isContainer": False, "isMoveable": False}
_PORTABLE = {"isContainer": False, "isMoveable": True}
_OPENABLE = {"isOpenable": True, "isOpen": False, "isLocked": False}
_ALWAYS_OPEN = {"isOpenable": False, "isOpen": True}
# Properties before the facts are applied: `closed` facts leave isOpen and isLocked at False.
_BASE_PROPERTIES: dict[str, dict[str, Any]] = {
    "P": {"isContainer": True, "isMoveable": True, **_ALWAYS_OPEN, "containerPrefix": "in"},
    "r": {"isContainer": True, "isMoveable": False, **_ALWAYS_OPEN, "containerPrefix": "in", "connects": {}},
    "d": {**_FIXED, **_OPENABLE, "connects": []},
    "c": {"isContainer": True, "isMoveable": False, **_OPENABLE, "containerPrefix": "in"},
    "s": {"isContainer": True, "isMoveable": False, **_ALWAYS_OPEN, "containerPrefix": "on"},
    "t": _FIXED,
    "o": _PORTABLE,
    "k": {**_PORTABLE, "unlocks": None},
    "f": {**_PORTABLE, "isFood": True, "isEdible": False, "isEaten": False},
}


def _uuid_order(entity_id: str, kind: str) -> tuple[int, int, str]:
    number = re.search(r"(\d+)$", entity_id)
    return _UUID_ORDER.index(kind), int(number.group(1)) if number else -1, entity_id


def entity_uuids(game: Game) -> dict[str, int]:
    """Entity id (`P`, `r_0`, `c_1`, ...) -> uuid: the agent is 0, then rooms, doors, containers, ... by id."""
    unknown = sorted({info.type for info in game.infos.values()} - set(OBJECT_TYPES) - {"I"})
    if unknown:
        raise ValueError(f"TextWorld entity types {unknown} have no ByteSized32 object type; add them to OBJECT_TYPES")
    ids = sorted((eid for eid, info in game.infos.items() if info.type != "I"),
                 key=lambda eid: _uuid_order(eid, game.infos[eid].type))
    return {eid: uuid for uuid, eid in enumerate(ids)}


def state_from_facts(
    facts: Iterable[Proposition],
    game: Game,
    score: float = 0,
    game_over: bool = False,
    game_won: bool = False,
) -> dict[str, Any]:
    """Convert a TextWorld state to `{"objects": [...], "score", "gameOver", "gameWon"}`.

    `facts` are the human-readable propositions of `infos["facts"]` (arguments named as in the game text).
    Every object is listed, rooms included; `contains` holds names, and objects come in uuid order.
    """
    uuids = entity_uuids(game)
    by_name: dict[str, str] = {}
    for eid, info in game.infos.items():
        name = info.name or eid
        if name in by_name:
            raise ValueError(f"game {game.metadata.get('uuid')} names two entities {name!r}; "
                             "states need unique names, generate the game with another seed")
        by_name[name] = eid

    objects: dict[str, dict[str, Any]] = {}
    for eid, uuid in uuids.items():
        kind = game.infos[eid].type
        label = "agent" if kind == "P" else game.infos[eid].name or eid
        objects[eid] = {"name": f"{label} (ID: {uuid})", "uuid": uuid, "type": OBJECT_TYPES[kind],
                        "properties": copy.deepcopy(_BASE_PROPERTIES[kind]), "contains": []}
    objects["I"] = objects["P"]

    def obj(variable) -> dict[str, Any]:
        return objects[by_name[variable.name]]

    for fact in facts:
        pred, args = str(fact.name), [obj(v) for v in fact.arguments]
        if pred in ("at", "in", "on"):
            args[1]["contains"].append(args[0]["name"])
        elif pred == "open":
            args[0]["properties"]["isOpen"] = True
        elif pred == "locked":
            args[0]["properties"]["isLocked"] = True
        elif pred == "eaten":
            args[0]["properties"]["isEaten"] = True
        elif pred == "edible":
            args[0]["properties"]["isEdible"] = True
        elif pred == "match":
            args[0]["properties"]["unlocks"] = args[1]["name"]
        elif pred == "link":
            args[1]["properties"]["connects"] = [o["name"] for o in sorted((args[0], args[2]), key=lambda o: o["uuid"])]
        elif pred in _DIRECTIONS:
            args[1]["properties"]["connects"][_DIRECTIONS[pred]] = args[0]["name"]
        elif pred not in ("closed", "free"):
            # `closed` is the default of isOpen and isLocked; `free` follows from the map and the doors' isOpen.
            raise ValueError(f"state_from_facts does not know the TextWorld predicate {pred!r} ({fact}); "
                             "map it to a property in envs/textworld/state.py")

    del objects["I"]
    for o in objects.values():
        if o["type"] == "Room":
            exits = o["properties"]["connects"]
            o["properties"]["connects"] = {d: exits[d] for d in _DIRECTIONS.values() if d in exits}
    return in_uuid_order(
        {"objects": list(objects.values()), "score": score, "gameOver": bool(game_over), "gameWon": bool(game_won)}
    )


def in_uuid_order(state: dict[str, Any]) -> dict[str, Any]:
    """`state` with its objects, and each object's contents, in uuid order: how a TextWorld state is listed. Contents
    that name no object of the state go last."""
    uuid_of = {o["name"]: o["uuid"] for o in state["objects"]}

    def rank(name: Any) -> tuple:
        return (0, uuid_of[name], "") if name in uuid_of else (1, 0, str(name))

    objects = sorted(state["objects"], key=lambda o: o["uuid"])
    return {**state, "objects": [{**o, "contains": sorted(o["contains"], key=rank)} for o in objects]}

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
from textworld.logic import Proposition, Variable

from envs.textworld import (
    TextWorldGame,
    entity_uuids,
    make_game,
    noisy_walkthrough,
    play_episode,
    random_policy,
    state_from_facts,
    walkthrough,
)

# Jericho warns that it cannot list valid actions for TextWorld's games (TextWorld lists them from its own logic and
# silences the warning at import, but pytest restores the warning filters).
pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")

SIZE = dict(nb_rooms=4, nb_objects=6, quest_length=4)
# Seed 2's quest unlocks a container, opens it, takes an item from it and puts it on a supporter, behind a door;
# seed 8's takes a key from a supporter, walks through rooms and unlocks a container.
SEEDS = (2, 8)


@pytest.fixture(scope="session")
def game_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("textworld_games")


@pytest.fixture(scope="session")
def games(game_dir) -> list[Path]:
    return [make_game(seed, game_dir, **SIZE) for seed in SEEDS]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def by_name(state: dict) -> dict[str, dict]:
    return {o["name"]: o for o in state["objects"]}


def holder_of(state: dict, name: str) -> str | None:
    holders = [o["name"] for o in state["objects"] if name in o["contains"]]
    assert len(holders) <= 1, f"{name} is contained by {holders}"
    return holders[0] if holders else None


def test_state_from_facts_lists_every_entity_with_its_containment_and_doors(games):
    game = TextWorldGame(games[0])
    state = game.reset()
    facts, tw_game = game.infos["facts"], game.infos["game"]
    objects = by_name(state)
    label = {(info.name or eid): f"{'agent' if eid == 'P' else info.name} (ID: {uuid})"
             for eid, uuid in entity_uuids(tw_game).items() for info in [tw_game.infos[eid]]}
    label["I"] = label["P"]

    assert set(state) == {"objects", "score", "gameOver", "gameWon"}
    assert [o["uuid"] for o in state["objects"]] == list(range(len(tw_game.infos) - 1))  # all but the inventory
    for o in state["objects"]:
        assert set(o) == {"name", "uuid", "type", "properties", "contains"}
        assert re.fullmatch(rf".+ \(ID: {o['uuid']}\)", o["name"])
    assert state["objects"][0]["name"] == "agent (ID: 0)"
    assert {"Agent", "Room", "Door", "Container", "Supporter", "Key", "Item"} <= {o["type"] for o in state["objects"]}

    for fact in facts:
        names = [label[v.name] for v in fact.arguments]
        if fact.name in ("at", "in", "on"):
            assert names[0] in objects[names[1]]["contains"], str(fact)
        elif fact.name in ("open", "closed", "locked"):
            props = objects[names[0]]["properties"]
            assert (props["isOpen"], props["isLocked"]) == {"open": (True, False), "closed": (False, False),
                                                            "locked": (False, True)}[fact.name], str(fact)
        elif fact.name == "link":
            assert set(objects[names[1]]["properties"]["connects"]) == {names[0], names[2]}
        elif fact.name == "north_of":
            assert objects[names[1]]["properties"]["connects"]["north"] == names[0]
    nb_contained = sum(fact.name in ("at", "in", "on") for fact in facts)
    assert sum(len(o["contains"]) for o in state["objects"]) == nb_contained
    assert sum("agent (ID: 0)" in o["contains"] for o in state["objects"] if o["type"] == "Room") == 1
    game.close()


def test_state_from_facts_rejects_unknown_predicates(games):
    game = TextWorldGame(games[0])
    game.reset()
    item = next(v for fact in game.infos["facts"] for v in fact.arguments if v.type == "o")
    with pytest.raises(ValueError, match="predicate 'burning'"):
        state_from_facts([*game.infos["facts"], Proposition("burning", [Variable(item.name, "o")])],
                         game.infos["game"])
    game.close()


def test_walkthrough_wins_with_the_max_score(games):
    for path in games:
        transitions = list(play_episode(path, walkthrough, seed=0, max_steps=20))
        last = transitions[-1]
        assert last.done and last.won
        assert last.next_state["gameWon"] and last.next_state["gameOver"]
        assert not any(t.done for t in transitions[:-1])
        game = TextWorldGame(path)
        game.reset()
        assert last.next_state["score"] == sum(t.reward for t in transitions) == game.max_score > 0
        assert all(t.command in t.admissible_commands for t in transitions)
        game.close()


def test_random_policy_mostly_does_not_win(games):
    episodes = [list(play_episode(path, random_policy, seed, max_steps=20)) for path in games for seed in range(8)]
    assert sum(ep[-1].won for ep in episodes) <= len(episodes) // 4
    commands = {t.command for ep in episodes for t in ep}
    assert len(commands) > 10


def test_noisy_walkthrough_mixes_the_walkthrough_with_random_commands(games):
    exact = [t.command for t in play_episode(games[0], noisy_walkthrough(0.0), seed=0)]
    assert exact == [t.command for t in play_episode(games[0], walkthrough, seed=0)]
    noisy = [list(play_episode(games[0], noisy_walkthrough(0.5), seed, max_steps=40)) for seed in range(4)]
    assert any([t.command for t in ep] != exact for ep in noisy)
    assert sum(ep[-1].won for ep in noisy) >= 3
    with pytest.raises(ValueError, match="probability"):
        noisy_walkthrough(1.5)


def test_same_seed_gives_the_same_game_and_states(games, tmp_path):
    again = make_game(SEEDS[0], tmp_path, **SIZE)
    assert again != games[0]
    assert sha256(again) == sha256(games[0])
    assert sha256(again.with_suffix(".json")) == sha256(games[0].with_suffix(".json"))
    # Inform 7 stamps the compile date into the story header's serial number; make_game fixes it.
    assert again.read_bytes()[0x12:0x18] == b"000000"
    other = make_game(SEEDS[0] + 100, tmp_path, **SIZE)
    assert sha256(other) != sha256(again)

    def rollout(path):
        return [(t.state, t.command, t.next_state, t.reward) for t in play_episode(path, random_policy, 7, 15)]

    assert rollout(again) == rollout(games[0])
    assert rollout(games[0]) != [(t.state, t.command, t.next_state, t.reward)
                                 for t in play_episode(games[0], random_policy, 8, 15)]


def test_make_game_reuses_a_compiled_game(games, game_dir):
    mtime = games[0].stat().st_mtime_ns
    assert make_game(SEEDS[0], game_dir, **SIZE) == games[0]
    assert games[0].stat().st_mtime_ns == mtime
    assert sorted(p.name for p in game_dir.iterdir() if p.name.startswith(".")) == []


def test_taking_an_item_moves_it_into_the_agent(games):
    takes = [t for path in games for t in play_episode(path, walkthrough, 0) if t.command.startswith("take ")]
    assert takes
    for t in takes:
        item = t.command.removeprefix("take ").split(" from ")[0]
        name = next(n for n in by_name(t.state) if n.startswith(f"{item} (ID: "))
        before, after = holder_of(t.state, name), holder_of(t.next_state, name)
        assert before != "agent (ID: 0)" and after == "agent (ID: 0)"
        assert name not in by_name(t.next_state)[before]["contains"]


def test_open_unlock_and_close_change_the_properties(games):
    path = games[0]
    transitions = list(play_episode(path, walkthrough, 0))
    unlock, open_ = transitions[0], transitions[1]
    assert unlock.command.startswith("unlock ") and open_.command.startswith("open ")
    target = next(n for n in by_name(unlock.state) if n.startswith(unlock.command.split()[1] + " "))
    assert by_name(unlock.state)[target]["properties"]["isLocked"]
    assert not by_name(unlock.next_state)[target]["properties"]["isLocked"]
    assert not by_name(open_.state)[target]["properties"]["isOpen"]
    assert by_name(open_.next_state)[target]["properties"]["isOpen"]

    game = TextWorldGame(path)
    game.reset()
    for t in transitions[:2]:
        game.step(t.command)
    closed, _, _ = game.step(f"close {unlock.command.split(' with ')[0].removeprefix('unlock ')}")
    assert not by_name(closed)[target]["properties"]["isOpen"]
    game.close()


def test_every_fact_change_shows_in_the_state(games):
    counted = 0
    for path in games:
        game = TextWorldGame(path)
        game.reset()
        rng = np.random.default_rng(0)
        for _ in range(60):
            facts, state = {str(f) for f in game.infos["facts"]}, game.state
            next_state, _, done = game.step(random_policy(game, rng))
            facts_changed = facts != {str(f) for f in game.infos["facts"]}
            assert facts_changed == (next_state != state)
            counted += facts_changed
            if done:
                break
        game.close()
    assert counted > 10


def test_errors_say_how_to_fix_the_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="make_game"):
        TextWorldGame(tmp_path / "missing.z8")
    with pytest.raises(ValueError, match="nb_rooms >= 1"):
        make_game(0, tmp_path, nb_rooms=0)

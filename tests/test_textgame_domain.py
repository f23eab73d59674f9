import copy
import gzip
import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlvr_gym.data.bytesized32 import (
    DATA_ENV_VAR,
    DataConfig,
    Transition,
    data_dir,
    install_data,
    installed_data_dir,
    load_transitions,
)
from rlvr_gym.domains import textgame as tg

FIXTURE = Path(__file__).parent / "fixtures" / "bytesized32_small.jsonl"


def _obj(name, uuid, type_, properties, contains=()):
    return {"name": name, "uuid": uuid, "type": type_, "properties": properties, "contains": list(contains)}


def _state(objects, score=0, game_over=False, game_won=False):
    return {"objects": objects, "score": score, "gameOver": game_over, "gameWon": game_won}


CURRENT = _state(
    [
        _obj("room (ID: 1)", 1, "World", {"isContainer": True}, ["agent (ID: 0)", "kettle (ID: 2)"]),
        _obj("agent (ID: 0)", 0, "Agent", {"isContainer": True}),
        _obj("kettle (ID: 2)", 2, "Kettle", {"isOn": False, "temperature": 20.0}),
    ]
)
HEATED = _state(
    [
        _obj("room (ID: 1)", 1, "World", {"isContainer": True}, ["agent (ID: 0)", "kettle (ID: 2)"]),
        _obj("agent (ID: 0)", 0, "Agent", {"isContainer": True}),
        _obj("kettle (ID: 2)", 2, "Kettle", {"isOn": True, "temperature": 30.0}),
    ]
)
HEATED_TARGET = '{"m":[{"u":2,"p":{"isOn":true,"temperature":30.0}}]}'


def _with(state, **changes):
    """A deep copy of `state`; `changes` maps `o<uuid>` to object field updates, or sets score fields."""
    new = copy.deepcopy(state)
    for key, value in changes.items():
        if key.startswith("o"):
            obj = next(o for o in new["objects"] if o["uuid"] == int(key[1:]))
            for field, v in value.items():
                if field == "properties":
                    obj["properties"].update(v)
                else:
                    obj[field] = v
        else:
            new[key] = value
    return new


# ---- importer ----


def test_importer_reads_fixture_into_states_and_action():
    transitions = load_transitions(FIXTURE)
    assert [t.state_id for t in transitions] == [0, 1, 2, 3, 4]
    fill = transitions[1]
    assert fill.game == "make-tea" and fill.action == "fill kettle (ID: 2) from tap (ID: 3)"
    assert fill.task == "Your task is to make a cup of tea."
    assert set(fill.current) == {"objects", "score", "gameOver", "gameWon"}
    assert {o["uuid"] for o in fill.current["objects"]} == {0, 1, 2, 3}
    assert {o["uuid"] for o in fill.next["objects"]} == {0, 1, 2, 3, 4}
    # the next state is the tick state (after the world's own dynamics), not the action state
    heat = transitions[2]
    kettle = next(o for o in heat.next["objects"] if o["uuid"] == 2)
    assert kettle["properties"]["temperature"] == 60.0
    assert transitions[4].next["gameWon"] is True and transitions[4].next["score"] == 1


def test_importer_reads_gzipped_file_like_plain(tmp_path):
    gz = tmp_path / "small.jsonl.gz"
    with open(FIXTURE, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert load_transitions(gz) == load_transitions(FIXTURE)


def test_importer_names_file_and_line_of_bad_record(tmp_path):
    lines = FIXTURE.read_text().splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([lines[0], lines[1][:-20], lines[2]]) + "\n")
    with pytest.raises(ValueError, match=r"broken\.jsonl:2: not a ByteSized32 record"):
        load_transitions(broken)

    record = json.loads(lines[0])
    del record["tick_state"]
    missing = tmp_path / "missing.jsonl"
    missing.write_text(lines[0] + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=r"missing\.jsonl:2: .*missing keys \['tick_state'\]"):
        load_transitions(missing)

    record = json.loads(lines[0])
    record["current_state"]["objects"][0]["uuid"] = "1"
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=r"wrong\.jsonl:1: .*objects\[0\]\.uuid must be int"):
        load_transitions(wrong)


def test_importer_missing_file_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="ByteSized32"):
        load_transitions(tmp_path / "nope.jsonl")


def test_data_dir_follows_its_env_var_then_the_installed_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "mine"))
    assert data_dir() == tmp_path / "mine"
    monkeypatch.delenv(DATA_ENV_VAR)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("RLVR_GYM_SHARED", str(tmp_path / "no-shared"))
    assert data_dir() == installed_data_dir() == tmp_path / "xdg" / "rlvr-gym" / "bytesized32"
    with pytest.raises(FileNotFoundError, match=f"{DATA_ENV_VAR}.*rlvr-gym data bytesized32"):
        load_transitions(data_dir() / "train.jsonl.gz")


def test_data_command_checks_and_installs_the_files_every_command_then_finds(monkeypatch, tmp_path):
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("RLVR_GYM_SHARED", str(tmp_path / "no-shared"))
    source = tmp_path / "source"
    source.mkdir()
    with pytest.raises(FileNotFoundError, match="train.jsonl.gz or valid.jsonl.gz"):
        install_data(DataConfig(source=str(source)))
    lines = FIXTURE.read_text().splitlines()
    for name, n in (("train.jsonl.gz", 3), ("valid.jsonl.gz", 2)):
        with gzip.open(source / name, "wt") as f:
            f.write("\n".join(lines[:n]) + "\n")
    assert install_data(DataConfig(source=str(source)))["train.jsonl.gz"] == 3
    assert data_dir() == tmp_path / "xdg" / "rlvr-gym" / "bytesized32"
    assert len(load_transitions(data_dir() / "valid.jsonl.gz")) == 2
    with gzip.open(source / "valid.jsonl.gz", "wt") as f:
        f.write("{not json\n")
    with pytest.raises(ValueError, match="valid.jsonl.gz:1"):
        install_data(DataConfig(source=str(source)))
    assert len(load_transitions(data_dir() / "valid.jsonl.gz")) == 2  # a bad source leaves the installed data


# ---- changed / unchanged ----


@pytest.mark.parametrize(
    "changes, changed",
    [
        ({}, False),
        ({"o2": {"properties": {"isOn": True}}}, True),
        ({"o0": {"contains": ["kettle (ID: 2)"]}}, True),
        ({"o1": {"contains": ["kettle (ID: 2)", "agent (ID: 0)"]}}, False),  # contents are a multiset
        ({"score": 1}, True),
        ({"gameOver": True}, True),
        ({"gameWon": True}, True),
        ({"score": 0.0}, False),
        ({"o2": {"properties": {"temperature": 20}}}, False),  # 20 == 20.0
        ({"o2": {"properties": {"isOn": 0}}}, True),  # False is not 0
        ({"o2": {"name": "hot kettle (ID: 2)"}}, False),  # the benchmark ignores names
    ],
)
def test_is_changed_definition(changes, changed):
    assert tg.is_changed(CURRENT, _with(CURRENT, **changes)) is changed


def test_is_changed_on_object_added_or_removed():
    added = _with(CURRENT)
    added["objects"].append(_obj("cup (ID: 3)", 3, "Cup", {}))
    assert tg.is_changed(CURRENT, added)
    removed = _with(CURRENT)
    del removed["objects"][2]
    assert tg.is_changed(CURRENT, removed)


def test_is_changed_treats_lists_and_tuples_alike():
    with_list = _with(CURRENT, o2={"properties": {"pair": [1, "a"]}})
    with_tuple = _with(CURRENT, o2={"properties": {"pair": (1, "a")}})
    assert not tg.is_changed(with_list, with_tuple)


# ---- prompt ----


def test_prompt_is_compact_json_with_uuid_contents():
    prompt = tg.format_prompt(CURRENT, "turn on kettle (ID: 2)", "Your task is to boil water.")
    assert prompt.endswith("\n") and "\n" not in prompt[:-1] and " (ID: " not in prompt.split('"a":')[0]
    wire = json.loads(prompt)
    assert wire["a"] == "turn on kettle (ID: 2)" and wire["q"] == "Your task is to boil water."
    assert wire["s"] == {"s": 0, "g": False, "w": False}
    assert wire["o"][0] == {"u": 1, "n": "room", "t": "World", "p": {"isContainer": True}, "c": [0, 2]}
    assert wire["o"][1] == {"u": 0, "n": "agent", "t": "Agent", "p": {"isContainer": True}}  # empty c left out


def test_prompt_keeps_names_without_id_suffix_verbatim():
    state = _state([_obj("water", 7, "Water", {}), _obj("cup (ID: 3)", 8, "Cup", {}, ["water", "ghost"])])
    wire = json.loads(tg.format_prompt(state, "look", ""))
    assert wire["o"] == [{"u": 7, "N": "water", "t": "Water"}, {"u": 8, "N": "cup (ID: 3)", "t": "Cup", "c": [7, "ghost"]}]


# ---- diff, parse, rebuild ----


def test_no_change_target_is_empty_object():
    assert tg.format_target(tg.make_diff(CURRENT, copy.deepcopy(CURRENT))) == "{}"
    assert tg.no_change_predictions([None, None]) == ["{}", "{}"]


def test_target_of_property_change():
    assert tg.format_target(tg.make_diff(CURRENT, HEATED)) == HEATED_TARGET


def _round_trip(current, next):
    target = tg.format_target(tg.make_diff(current, next))
    diff, error = tg.parse_diff(target, current)
    assert error is None, error
    assert tg.states_match(tg.rebuild(current, diff), next)
    return target


def test_target_lists_only_the_changed_property():
    assert _round_trip(CURRENT, _with(CURRENT, o2={"properties": {"isOn": True}})) == '{"m":[{"u":2,"p":{"isOn":true}}]}'
    added = _with(CURRENT, o2={"properties": {"colour": "red"}})
    assert _round_trip(CURRENT, added) == '{"m":[{"u":2,"p":{"colour":"red"}}]}'
    assert tg.format_target(tg.make_diff(CURRENT, _with(CURRENT, o2={"properties": {"temperature": 20}}))) == "{}"  # 20 == 20.0


def test_target_lists_removed_properties_under_x():
    current = _with(CURRENT, o2={"properties": {"colour": "red", "age": 3}})
    rebuilt_target = _round_trip(current, CURRENT)
    assert rebuilt_target == '{"m":[{"u":2,"x":["age","colour"]}]}'
    diff, _ = tg.parse_diff(rebuilt_target, current)
    assert tg.rebuild(current, diff)["objects"][2]["properties"] == {"isOn": False, "temperature": 20.0}
    both = _with(current, o2={"properties": {"isOn": True}})
    del both["objects"][2]["properties"]["age"]
    assert _round_trip(current, both) == '{"m":[{"u":2,"p":{"isOn":true},"x":["age"]}]}'


def test_target_writes_contents_as_what_is_gained_and_lost():
    emptied = _with(CURRENT, o1={"contains": []})
    del emptied["objects"][1:]
    assert _round_trip(CURRENT, emptied) == '{"m":[{"u":1,"-":[0,2]}],"r":[0,2]}'
    moved = _with(CURRENT, o1={"contains": ["agent (ID: 0)"]}, o0={"contains": ["kettle (ID: 2)"]})
    assert _round_trip(CURRENT, moved) == '{"m":[{"u":1,"-":[2]},{"u":0,"+":[2]}]}'
    swapped = _with(CURRENT, o1={"contains": ["agent (ID: 0)", "ghost", "ghost"]})
    assert _round_trip(CURRENT, swapped) == '{"m":[{"u":1,"+":["ghost","ghost"],"-":[2]}]}'


def test_whole_contents_form_writes_c_and_rebuilds_the_same_state():
    moved = _with(CURRENT, o1={"contains": ["agent (ID: 0)"]}, o0={"contains": ["kettle (ID: 2)"]})
    target = tg.format_target(tg.make_diff(CURRENT, moved, contents="whole"))
    assert target == '{"m":[{"u":1,"c":[0]},{"u":0,"c":[2]}]}'
    diff, error = tg.parse_diff(target, CURRENT)
    assert error is None and tg.states_match(tg.rebuild(CURRENT, diff), moved)
    assert tg.make_diff(CURRENT, HEATED, contents="whole") == tg.make_diff(CURRENT, HEATED)  # contents unchanged
    with pytest.raises(ValueError, match="contents"):
        tg.make_diff(CURRENT, moved, contents="lists")


def test_whole_contents_written_with_c_still_parse():
    # the form earlier checkpoints write: c replaces the object's contents
    moved = _with(CURRENT, o1={"contains": ["agent (ID: 0)"]}, o0={"contains": ["kettle (ID: 2)"]})
    diff, error = tg.parse_diff('{"m":[{"u":1,"c":[0]},{"u":0,"c":[2]}]}', CURRENT)
    assert error is None and tg.states_match(tg.rebuild(CURRENT, diff), moved)


def test_target_of_rename_and_type_change_lists_only_those():
    # the room's contents name the kettle, so they change with it, but by uuid they do not
    renamed = _with(CURRENT, o2={"name": "hot kettle (ID: 2)"}, o1={"contains": ["agent (ID: 0)", "hot kettle (ID: 2)"]})
    assert _round_trip(CURRENT, renamed) == '{"m":[{"u":2,"n":"hot kettle"}]}'
    unsuffixed = _with(CURRENT, o2={"name": "kettle"}, o1={"contains": ["agent (ID: 0)", "kettle"]})
    assert _round_trip(CURRENT, unsuffixed) == '{"m":[{"u":2,"N":"kettle"}]}'
    assert _round_trip(CURRENT, _with(CURRENT, o2={"type": "Pot"})) == '{"m":[{"u":2,"t":"Pot"}]}'


def test_unchanged_fields_may_be_repeated():
    full = '{"m":[{"u":2,"n":"kettle","t":"Kettle","p":{"isOn":true,"temperature":30.0}}]}'
    diff, error = tg.parse_diff(full, CURRENT)
    assert error is None and tg.states_match(tg.rebuild(CURRENT, diff), HEATED)


def test_fixture_targets_parse_and_rebuild_the_next_state():
    for t in load_transitions(FIXTURE):
        target = tg.format_target(tg.make_diff(t.current, t.next))
        diff, error = tg.parse_diff(target, t.current)
        assert error is None, error
        assert tg.states_match(tg.rebuild(t.current, diff), t.next)
        assert (target != "{}") == tg.is_changed(t.current, t.next)


def test_created_object_is_kept_and_required():
    fill = load_transitions(FIXTURE)[1]
    diff, _ = tg.parse_diff(tg.format_target(tg.make_diff(fill.current, fill.next)), fill.current)
    rebuilt = tg.rebuild(fill.current, diff)
    water = next(o for o in rebuilt["objects"] if o["uuid"] == 4)
    assert water["name"] == "water" and water["type"] == "Water"
    kettle = next(o for o in rebuilt["objects"] if o["uuid"] == 2)
    assert kettle["contains"] == ["water"]
    # predicting the kettle's new contents without creating the water object is an error, not a match
    only_kettle = '{"m":[{"u":2,"c":[4]}]}'
    assert tg.parse_diff(only_kettle, fill.current)[1] == "object 2 contains uuid 4, which is not an object after the step"
    # and forgetting both is a wrong prediction
    assert not tg.states_match(tg.rebuild(fill.current, tg.empty_diff()), fill.next)


def test_removal_and_score_rebuild():
    drink = load_transitions(FIXTURE)[4]
    target = tg.format_target(tg.make_diff(drink.current, drink.next))
    assert target.endswith(',"r":[4],"s":{"s":1,"g":true,"w":true}}')
    diff, _ = tg.parse_diff(target, drink.current)
    rebuilt = tg.rebuild(drink.current, diff)
    assert 4 not in {o["uuid"] for o in rebuilt["objects"]}
    assert (rebuilt["score"], rebuilt["gameOver"], rebuilt["gameWon"]) == (1, True, True)


def test_rename_reaches_containers_not_in_the_diff():
    cup = _obj("cup (ID: 3)", 3, "Cup", {}, ["water"])
    water = _obj("water", 4, "Water", {"state": "liquid"})
    current = _state([cup, water])
    frozen = _state([_obj("cup (ID: 3)", 3, "Cup", {}, ["ice"]), _obj("ice", 4, "Water", {"state": "solid"})])
    target = tg.format_target(tg.make_diff(current, frozen))
    assert target == '{"m":[{"u":4,"N":"ice","p":{"state":"solid"}}]}'
    diff, _ = tg.parse_diff(target, current)
    assert tg.rebuild(current, diff)["objects"][0]["contains"] == ["ice"]


@pytest.mark.parametrize(
    "text, error",
    [
        ('{"m":[', "not valid JSON"),
        (HEATED_TARGET[:-3], "not valid JSON"),
        ("no change", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"x":[]}', "unknown diff keys ['x']"),
        ('{"r":[9]}', "removed uuid 9 is not an object of the current state"),
        ('{"r":["2"]}', "removed uuids must be integers"),
        ('{"r":[2,2]}', "removed lists a uuid twice"),
        ('{"r":2}', "r must be a list"),
        ('{"m":[{"u":2,"p":{"isOn":"yes"}}]}', "property 'isOn' must stay a boolean, got string"),
        ('{"m":[{"u":2,"p":{"temperature":true}}]}', "must stay a number, got boolean"),
        ('{"m":[{"u":2,"p":["isOn"]}]}', "properties p must be an object"),
        ('{"m":[{"u":2,"p":{"temperature":NaN}}]}', "NaN is not valid JSON"),
        ('{"m":[{"u":2,"p":{"temperature":1e999}}]}', "is not a finite number"),
        ('{"m":[{"u":2,"p":{"x":[[[[[[[[[1]]]]]]]]]}}]}', "nests deeper than 8 levels"),
        ('{"m":[{"u":"2","p":{"isOn":true}}]}', "object uuid u must be an integer"),
        ('{"m":[{"u":2,"n":"kettle","N":"kettle"}]}', "has both n (name without ID suffix) and N (full name)"),
        ('{"m":[{"u":2,"n":7}]}', "name must be a string"),
        ('{"m":[{"u":2,"t":null}]}', "type t must be a string"),
        ('{"m":[{"u":2,"q":1}]}', "unknown object keys ['q']; allowed: u, n or N, t, p, x, c or +/-"),
        ('{"m":[{"u":2,"c":[9]}]}', "contains uuid 9, which is not an object after the step"),
        ('{"m":[{"u":2,"c":[1.5]}]}', "object 2 c must list uuids"),
        ('{"m":[{"u":2,"c":2}]}', "object 2 c must be a list"),
        # contents gained (+) and lost (-): lists of uuids, not beside c
        ('{"m":[{"u":1,"+":[9]}]}', "contains uuid 9, which is not an object after the step"),
        ('{"m":[{"u":1,"+":0}]}', "object 1 + must be a list"),
        ('{"m":[{"u":1,"-":[true]}]}', "object 1 - must list uuids"),
        ('{"m":[{"u":1,"c":[0],"-":[2]}]}', "has both c (whole contents) and +/- (contents gained/lost)"),
        ('{"m":[{"u":5,"n":"cup","t":"Cup","+":[2]}]}', "object 5 is created, so it has no contents to change"),
        ('{"m":[{"u":2,"p":{"isOn":true}},{"u":2,"p":{"isOn":true}}]}', "modified lists a uuid twice"),
        ('{"m":[{"u":2,"p":{"isOn":true}}],"r":[2]}', "both modified and removed"),
        # removed properties: existing ones, as a list of names, not also set
        ('{"m":[{"u":2,"x":"isOn"}]}', "object 2 x must be a list"),
        ('{"m":[{"u":2,"x":[1]}]}', "x must list names of its current properties, got 1"),
        ('{"m":[{"u":2,"x":[["isOn"]]}]}', "x must list names of its current properties, got ['isOn']"),
        ('{"m":[{"u":2,"x":["colour"]}]}', "x must list names of its current properties, got 'colour'"),
        ('{"m":[{"u":2,"p":{"isOn":true},"x":["isOn"]}]}', "property 'isOn' is both set (p) and removed (x)"),
        ('{"m":[{"u":2,"x":["isOn","isOn"]}]}', "x lists a property twice"),
        # a created object (uuid not in the current state) comes in full, with nothing to remove
        ('{"m":[{"u":5,"t":"Cup"}]}', "object 5 is created (not in the current state), so it needs n or N (name) and t"),
        ('{"m":[{"u":5,"n":"cup"}]}', "object 5 is created (not in the current state), so it needs n or N (name) and t"),
        ('{"m":[{"u":5,"n":"cup","t":"Cup","x":["isOn"]}]}', "object 5 is created, so it has no properties to remove"),
        ('{"s":{"s":"1"}}', "score must be a number"),
        ('{"s":{"g":1}}', "gameOver must be true or false"),
        ('{"s":{"score":1}}', "unknown score keys ['score']"),
        ("[" * 100_000, "not valid JSON"),
    ],
)
def test_parse_diff_reports_errors(text, error):
    diff, message = tg.parse_diff(text, CURRENT)
    assert diff is None and error in message


@pytest.mark.parametrize(
    "text",
    [
        '{"m":[{"u":2}]}',
        '{"m":[{"u":2,"n":"kettle","t":"Kettle","p":{"isOn":false,"temperature":20}}]}',
        '{"m":[{"u":1,"c":[2,0]}]}',  # contents are a multiset
        '{"m":[{"u":1,"+":[2],"-":[2]}]}',
        '{"m":[{"u":1,"-":[3]}]}',  # losing what it does not hold loses nothing
        '{"m":[{"u":0,"-":[2]}]}',
        '{"m":[{"u":2,"x":[]}]}',
    ],
)
def test_an_entry_that_changes_nothing_is_a_no_op(text):
    diff, error = tg.parse_diff(text, CURRENT)
    assert error is None and tg.states_match(tg.rebuild(CURRENT, diff), CURRENT)


def test_parse_diff_accepts_created_object_with_fresh_uuid():
    text = '{"m":[{"u":5,"n":"cup","t":"Cup"},{"u":6,"N":"tea","t":"Tea","p":{"hot":true},"c":[5]},{"u":0,"c":[6]}]}'
    diff, error = tg.parse_diff(text, CURRENT)
    assert error is None
    rebuilt = tg.rebuild(CURRENT, diff)
    assert rebuilt["objects"][-2:] == [_obj("cup (ID: 5)", 5, "Cup", {}), _obj("tea", 6, "Tea", {"hot": True}, ["cup (ID: 5)"])]
    assert rebuilt["objects"][1]["contains"] == ["tea"]
    assert tg.format_target(diff) == text


# ---- correctness and rewards ----


def test_states_match_ignores_order_but_not_values():
    shuffled = _with(HEATED, o1={"contains": ["kettle (ID: 2)", "agent (ID: 0)"]})
    shuffled["objects"].reverse()
    assert tg.states_match(shuffled, HEATED)
    assert not tg.states_match(_with(HEATED, o2={"properties": {"isOn": 1}}), HEATED)
    assert not tg.states_match(_with(HEATED, gameWon=True), HEATED)
    extra = _with(HEATED)
    extra["objects"].append(_obj("cup (ID: 5)", 5, "Cup", {}))
    assert not tg.states_match(extra, HEATED)


def test_binary_reward():
    rewards = tg.binary_reward([HEATED_TARGET, "{}", "{oops"], current=[CURRENT] * 3, next=[HEATED] * 3, prompts=["p"] * 3)
    assert rewards[0] == {"score": 1.0} and rewards[1] == {"score": 0.0}
    assert rewards[2]["score"] == 0.0 and "not valid JSON" in rewards[2]["error"]


def test_outcome_matches_reads_score_and_win_but_not_the_objects():
    won = _with(HEATED, gameWon=True, gameOver=True)
    false_win = '{"m":[{"u":2,"p":{"isOn":true,"temperature":30.0}}],"s":{"g":true,"w":true}}'
    wrong_objects = '{"m":[{"u":2,"p":{"isOn":true}}]}'
    assert tg.outcome_matches(false_win, CURRENT, won) and not tg.outcome_matches(false_win, CURRENT, HEATED)
    assert not tg.outcome_matches(HEATED_TARGET, CURRENT, won)  # a missed win
    assert tg.outcome_matches(wrong_objects, CURRENT, HEATED) and not tg.outcome_matches("{oops", CURRENT, HEATED)


def test_task_reward_partial_credit_by_hand():
    forgot_heat = '{"m":[{"u":2,"p":{"isOn":true}}]}'
    spurious = '{"m":[{"u":2,"p":{"isOn":true,"temperature":30.0}},{"u":0,"p":{"isContainer":false}}]}'
    rewards = tg.task_reward([HEATED_TARGET, forgot_heat, spurious, "{}"], current=[CURRENT] * 4, next=[HEATED] * 4)
    # gold pairs: room (isContainer, contents), agent (isContainer, contents), kettle (isOn, temperature, contents) = 7;
    # changed pairs in the gold: kettle isOn and temperature
    assert rewards[0]["score"] == pytest.approx(0.09 + 0.01 + 0.2 + 1.0)
    assert rewards[1] == pytest.approx(
        {"score": 0.09 * 6 / 7 + 0.01 + 0.5, "property_acc": 6 / 7, "changed_property_acc": 0.5, "score_acc": 1.0, "exact": 0.0}
    )
    # a change the gold does not have joins the changed pairs: 2 right of 3
    assert rewards[2]["changed_property_acc"] == pytest.approx(2 / 3)
    assert rewards[2]["score"] == pytest.approx(0.09 * 6 / 7 + 0.01 + 2 / 3)
    assert rewards[3]["score"] == pytest.approx(0.09 * 5 / 7 + 0.01)


def test_task_reward_score_fields_and_unchanged_transition():
    won = _with(CURRENT, score=1, gameOver=True, gameWon=True)
    rewards = tg.task_reward(['{"s":{"s":1}}', "{}"], current=[CURRENT, CURRENT], next=[won, CURRENT])
    assert rewards[0]["score_acc"] == pytest.approx(1 / 3) and rewards[0]["changed_property_acc"] == 1.0
    assert rewards[0]["score"] == pytest.approx(0.09 + 0.01 / 3 + 1.0)
    assert rewards[1]["score"] == pytest.approx(1.3)


def test_task_reward_counts_removed_and_created_objects():
    removed = _with(CURRENT, o1={"contains": ["agent (ID: 0)"]})
    del removed["objects"][2]
    good = '{"m":[{"u":1,"c":[0]}],"r":[2]}'
    kept = '{"m":[{"u":1,"c":[0]}]}'
    rewards = tg.task_reward([good, kept], current=[CURRENT] * 2, next=[removed] * 2)
    assert rewards[0]["score"] == pytest.approx(1.3)
    # changed pairs: room contents, kettle isOn / temperature / contents (gone); kept the kettle: 1 of 4 right
    assert rewards[1]["changed_property_acc"] == pytest.approx(1 / 4) and rewards[1]["exact"] == 0.0


def test_rewards_reject_misaligned_columns():
    with pytest.raises(ValueError, match="must align"):
        tg.binary_reward(["{}"], current=[CURRENT], next=[])


# ---- accuracy, baseline, balancing ----


def test_accuracy_table_on_fixture():
    transitions = load_transitions(FIXTURE)
    gold = [tg.format_target(tg.make_diff(t.current, t.next)) for t in transitions]
    preds = [gold[0], gold[1], "{}", "not json", gold[4]]
    table = tg.accuracy_table(preds, transitions)
    assert table == {
        "accuracy": 3 / 5,
        "accuracy_changed": 2 / 4,
        "accuracy_unchanged": 1.0,
        "parse_failure_rate": 1 / 5,
        "win_recall": 1.0,  # the fixture's last transition wins, and its gold diff is among the predictions
        "win_precision": 1.0,
        "n": 5,
        "n_changed": 4,
        "n_wins": 1,
        "n_predicted_wins": 1,
    }
    baseline = tg.accuracy_table(tg.no_change_predictions(transitions), transitions)
    assert baseline["accuracy"] == 1 / 5 and baseline["accuracy_changed"] == 0.0
    assert baseline["win_recall"] == 0.0 and math.isnan(baseline["win_precision"])
    assert math.isnan(tg.accuracy_table(["{}"], transitions[:1])["accuracy_changed"])
    with pytest.raises(ValueError, match="one prediction per transition"):
        tg.accuracy_table(preds[:2], transitions)


def test_accuracy_table_scores_predicted_wins():
    won = {**HEATED, "score": 1, "gameWon": True, "gameOver": True}
    transitions = [Transition("t", 0, "", CURRENT, "a", won), Transition("t", 1, "", CURRENT, "a", won),
                   Transition("t", 2, "", CURRENT, "a", HEATED)]
    win = tg.format_target(tg.make_diff(CURRENT, won))
    table = tg.accuracy_table([win, tg.format_target(tg.make_diff(CURRENT, HEATED)), win], transitions)
    assert table["n_wins"] == 2 and table["win_recall"] == 1 / 2, "the second win was predicted as a plain step"
    assert table["win_precision"] == 1 / 2 and table["n_predicted_wins"] == 2, \
        "the third transition does not win but was predicted to"
    assert tg.accuracy_table(["not json"], transitions[:1])["win_recall"] == 0.0


def _kettle_transitions(n_changed, n_unchanged):
    return [Transition("t", i, "", CURRENT, "a", HEATED) for i in range(n_changed)] + [
        Transition("t", n_changed + i, "", CURRENT, "a", CURRENT) for i in range(n_unchanged)
    ]


def test_balance_samples_to_ratio():
    transitions = _kettle_transitions(50, 100)
    sample = tg.balance(transitions, changed=100, unchanged=40, seed=0)
    changed = [t for t in sample if tg.is_changed(t.current, t.next)]
    assert len(changed) == 50 and len(sample) - len(changed) == 20
    assert sample == tg.balance(transitions, changed=100, unchanged=40, seed=0)
    assert sample != tg.balance(transitions, changed=100, unchanged=40, seed=1)
    few_unchanged = tg.balance(_kettle_transitions(50, 2), changed=100, unchanged=5, seed=0)
    assert sum(tg.is_changed(t.current, t.next) for t in few_unchanged) == 40 and len(few_unchanged) == 42
    assert len(tg.balance(transitions, changed=1, unchanged=0)) == 50
    # One kind only (an agent that wins by the shortest path changes the state at every step): all of it is kept.
    assert sorted(t.state_id for t in tg.balance(_kettle_transitions(7, 0), seed=0)) == list(range(7))
    assert len(tg.balance(_kettle_transitions(0, 3), seed=0)) == 3
    with pytest.raises(ValueError, match="not both 0"):
        tg.balance(transitions, changed=0, unchanged=0)


# ---- real shared data (skipped when absent) ----

VALID = data_dir() / "valid.jsonl.gz"
needs_shared = pytest.mark.skipif(not VALID.is_file(), reason=f"shared ByteSized32 data not found at {VALID}")


@pytest.fixture(scope="module")
def valid():
    return load_transitions(VALID)


@needs_shared
def test_real_valid_split_counts_and_no_change_baseline(valid):
    assert len(valid) == 1485
    assert sum(tg.is_changed(t.current, t.next) for t in valid) == 430  # the data's README
    table = tg.accuracy_table(tg.no_change_predictions(valid), valid)
    assert table["accuracy"] == pytest.approx(1055 / 1485) and table["parse_failure_rate"] == 0.0


@needs_shared
def test_real_valid_gold_targets_round_trip(valid):
    targets = [tg.format_target(tg.make_diff(t.current, t.next)) for t in valid]
    table = tg.accuracy_table(targets, valid)
    assert table["accuracy"] == 1.0 and table["parse_failure_rate"] == 0.0
    some = valid[:200]
    rewards = tg.task_reward(targets[:200], current=[t.current for t in some], next=[t.next for t in some])
    assert all(r["score"] == pytest.approx(1.3) for r in rewards)


@needs_shared
def test_real_valid_prompts_are_short(valid):
    lengths = sorted(len(tg.format_prompt(t.current, t.action, t.task)) for t in valid)
    assert lengths[len(lengths) // 2] < 1700 and lengths[-1] < 3500


# ---- property-based: nothing a model writes makes parsing or rewards raise ----

_VALID_TARGETS = [tg.format_target(tg.make_diff(t.current, t.next)) for t in load_transitions(FIXTURE)] + [HEATED_TARGET]
_FIXTURE_PAIRS = [(t.current, t.next) for t in load_transitions(FIXTURE)]
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(list("unNtpxc+-mrsgw") + ["isOn"]), inner, max_size=5),
    max_leaves=30,
)


_PROPERTY_VALUES = (
    st.none() | st.booleans() | st.integers(-3, 200) | st.floats() | st.text(max_size=4) | st.lists(st.none(), max_size=2)
)
_PROPERTY_NAMES = st.sampled_from(["isOn", "temperature", "isContainer", "stateOfMatter", "connects"])
_WIRE_OBJECTS = st.fixed_dictionaries(
    {"u": st.integers(-1, 6)},
    optional={
        "t": st.text(max_size=5),
        "n": st.text(max_size=8),
        "N": st.text(max_size=8),
        "p": st.dictionaries(_PROPERTY_NAMES, _PROPERTY_VALUES, max_size=4),
        "x": st.lists(_PROPERTY_NAMES, max_size=2) | _PROPERTY_VALUES,
        "c": st.lists(st.integers(-1, 6) | st.sampled_from(["water", "x"]), max_size=3),
        "+": st.lists(st.integers(-1, 6) | st.sampled_from(["water", "x"]), max_size=3),
        "-": st.lists(st.integers(-1, 6) | st.sampled_from(["water", "x"]), max_size=3),
    },
)
_WIRE_DIFFS = st.fixed_dictionaries(
    {},
    optional={
        "m": st.lists(_WIRE_OBJECTS, max_size=3),
        "r": st.lists(st.integers(-1, 6), max_size=3),
        "s": st.fixed_dictionaries({}, optional={"s": _PROPERTY_VALUES, "g": _PROPERTY_VALUES, "w": _PROPERTY_VALUES}),
    },
)


@st.composite
def _mutated_target(draw):
    text = draw(st.sampled_from(_VALID_TARGETS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(len(text) - 1, 0)))
        kind = draw(st.sampled_from(["truncate", "flip", "delete", "insert"]))
        if kind == "truncate":
            text = text[:i]
        elif kind == "flip":
            text = text[:i] + draw(st.sampled_from('{}[]":,0123456789-.etruefalsnN x\\')) + text[i + 1 :]
        elif kind == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 5)) :]
        else:
            text = text[:i] + draw(st.text(max_size=4)) + text[i:]
    return text


def _check_never_raises(text, pair_index):
    current, gold = _FIXTURE_PAIRS[pair_index]
    diff, error = tg.parse_diff(text, current)
    assert (diff is None) != (error is None)
    if diff is not None:
        tg.states_match(tg.rebuild(current, diff), gold)
        tg.format_target(diff)
    for reward in (tg.binary_reward, tg.task_reward):
        (r,) = reward([text], current=[current], next=[gold])
        assert 0.0 <= r["score"] <= 1.3 + 1e-9
        assert ("error" in r) == (error is not None)


_PROPERTY_SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY_SETTINGS
@given(st.text(max_size=200), st.integers(0, len(_FIXTURE_PAIRS) - 1))
def test_random_strings_never_raise(text, pair_index):
    _check_never_raises(text, pair_index)


@_PROPERTY_SETTINGS
@given(_mutated_target(), st.integers(0, len(_FIXTURE_PAIRS) - 1))
def test_mutated_targets_never_raise(text, pair_index):
    _check_never_raises(text, pair_index)


@_PROPERTY_SETTINGS
@given(_JSON_VALUES | _WIRE_DIFFS, st.integers(0, len(_FIXTURE_PAIRS) - 1))
def test_random_json_never_raises(value, pair_index):
    _check_never_raises(json.dumps(value), pair_index)

"""Text-game domain: ByteSized32 states, compact prompts, diff targets, parsing, rebuilding, rewards and accuracy.
(Longer than 500 lines: one state schema's format, parser, rebuild and scores, which every text module builds on.)

State (the benchmark's field names):
    {"objects": [{"name", "uuid", "type", "properties", "contains"}, ...], "score", "gameOver", "gameWon"}
`properties` is a game-specific dict; `contains` lists the names of directly contained objects, in no meaningful order.

Prompt: one line of compact JSON, `{"q": task, "o": [objects], "s": {"s": score, "g": gameOver, "w": gameWon},
"a": action}`, then a newline. The task (`taskDesc`, a TextWorld game's objective) is there because it decides which
action wins. An object is `{"u": uuid, "n": name, "t": type, "p": properties, "c": [uuids]}`, where:
- `n` drops the name's ` (ID: <uuid>)` suffix, which repeats the uuid; a name without that suffix goes under `N` verbatim;
- `c` lists contained objects by uuid (a name matching no object stays a string), so a renamed object
  (water -> ice) keeps its place in its container;
- empty `p` and `c` are left out.

Target: the diff, in the same compact JSON, `{"m": [object changes], "r": [removed uuids], "s": {changed score
fields}}`; empty parts are left out, so "no change" is `{}`. An object change lists only what differs:
- an object of the current state: `u` and, of its fields, those that change: `n`/`N` (renamed), `t` (new type),
  `p` (the properties whose value changes or that are added), `x` (sorted names of removed properties), `+` and
  `-` (the uuids its contents gain and lose, as multisets: taking key 7 from room 2 is `{"u":0,"+":[7]},
  {"u":2,"-":[7]}`). `c` (the whole new contents) is also read, but not beside `+` or `-`; it is what the shipped
  checkpoints write, and a model that writes it is trained on it (`contents="whole"`, `train.textgame.contents_form`).
  Gold targets never hold an entry that changes nothing; a predicted one is read as the no-op it is (rejecting it
  ended most of the learned TextWorld env's episodes, e.g. `{"u":4,"p":{"isLocked":true}}` for a box that stays
  locked), and so is a `-` of what the object does not hold (a wrong uuid: rejecting it ended 75-100% of the learned
  env's episodes in `rlvr-gym evaluate-policies textgame`);
- an object the action creates (its uuid is not in the current state): in full, as in the prompt (`n`/`N` and `t`
  required, a missing `p` or `c` is empty, no `x`).
Changed objects used to be re-emitted in full; small models got which objects change and how, but garbled the fields
they had to copy (room names, exits, property dicts). Listing only changed fields cuts the mean target of a changed
transition from 90 to 31 tokens on ByteSized32 train (p95 193 -> 84) and from 101 to 23 on TextWorld (p95 129 -> 33),
with the textgame-sft tokenizer. Whole contents lists made the model copy every other uuid of both containers of a
move or a take; `+`/`-` name the moved object twice. Thirty SFT minutes from textgame-sft in each form: changed
accuracy on held-out TextWorld games 0.442 against 0.115. Unchanged fields repeated next to a change are accepted:
they rebuild the same state. A target in the old full form is not always read as meant: its absent `c` meant empty and
its absent properties removed, where here both mean unchanged.

In Python a diff is `{"modified": [changes], "removed": [uuids], "score": {field: value}}`; a change is `{"uuid": u}`
plus those of `name`, `type`, `properties`, `removed_properties`, `contains`, `added_contents`, `removed_contents`
(uuids) that it sets. The next state is rebuilt from the current one by merging each change into its object, or into
an empty one for a created object. `parse_diff` rejects what cannot be rebuilt: malformed or truncated JSON, unknown
keys, removed or contained uuids that do not exist, removed properties that do not exist or are also set, and an
existing property whose value changes kind (boolean, number, string, list, object; null may become or replace any).

Objects created by the action (e.g. water from a tap) count here: they appear in the diff and a prediction is
correct only if it creates them. The benchmark's own scorer drops them; we keep them because a simulator that
cannot create objects cannot be stepped.

Comparisons are strict about kind (True is not 1) and lenient where the games are: ints equal floats of the same
value, lists equal tuples, and `contains` is compared as a multiset of names.

Reward definitions (pairs are `(object uuid, property)`, with an object's `contains` counted as one more property):
- property_acc: fraction of the gold next state's pairs whose value the prediction gets right;
- changed_property_acc: over the pairs whose value (absence included: creation, removal) differs from the
  current state in the gold next state or in the prediction, the fraction where prediction and gold agree;
  1.0 when neither changes any pair, so inventing changes costs as much as missing them;
- score_acc: fraction of score, gameOver, gameWon predicted right;
- exact: the rebuilt state matches the gold one (`states_match`).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from rlvr_gym.data.bytesized32 import Transition


class GameObject(TypedDict):
    name: str
    uuid: int
    type: str
    properties: dict[str, Any]
    contains: list[str]


class State(TypedDict):
    objects: list[GameObject]
    score: float
    gameOver: bool
    gameWon: bool


SCORE_FIELDS = ("score", "gameOver", "gameWon")
_SCORE_KEYS = {"score": "s", "gameOver": "g", "gameWon": "w"}
_SCORE_FIELD_OF = {v: k for k, v in _SCORE_KEYS.items()}
_OBJECT_KEYS = {"u", "n", "N", "t", "p", "x", "c", "+", "-"}
CONTENTS_FORMS = ("delta", "whole")
"""How a target writes an object's changed contents: what it gains and loses (`+`/`-`), or its whole new list (`c`)."""
_CHANGE_KEYS = {"type": "t", "properties": "p", "removed_properties": "x", "contains": "c", "added_contents": "+",
                "removed_contents": "-"}
# what a created object is changed from: every field differs, so its change lists it in full
_NOTHING = {"name": None, "type": None, "properties": {}, "contains": []}
_DIFF_KEYS = {"m", "r", "s"}
_ID_SUFFIX = re.compile(r"^(.*) \(ID: (-?\d+)\)$", re.DOTALL)
_MAX_DEPTH = 8  # property values nest 3 deep in the games; a bound keeps recursion safe on model output


def empty_diff() -> dict[str, Any]:
    """The diff of a step that changes nothing."""
    return {"modified": [], "removed": [], "score": {}}


def is_changed(current: State, next: State) -> bool:
    """Whether any object property, contents (as a multiset), the object set or a score field differs."""
    cur = {o["uuid"]: o for o in current["objects"]}
    nxt = {o["uuid"]: o for o in next["objects"]}
    if cur.keys() != nxt.keys():
        return True
    if not _same_outcome(current, next):
        return True
    return any(
        _canon(cur[u]["properties"]) != _canon(nxt[u]["properties"])
        or sorted(cur[u]["contains"]) != sorted(nxt[u]["contains"])
        for u in cur
    )


def format_prompt(state: State, action: str, task: str) -> str:
    """The model's input: the game's task, objects, score and action as one line of compact JSON, ending in a newline.

    The task decides which action wins: a TextWorld game's quest differs per game, and models given the state and the
    action alone never predicted a win in held-out games."""
    prompt = {
        "q": task,
        "o": [_wire_object(o) for o in _by_uuid_contents(state)],
        "s": {_SCORE_KEYS[f]: state[f] for f in SCORE_FIELDS},
        "a": action,
    }
    return _dumps(prompt) + "\n"


def make_diff(current: State, next: State, contents: str = "delta") -> dict[str, Any]:
    """The gold diff from `current` to `next`: each changed object's changed fields (created objects in full), removed
    uuids, changed score fields. `contents`: "delta" writes a changed object's contents as what it gains and loses
    (`+`/`-`), "whole" as its whole new list (`c`)."""
    if contents not in CONTENTS_FORMS:
        raise ValueError(f"contents is one of {CONTENTS_FORMS}, got {contents!r}")
    before = {o["uuid"]: o for o in _by_uuid_contents(current)}
    changes = [_object_change(before.get(o["uuid"], _NOTHING), o, contents) for o in _by_uuid_contents(next)]
    next_uuids = {o["uuid"] for o in next["objects"]}
    return {
        "modified": [c for c in changes if len(c) > 1],
        "removed": [u for u in before if u not in next_uuids],
        "score": {f: next[f] for f in SCORE_FIELDS if _canon(current[f]) != _canon(next[f])},
    }


def format_target(diff: dict[str, Any]) -> str:
    """The diff as compact JSON with a fixed key order; empty parts are left out."""
    wire: dict[str, Any] = {}
    if diff["modified"]:
        wire["m"] = [_wire_change(c) for c in diff["modified"]]
    if diff["removed"]:
        wire["r"] = list(diff["removed"])
    if diff["score"]:
        wire["s"] = {_SCORE_KEYS[f]: diff["score"][f] for f in SCORE_FIELDS if f in diff["score"]}
    return _dumps(wire)


def parse_diff(text: str, current: State) -> tuple[dict[str, Any] | None, str | None]:
    """Decode a model's target against the state it was predicted from: `(diff, None)` or `(None, error)`; never raises."""
    try:
        return _parse_diff(text, current), None
    except _DiffError as e:
        return None, str(e)
    except (ValueError, RecursionError) as e:
        return None, f"not valid JSON: {e}"


def rebuild(current: State, diff: dict[str, Any]) -> State:
    """The next state: `current` with the diff's changes merged into their objects, created objects appended,
    removals dropped, score fields updated."""
    removed = set(diff["removed"])
    changes = {c["uuid"]: c for c in diff["modified"]}
    old = _by_uuid_contents(current)
    objects = [_apply_change(o, changes.pop(o["uuid"])) if o["uuid"] in changes else o for o in old if o["uuid"] not in removed]
    objects += [_apply_change(_NOTHING, c) for c in changes.values()]
    # contents are uuids until here; a uuid maps to its name after the step (renames reach unchanged containers)
    names = {o["uuid"]: o["name"] for o in old} | {o["uuid"]: o["name"] for o in objects}
    return {
        "objects": [
            {**o, "contains": [names.get(c, str(c)) if isinstance(c, int) else c for c in o["contains"]]} for o in objects
        ],
        "score": diff["score"].get("score", current["score"]),
        "gameOver": diff["score"].get("gameOver", current["gameOver"]),
        "gameWon": diff["score"].get("gameWon", current["gameWon"]),
    }


def states_match(pred: State, gold: State) -> bool:
    """Same object set, and every object's properties and contents, score, gameOver and gameWon equal."""
    return _pair_values(pred) == _pair_values(gold) and _same_outcome(pred, gold)


def _same_outcome(a: State, b: State) -> bool:
    return all(_canon(a[f]) == _canon(b[f]) for f in SCORE_FIELDS)


def outcome_matches(completion: str, current: State, next: State) -> bool:
    """Whether a completion parses and predicts the gold score, gameOver and gameWon: what a simulator pays on."""
    diff, error = parse_diff(completion, current)
    if error is not None:
        return False
    return _same_outcome(rebuild(current, diff), next)


def binary_reward(completions: list[str], current: list[State], next: list[State], **_: Any) -> list[dict[str, Any]]:
    """1.0 when the completion's diff rebuilds the gold next state exactly, else 0.0 (TRL-style reward function)."""
    rewards = []
    for completion, cur, gold in _aligned(completions, current, next):
        diff, error = parse_diff(completion, cur)
        if error is not None:
            rewards.append({"score": 0.0, "error": error})
            continue
        rewards.append({"score": float(states_match(rebuild(cur, diff), gold))})
    return rewards


def task_reward(completions: list[str], current: list[State], next: list[State], **_: Any) -> list[dict[str, Any]]:
    """`0.09·property_acc + 0.01·score_acc + 0.2·exact + changed_property_acc` (definitions in the module docstring)."""
    rewards = []
    for completion, cur, gold in _aligned(completions, current, next):
        diff, error = parse_diff(completion, cur)
        if error is not None:
            rewards.append({"score": 0.0, "error": error})
            continue
        parts = _task_components(cur, rebuild(cur, diff), gold)
        score = 0.09 * parts["property_acc"] + 0.01 * parts["score_acc"] + 0.2 * parts["exact"] + parts["changed_property_acc"]
        rewards.append({"score": score, **parts})
    return rewards


def accuracy_table(preds: Sequence[str], transitions: Sequence[Transition]) -> dict[str, float]:
    """Exact-match accuracy of predicted targets, overall and on changed / unchanged transitions, and how well wins
    are predicted (a simulator that never predicts the winning step cannot tell good policies from bad): win_recall
    over the transitions that win (n_wins), win_precision over those predicted to win (n_predicted_wins; NaN where
    there are none)."""
    if len(preds) != len(transitions) or not transitions:
        raise ValueError(f"need one prediction per transition and at least one: got {len(preds)} and {len(transitions)}")
    correct = {True: [], False: []}
    failures = 0
    predicted_win_when_won, won_when_predicted = [], []
    for text, t in zip(preds, transitions):
        diff, error = parse_diff(text, t.current)
        failures += error is not None
        predicted = rebuild(t.current, diff) if error is None else None
        correct[is_changed(t.current, t.next)].append(predicted is not None and states_match(predicted, t.next))
        won = wins(t.current, t.next)
        predicts_win = predicted is not None and wins(t.current, predicted)
        if won:
            predicted_win_when_won.append(predicts_win)
        if predicts_win:
            won_when_predicted.append(won)
    n = len(transitions)
    return {
        "accuracy": (sum(correct[True]) + sum(correct[False])) / n,
        "accuracy_changed": _mean(correct[True]),
        "accuracy_unchanged": _mean(correct[False]),
        "parse_failure_rate": failures / n,
        "win_recall": _mean(predicted_win_when_won),
        "win_precision": _mean(won_when_predicted),
        "n": n,
        "n_changed": len(correct[True]),
        "n_wins": len(predicted_win_when_won),
        "n_predicted_wins": len(won_when_predicted),
    }


def wins(current: State, next: State) -> bool:
    """Whether the step from `current` to `next` wins the game (only the gameWon fields are read)."""
    return bool(next["gameWon"]) and not current["gameWon"]


def no_change_predictions(transitions: Sequence[Transition]) -> list[str]:
    """The "no change" baseline: the empty diff for every transition."""
    return [format_target(empty_diff())] * len(transitions)


def balance(transitions: Sequence[Transition], changed: int = 100, unchanged: int = 40, seed: int = 0) -> list[Transition]:
    """A shuffled sample with changed:unchanged transitions in the given ratio, keeping all of the scarcer kind.
    Transitions of one kind only are all kept: no ratio can be met, and keeping none would leave nothing to train on
    (an agent that wins each game by its shortest path changes the state at every step).

    The paper trains on 100:40 for the binary reward and 100:5 for the task-specific one.
    """
    if changed < 0 or unchanged < 0 or changed + unchanged == 0:
        raise ValueError(f"changed and unchanged must be non-negative and not both 0, got {changed}:{unchanged}")
    rng = random.Random(seed)
    kinds = {True: [], False: []}
    for t in transitions:
        kinds[is_changed(t.current, t.next)].append(t)
    n_changed, n_unchanged = len(kinds[True]), len(kinds[False])
    if changed == 0 or unchanged == 0:
        n_changed, n_unchanged = (n_changed, 0) if unchanged == 0 else (0, n_unchanged)
    elif n_changed == 0 or n_unchanged == 0:
        pass
    elif n_changed * unchanged > n_unchanged * changed:
        n_changed = n_unchanged * changed // unchanged
    else:
        n_unchanged = n_changed * unchanged // changed
    sample = rng.sample(kinds[True], n_changed) + rng.sample(kinds[False], n_unchanged)
    rng.shuffle(sample)
    return sample


class _DiffError(Exception):
    pass


def _parse_diff(text: str, current: State) -> dict[str, Any]:
    if not isinstance(text, str):
        raise _DiffError(f"completion must be a string, got {type(text).__name__}")
    wire = json.loads(text, parse_constant=_reject_constant)
    if not isinstance(wire, dict):
        raise _DiffError(f"expected a JSON object {{m, r, s}}, got {type(wire).__name__}")
    if unknown := set(wire) - _DIFF_KEYS:
        raise _DiffError(f"unknown diff keys {sorted(unknown)}; allowed: m (modified), r (removed), s (score)")
    current_objects = {o["uuid"]: o for o in current["objects"]}
    current_uuids = current_objects.keys()

    removed = _list(wire.get("r", []), "r")
    for u in removed:
        if not _is_int(u):
            raise _DiffError(f"removed uuids must be integers, got {u!r}")
        if u not in current_uuids:
            raise _DiffError(f"removed uuid {u} is not an object of the current state")
    if len(set(removed)) != len(removed):
        raise _DiffError("removed lists a uuid twice")

    modified = [_parse_change(o, current_objects) for o in _list(wire.get("m", []), "m")]
    uuids = [o["uuid"] for o in modified]
    if len(set(uuids)) != len(uuids):
        raise _DiffError("modified lists a uuid twice")
    if both := set(uuids) & set(removed):
        raise _DiffError(f"uuids {sorted(both)} are both modified and removed")
    present = (current_uuids - set(removed)) | set(uuids)
    for o in modified:
        for c in o.get("contains", []) + o.get("added_contents", []):
            if _is_int(c) and c not in present:
                raise _DiffError(f"object {o['uuid']} contains uuid {c}, which is not an object after the step")

    score_wire = wire.get("s", {})
    if not isinstance(score_wire, dict):
        raise _DiffError(f"s (score) must be an object, got {type(score_wire).__name__}")
    if unknown := set(score_wire) - set(_SCORE_FIELD_OF):
        raise _DiffError(f"unknown score keys {sorted(unknown)}; allowed: s (score), g (gameOver), w (gameWon)")
    score = {_SCORE_FIELD_OF[k]: v for k, v in score_wire.items()}
    if "score" in score and not _is_number(score["score"]):
        raise _DiffError(f"score must be a number, got {score['score']!r}")
    for f in ("gameOver", "gameWon"):
        if f in score and not isinstance(score[f], bool):
            raise _DiffError(f"{f} must be true or false, got {score[f]!r}")
    return {"modified": modified, "removed": removed, "score": score}


def _parse_change(wire: Any, current_objects: dict[int, dict[str, Any]]) -> dict[str, Any]:
    if not isinstance(wire, dict):
        raise _DiffError(f"a modified object must be a JSON object, got {type(wire).__name__}")
    if unknown := set(wire) - _OBJECT_KEYS:
        raise _DiffError(f"unknown object keys {sorted(unknown)}; allowed: u, n or N, t, p, x, c or +/-")
    uuid = wire.get("u")
    if not _is_int(uuid):
        raise _DiffError(f"object uuid u must be an integer, got {uuid!r}")
    old = current_objects.get(uuid)
    if "n" in wire and "N" in wire:
        raise _DiffError(f"object {uuid} has both n (name without ID suffix) and N (full name); write one")
    if old is None and not ({"n", "N"} & wire.keys() and "t" in wire):
        raise _DiffError(f"object {uuid} is created (not in the current state), so it needs n or N (name) and t (type)")
    change: dict[str, Any] = {"uuid": uuid}
    if "n" in wire or "N" in wire:
        name = wire.get("n", wire.get("N"))
        if not isinstance(name, str):
            raise _DiffError(f"object {uuid} name must be a string, got {name!r}")
        change["name"] = f"{name} (ID: {uuid})" if "n" in wire else name
    if "t" in wire:
        if not isinstance(wire["t"], str):
            raise _DiffError(f"object {uuid} type t must be a string, got {wire['t']!r}")
        change["type"] = wire["t"]
    if "p" in wire:
        change["properties"] = _parse_properties(wire["p"], uuid, old)
    if "x" in wire:
        change["removed_properties"] = _parse_removed_properties(wire["x"], uuid, old, change.get("properties", {}))
    if "c" in wire and {"+", "-"} & wire.keys():
        raise _DiffError(f"object {uuid} has both c (whole contents) and +/- (contents gained/lost); write one")
    if old is None and {"+", "-"} & wire.keys():
        raise _DiffError(f"object {uuid} is created, so it has no contents to change: list them in full with c")
    for key, field in (("c", "contains"), ("+", "added_contents"), ("-", "removed_contents")):
        if key in wire:
            change[field] = _contents(wire[key], f"object {uuid} {key}")
    return change


def _contents(value: Any, where: str) -> list:
    contents = _list(value, where)
    for c in contents:
        if not (_is_int(c) or isinstance(c, str)):
            raise _DiffError(f"{where} must list uuids, got {c!r}")
    return contents


def _parse_properties(properties: Any, uuid: int, old: dict[str, Any] | None) -> dict[str, Any]:
    if not isinstance(properties, dict):
        raise _DiffError(f"object {uuid} properties p must be an object, got {type(properties).__name__}")
    for key, value in properties.items():
        if problem := _check_value(value):
            raise _DiffError(f"object {uuid} property {key!r} {problem}")
        if old is not None and key in old["properties"] and not _same_kind(old["properties"][key], value):
            raise _DiffError(
                f"object {uuid} property {key!r} must stay a {_kind(old['properties'][key])}, got {_kind(value)} {value!r}"
            )
    return properties


def _parse_removed_properties(keys: Any, uuid: int, old: dict[str, Any] | None, properties: dict[str, Any]) -> list[str]:
    if old is None:
        raise _DiffError(f"object {uuid} is created, so it has no properties to remove: drop x")
    keys = _list(keys, f"object {uuid} x")
    for key in keys:
        if not isinstance(key, str) or key not in old["properties"]:
            raise _DiffError(f"object {uuid} x must list names of its current properties, got {key!r}")
        if key in properties:
            raise _DiffError(f"object {uuid} property {key!r} is both set (p) and removed (x)")
    if len(set(keys)) != len(keys):
        raise _DiffError(f"object {uuid} x lists a property twice")
    return keys


def _object_change(old: dict[str, Any], new: dict[str, Any], contents: str) -> dict[str, Any]:
    """The uuid and the fields of `new` that differ from `old` (contents by uuid, as a multiset)."""
    change: dict[str, Any] = {"uuid": new["uuid"]}
    if new["name"] != old["name"]:
        change["name"] = new["name"]
    if new["type"] != old["type"]:
        change["type"] = new["type"]
    before = old["properties"]
    if properties := {k: v for k, v in new["properties"].items() if k not in before or _canon(v) != _canon(before[k])}:
        change["properties"] = properties
    if removed := sorted(before.keys() - new["properties"].keys()):
        change["removed_properties"] = removed
    if old is _NOTHING:
        if new["contains"]:
            change["contains"] = new["contains"]
        return change
    if contents == "whole":
        if sorted(map(_canon, new["contains"])) != sorted(map(_canon, old["contains"])):
            change["contains"] = new["contains"]
        return change
    # an existing object's contents change by what it gains and loses (the module docstring says why)
    had, has = Counter(old["contains"]), Counter(new["contains"])
    if added := sorted((has - had).elements(), key=_uuid_first):
        change["added_contents"] = added
    if lost := sorted((had - has).elements(), key=_uuid_first):
        change["removed_contents"] = lost
    return change


def _uuid_first(item: int | str) -> tuple:
    return (isinstance(item, str), item)


def _apply_change(old: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    removed = set(change.get("removed_properties", ()))
    return {
        "name": change.get("name", old["name"]),
        "uuid": change["uuid"],
        "type": change.get("type", old["type"]),
        "properties": {k: v for k, v in old["properties"].items() if k not in removed} | change.get("properties", {}),
        "contains": _changed_contents(change.get("contains", old["contains"]), change),
    }


def _changed_contents(contents: list, change: dict[str, Any]) -> list:
    contents = list(contents)
    for c in change.get("removed_contents", ()):
        if c in contents:
            contents.remove(c)
    return contents + list(change.get("added_contents", ()))


def _by_uuid_contents(state: State) -> list[dict[str, Any]]:
    """The state's objects with `contains` as uuids (first object of that name), unmatched names kept as strings."""
    uuid_of: dict[str, int] = {}
    for o in state["objects"]:
        uuid_of.setdefault(o["name"], o["uuid"])
    return [{**o, "contains": [uuid_of.get(name, name) for name in o["contains"]]} for o in state["objects"]]


def _wire_object(obj: dict[str, Any]) -> dict[str, Any]:
    wire: dict[str, Any] = {"u": obj["uuid"], **_wire_name(obj["name"], obj["uuid"]), "t": obj["type"]}
    if obj["properties"]:
        wire["p"] = obj["properties"]
    if obj["contains"]:
        wire["c"] = obj["contains"]
    return wire


def _wire_change(change: dict[str, Any]) -> dict[str, Any]:
    wire: dict[str, Any] = {"u": change["uuid"]}
    if "name" in change:
        wire |= _wire_name(change["name"], change["uuid"])
    return wire | {key: change[field] for field, key in _CHANGE_KEYS.items() if field in change}


def _wire_name(name: str, uuid: int) -> dict[str, str]:
    match = _ID_SUFFIX.match(name)
    return {"n": match.group(1)} if match and match.group(2) == str(uuid) else {"N": name}


def _pair_values(state: State) -> dict[tuple, Any]:
    """`(uuid, "p", key)` and `(uuid, "c")` pairs of a state, with canonical values."""
    pairs: dict[tuple, Any] = {}
    for o in state["objects"]:
        for key, value in o["properties"].items():
            pairs[(o["uuid"], "p", key)] = _canon(value)
        pairs[(o["uuid"], "c")] = tuple(sorted(map(_canon, o["contains"])))
    return pairs


def _task_components(current: State, pred: State, gold: State) -> dict[str, float]:
    cur, prd, gld = _pair_values(current), _pair_values(pred), _pair_values(gold)
    missing = object()
    property_acc = sum(prd.get(k, missing) == v for k, v in gld.items()) / max(len(gld), 1)
    changed = {k for k in cur.keys() | gld.keys() if cur.get(k, missing) != gld.get(k, missing)}
    changed |= {k for k in cur.keys() | prd.keys() if cur.get(k, missing) != prd.get(k, missing)}
    agree = sum(prd.get(k, missing) == gld.get(k, missing) for k in changed)
    return {
        "property_acc": property_acc,
        "changed_property_acc": agree / len(changed) if changed else 1.0,
        "score_acc": sum(_canon(pred[f]) == _canon(gold[f]) for f in SCORE_FIELDS) / len(SCORE_FIELDS),
        "exact": float(states_match(pred, gold)),
    }


def _canon(value: Any) -> Any:
    """A hashable form in which True != 1, 2 == 2.0, and lists equal tuples."""
    if value is None:
        return ("null",)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, (list, tuple)):
        return ("l", tuple(_canon(v) for v in value))
    if isinstance(value, dict):
        return ("d", tuple(sorted((str(k), _canon(v)) for k, v in value.items())))
    return ("o", repr(value))


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "null"


def _same_kind(old: Any, new: Any) -> bool:
    return old is None or new is None or _kind(old) == _kind(new)


def _check_value(value: Any) -> str | None:
    """Why a property value is unusable (nested too deep, or a non-finite number), or None; never recurses."""
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > _MAX_DEPTH:
            return f"nests deeper than {_MAX_DEPTH} levels"
        if any(isinstance(v, float) and not math.isfinite(v) for v in level):
            return "is not a finite number"
        level = [v for x in level if isinstance(x, (list, dict)) for v in (x.values() if isinstance(x, dict) else x)]
    return None


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise _DiffError(f"{where} must be a list, got {type(value).__name__}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _reject_constant(name: str) -> Any:
    raise _DiffError(f"{name} is not valid JSON; write a finite number")


def _aligned(completions: list[str], current: list[State], next: list[State]) -> Iterator[tuple[str, State, State]]:
    if not len(completions) == len(current) == len(next):
        raise ValueError(
            f"completions, current and next must align, got {len(completions)}, {len(current)}, {len(next)}: "
            "pass one current and one next state per completion"
        )
    return zip(completions, current, next)


def _mean(values: list[bool]) -> float:
    return sum(values) / len(values) if values else math.nan


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


REWARDS = {"binary": binary_reward, "task": task_reward}


DEFAULT_BALANCE = {"binary": (100, 40), "task": (100, 5)}

"""Web domain: diffs of accessibility-tree lines, the target format, applying diffs, item F1 and the reward."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr_gym.domains.web import (
    apply_diff,
    expand_diff,
    format_prompt,
    format_target,
    item_f1,
    make_diff,
    no_change_target,
    parse_target,
    web_reward,
)

BEFORE = "\n".join([
    "[1] RootWebArea 'Task' focused: true",
    "\t[2] textbox 'From:'",
    "\t[3] list '' hidden: true",
    "\t[4] button 'Search'",
    "\t[5] link 'Old result'",
    "\t[6] StaticText 'old.example.com'",
    "\t[7] list ''",
])
AFTER = "\n".join([
    "[1] RootWebArea 'Task' focused: true",
    "\t[2] textbox 'From:' value: 'Anv' focused: true",
    "\t[3] list ''",
    "\t\t[8] listitem '' level: 1",
    "\t\t\t[9] StaticText 'Anvik, AK (ANV)'",
    "\t[4] button 'Search'",
    "\t[10] link 'New result'",
    "\t[11] StaticText 'new.example.com'",
    "\t[7] list ''",
])
DIFF = {
    "new": [
        "\t\t[8] listitem '' level: 1",
        "\t\t\t[9] StaticText 'Anvik, AK (ANV)'",
        "\t[10] link 'New result'",
        "\t[11] StaticText 'new.example.com'",
    ],
    "deleted": ["\t[5] link 'Old result'", "\t[6] StaticText 'old.example.com'"],
    "updated": ["\t[2] textbox 'From:' value: 'Anv' focused: true", "\t[3] list ''"],
}
EMPTY = {"new": [], "deleted": [], "updated": []}


def test_make_diff_keys_lines_by_id():
    assert make_diff(BEFORE, AFTER) == DIFF
    assert make_diff(BEFORE, BEFORE) == EMPTY


def test_target_text_has_the_three_sections_reward_and_done():
    assert format_target(EMPTY, 1.0, True) == (
        "New items:\nNone\nDeleted items:\nNone\nUpdated items:\nNone\nReward: 1\nDone: yes"
    )
    text = format_target(DIFF, -1.0, False)
    assert text.startswith("New items:\n\t\t[8] listitem '' level: 1\n") and text.endswith("\nReward: -1\nDone: no")


def test_parse_target_inverts_format_target():
    target, error = parse_target(format_target(DIFF, 0.5, True))
    assert error is None
    assert target == {**DIFF, "reward": 0.5, "done": True}
    target, error = parse_target("\n" + no_change_target() + "\n\n")
    assert error is None and target == {**EMPTY, "reward": 0.0, "done": False}


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("Deleted items:\nNone\nUpdated items:\nNone\nReward: 0\nDone: no", "'New items:'"),
        ("New items:\nDeleted items:\nNone\nUpdated items:\nNone\nReward: 0\nDone: no", "write None"),
        ("New items:\nNone\n[2] button 'x'\nDeleted items:\nNone\nUpdated items:\nNone\nReward: 0\nDone: no", "not a tree line"),
        ("New items:\nhello\nDeleted items:\nNone\nUpdated items:\nNone\nReward: 0\nDone: no", "not a tree line"),
        ("New items:\nNone\nDeleted items:\nNone\nUpdated items:\nNone\nReward: nan\nDone: no", "finite"),
        ("New items:\nNone\nDeleted items:\nNone\nUpdated items:\nNone\nReward: high\nDone: no", "not a number"),
        ("New items:\nNone\nDeleted items:\nNone\nUpdated items:\nNone\nReward: 0\nDone: maybe", "Done: yes"),
        ("New items:\nNone\nDeleted items:\nNone\nUpdated items:\nNone\nReward: 0\nDone: no\nmore", "after the Done"),
        ("New items:\n[2] a 'x'\nDeleted items:\n[2] a 'x'\nUpdated items:\nNone\nReward: 0\nDone: no", "more than once"),
        (None, "must be a string"),
    ],
)
def test_parse_target_reports_what_is_wrong(text, fragment):
    target, error = parse_target(text)
    assert target is None and fragment in error


def test_apply_diff_rebuilds_the_next_tree_in_order():
    assert apply_diff(BEFORE, DIFF) == AFTER
    assert apply_diff(BEFORE, EMPTY) == BEFORE


def test_apply_diff_places_new_runs_after_opened_parent_in_deleted_slot_or_at_the_end():
    tree = "[1] Root 'p'\n\t[2] list '' hidden: true\n\t[3] button 'Go'"
    opened = {"new": ["\t\t[4] listitem 'a'", "\t\t[5] listitem 'b'"], "deleted": [], "updated": ["\t[2] list ''"]}
    assert apply_diff(tree, opened) == "[1] Root 'p'\n\t[2] list ''\n\t\t[4] listitem 'a'\n\t\t[5] listitem 'b'\n\t[3] button 'Go'"
    appended = {"new": ["\t[4] link 'Prev'", "\t[5] table ''", "\t\t[6] cell '1'"], "deleted": [], "updated": []}
    assert apply_diff(tree, appended) == tree + "\n\t[4] link 'Prev'\n\t[5] table ''\n\t\t[6] cell '1'"
    replaced = {"new": ["\t[4] button 'Stop'"], "deleted": ["\t[2] list '' hidden: true"], "updated": []}
    assert apply_diff(tree, replaced) == "[1] Root 'p'\n\t[4] button 'Stop'\n\t[3] button 'Go'"


def test_apply_diff_is_lenient_about_ids_the_tree_does_not_have():
    tree = "[1] Root 'p'\n\t[2] button 'Go'"
    odd = {"new": ["\t[2] button 'Stop'"], "deleted": ["\t[9] link 'x'"], "updated": ["\t[8] link 'y'"]}
    assert apply_diff(tree, odd) == "[1] Root 'p'\n\t[2] button 'Stop'"


PANEL = "\n".join([
    "[1] Root 'p'",
    "\t[2] table ''",
    "\t\t[3] row ''",
    "\t\t\t[4] link '1'",
    "\t\t\t[5] link '2'",
    "\t[6] button 'Go'",
])


def test_a_deleted_subtree_is_listed_by_its_first_line_and_deleted_whole():
    after = "[1] Root 'p'\n\t[7] table ''\n\t\t[8] link '3'\n\t[6] button 'Go'"
    diff = make_diff(PANEL, after)
    assert diff == {"new": ["\t[7] table ''", "\t\t[8] link '3'"], "deleted": ["\t[2] table ''"], "updated": []}
    assert apply_diff(PANEL, diff) == after
    line_by_line = expand_diff(PANEL, diff)
    assert line_by_line["deleted"] == PANEL.split("\n")[1:5] and line_by_line["new"] == diff["new"]


def test_a_line_that_stays_under_a_deleted_one_is_kept_as_updated():
    after = "[1] Root 'p'\n\t\t\t[5] link '2'\n\t[6] button 'Go'"  # the table and row go, link 2 stays
    diff = make_diff(PANEL, after)
    assert diff == {"new": [], "deleted": ["\t[2] table ''"], "updated": ["\t\t\t[5] link '2'"]}
    assert apply_diff(PANEL, diff) == after
    assert expand_diff(PANEL, diff) == {"new": [], "deleted": PANEL.split("\n")[1:4], "updated": []}


def test_f1_scores_the_page_change_whatever_the_encoding_left_out():
    after = "[1] Root 'p'\n\t[6] button 'Go'"
    compact = format_target(make_diff(PANEL, after), 0.0, False)
    every_line = format_target({"new": [], "deleted": PANEL.split("\n")[1:5], "updated": []}, 0.0, False)
    only_the_row = format_target({"new": [], "deleted": ["\t\t[3] row ''"], "updated": []}, 0.0, False)
    rows = web_reward([compact, every_line, only_the_row], [PANEL] * 3, [after] * 3, [0.0] * 3, [False] * 3)
    assert rows[0]["f1"] == rows[1]["f1"] == 1.0
    assert rows[2]["precision"] == 1.0 and rows[2]["recall"] == pytest.approx(3 / 4)  # row and its two links


def test_item_f1_pools_sections_with_exact_match():
    assert item_f1(EMPTY, EMPTY) == 1.0
    assert item_f1(EMPTY, DIFF) == 0.0 and item_f1(DIFF, EMPTY) == 0.0
    assert item_f1(DIFF, DIFF) == 1.0
    gold = {"new": ["[4] a 'x'", "[5] a 'y'"], "deleted": ["[2] b 'z'"], "updated": []}
    pred = {"new": ["[4] a 'x'", "[6] a 'w'"], "deleted": [], "updated": ["[2] b 'z'"]}  # [2] in the wrong section
    precision, recall = 1 / 3, 1 / 3
    assert item_f1(pred, gold) == pytest.approx(2 * precision * recall / (precision + recall))
    assert item_f1({**gold, "new": ["[4] a 'x' "]}, gold) == pytest.approx(2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3))


def test_web_reward_weights_f1_reward_and_done():
    perfect = format_target(DIFF, 1.0, True)
    rows = web_reward([perfect, no_change_target(), "garbage"], [BEFORE] * 3, [AFTER] * 3, [1.0] * 3, [True] * 3)
    assert rows[0]["score"] == pytest.approx(1.0) and rows[0]["f1"] == 1.0
    assert rows[1]["score"] == pytest.approx(0.0) and rows[1]["f1"] == 0.0  # wrong items, reward and done
    assert rows[2]["score"] == 0.0 and "New items" in rows[2]["error"]
    unchanged = web_reward([no_change_target()], [BEFORE], [BEFORE], [0.0], [False])[0]
    assert unchanged["score"] == pytest.approx(1.0)
    right_items_wrong_done = web_reward([format_target(DIFF, 1.0, False)], [BEFORE], [AFTER], [1.0], [True])[0]
    assert right_items_wrong_done["score"] == pytest.approx(0.9)
    # More weight on the outcome: the same completion loses more for the wrong done, a page missed loses less.
    outcome = web_reward([format_target(DIFF, 1.0, False), no_change_target()], [BEFORE] * 2, [AFTER] * 2, [0.0] * 2,
                         [False] * 2, outcome_weight=0.6)
    assert [row["score"] for row in outcome] == pytest.approx([0.4 + 0.0 + 0.3, 0.0 + 0.3 + 0.3])
    with pytest.raises(ValueError, match="outcome_weight"):
        web_reward([perfect], [BEFORE], [AFTER], [1.0], [True], outcome_weight=1.5)
    with pytest.raises(ValueError, match="align"):
        web_reward([perfect], [BEFORE], [AFTER, AFTER], [1.0], [True])


def test_prompt_holds_task_tree_and_action():
    prompt = format_prompt("Click Go.", BEFORE, "click [4]")
    assert prompt == f"Task: Click Go.\n{BEFORE}\nAction: click [4]\n"


_lines = st.lists(st.sampled_from([
    "New items:", "Deleted items:", "Updated items:", "None", "Reward: 1", "Reward: -0.5", "Reward: x",
    "Done: yes", "Done: no", "[3] button 'Go'", "\t[4] link 'a b'", "\t\t[12] StaticText ''", "[x] y", "", " ",
]) | st.text(max_size=30), max_size=14)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), _lines.map("\n".join)))
def test_parser_and_reward_never_raise_on_random_text(text):
    target, error = parse_target(text)
    assert (target is None) != (error is None)
    row = web_reward([text], [BEFORE], [AFTER], [1.0], [True])[0]
    assert 0.0 <= row["score"] <= 1.0
    if target is not None:
        apply_diff(BEFORE, target)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([format_target(DIFF, 1.0, True), no_change_target(), format_target(DIFF, -1.0, False)]),
    st.lists(st.tuples(st.sampled_from(["insert", "delete", "replace", "swap"]), st.integers(0, 10_000), st.text(max_size=3)), max_size=6),
)
def test_parser_and_reward_never_raise_on_mutated_targets(text, edits):
    for kind, at, piece in edits:
        i = at % (len(text) + 1)
        if kind == "insert":
            text = text[:i] + piece + text[i:]
        elif kind == "delete":
            text = text[:i] + text[i + len(piece) + 1 :]
        elif kind == "replace":
            text = text[:i] + piece + text[i + len(piece) :]
        else:
            lines = text.split("\n")
            j, k = at % len(lines), (at // 7) % len(lines)
            lines[j], lines[k] = lines[k], lines[j]
            text = "\n".join(lines)
    target, error = parse_target(text)
    assert (target is None) != (error is None)
    row = web_reward([text], [BEFORE], [AFTER], [1.0], [True])[0]
    assert 0.0 <= row["score"] <= 1.0 and not math.isnan(row["score"])
    if target is not None:
        rebuilt = apply_diff(BEFORE, target)
        assert isinstance(rebuilt, str)


_tree_line = st.builds(
    lambda depth, role, name: (depth, role, name),
    st.integers(0, 3),
    st.sampled_from(["button", "link", "StaticText", "list", "listitem"]),
    st.sampled_from(["", "Go", "a b", "x'y"]),
)


def _tree(spec, first_id):
    lines, depth = [], 0
    for k, (d, role, name) in enumerate(spec):
        depth = min(d, depth + 1) if lines else 0
        lines.append("\t" * depth + f"[{first_id + k}] {role} '{name}'")
    return "\n".join(lines)


@settings(max_examples=200, deadline=None)
@given(st.lists(_tree_line, min_size=1, max_size=12), st.lists(st.booleans(), max_size=12), st.lists(_tree_line, max_size=5))
def test_applied_diff_has_exactly_the_next_trees_lines(spec, keep, extra):
    before = _tree(spec, 1)
    kept = [line for line, k in zip(before.split("\n"), keep + [True] * len(spec)) if k]
    after = "\n".join(kept + ([_tree(extra, 100)] if extra else []))
    rebuilt = apply_diff(before, make_diff(before, after))
    assert sorted(rebuilt.split("\n")) == sorted(after.split("\n")) if after else rebuilt == ""
    if not extra:
        assert rebuilt == after

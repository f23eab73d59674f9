"""Web domain: accessibility-tree lines, "New/Deleted/Updated items" targets, parsing, applying, F1 reward.

Tree: the page's accessibility tree as text, one line per node, `[id] role 'name' props`, indented with one tab
per depth (`envs.web.tree` writes it). Ids are stable within an episode, so a line is keyed by its id.

Prompt (`format_prompt`):

    Task: <utterance>
    <tree lines>
    Action: <action>

Target (`format_target`), the change the action makes and what the task says about it:

    New items:
    <lines whose id was not in the tree before, in the new tree's order>
    Deleted items:
    <the first line of each run of lines that are gone, as it was: a deleted line takes the lines under it along>
    Updated items:
    <lines whose id stayed but whose text changed (indentation included), as they are now; and lines that stay
     while a line above them goes (unchanged or not), which keeps them>
    Reward: <MiniWoB's raw reward, e.g. 0, 1, -1>
    Done: yes|no

An empty section is the single item `None`. Items keep their indentation, so applying a diff rebuilds lines
exactly. Listing a deleted subtree by its first line, not line by line, keeps the targets short where a page
re-renders a block: a datepicker that turns the month deletes 85 lines, now listed as a few (on the bench's
choose-date transitions the mean target falls from 629 to 358 tokens, and every one fits the context).

`apply_diff` keeps the tree's order: deleted lines go with the lines under them (but for those the diff lists as
updated), updated lines are replaced in place, and new items are inserted in the order listed. An item goes right
after the item listed before it when it can be that item's sibling, a sibling of one of the run's new ancestors, or
its child (never under a leaf line: StaticText, image, text field); otherwise it becomes the last child of the next
line one level up after the last insertion (new content of a container that already existed, e.g. a results list).
An item that starts a run elsewhere, at depth d, takes the place of the first not yet reused deleted line of depth d
(content replaced in place); else it becomes the last child of a non-leaf line of depth d-1, preferring one this
diff updates (a panel or menu that opens), then one with updated lines inside, then the last one (MiniWoB's popups
attach at the end of the page); at depth 0 it goes at the end. On the 8,121 transitions of 11 MiniWoB tasks recorded
for training (seed 0) this rebuilds the next tree exactly for 7,666 (94%); in the others the lines are right and
only the place of some new lines differs (search results added above an existing list, an autocomplete's current
message). A new item whose id is already in the tree is applied as an update; deleted or updated ids that are not in
the tree are ignored.

Reward (`web_reward`, TRL-style): `0.8 * item_f1 + 0.1 * reward_ok + 0.1 * done_ok`, in [0, 1]. Item F1 pools the
three sections of the line-by-line diff (`expand_diff`: every deleted line listed, updated items that repeat
their line left out), so it scores the predicted page change, not its encoding: an item counts as a true
positive when the same string is in the same section of the gold diff (multisets); precision = TP / |predicted
items|, recall = TP / |gold items|, and F1 = 1.0 when both are empty.
`reward_ok` is whether the predicted reward is within 1e-3 of the real one. A completion that does not parse
scores 0.0 with the error. The "no change" baseline (`no_change_target`) predicts no items, reward 0, not done.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, TypedDict

SECTIONS = ("new", "deleted", "updated")
HEADERS = {"new": "New items:", "deleted": "Deleted items:", "updated": "Updated items:"}
OUTCOME_WEIGHT = 0.2
"""`web_reward`'s weight on the reward and done being right (half each); item F1 gets the rest."""
REWARD_TOLERANCE = 1e-3
LEAF_ROLES = frozenset({"StaticText", "image", "textbox", "searchbox", "LineBreak"})  # lines that hold no others
_ITEM = re.compile(r"^(\t*)\[(\d+)\] \S")
_REWARD = re.compile(r"^Reward: (\S+)$")
_DONE = re.compile(r"^Done: (yes|no)$")


class Diff(TypedDict):
    new: list[str]
    deleted: list[str]
    updated: list[str]


class Target(Diff):
    reward: float
    done: bool


def format_prompt(utterance: str, tree: str, action: str) -> str:
    """The model's input: the task, the current tree and the action, one block."""
    return f"Task: {utterance}\n{tree}\nAction: {action}\n"


def make_diff(tree_before: str, tree_after: str) -> Diff:
    """New, deleted and updated lines between two trees of one episode, keyed by line id; a deleted line under a
    deleted line is left out (it goes with it), and a line that stays under a deleted one is listed as updated."""
    before, after = _lines_by_id(tree_before), _lines_by_id(tree_after)
    parent = _parent_ids(tree_before)
    gone = {i for i in before if i not in after}

    def under_gone(i: int) -> bool:
        while (i := parent.get(i)) is not None:
            if i in gone:
                return True
        return False

    return {
        "new": [line for i, line in after.items() if i not in before],
        "deleted": [line for i, line in before.items() if i in gone and parent.get(i) not in gone],
        "updated": [line for i, line in after.items() if i in before and (before[i] != line or under_gone(i))],
    }


def expand_diff(tree: str, diff: Diff) -> Diff:
    """The diff line by line, as `apply_diff` applies it to `tree`: every line it deletes listed (in tree order),
    and no updated item that repeats its line. Item F1 is scored on this, whatever the encoding left out."""
    lines = _lines_by_id(tree)
    updated = [line for line in diff["updated"] if lines.get(_line_id(line)) != line]
    new = []
    for line in diff["new"]:
        line_id = _line_id(line)
        if line_id not in lines:
            new.append(line)
        elif lines[line_id] != line:
            updated.append(line)
    deleted = _deleted_ids(tree, diff)
    return {"new": new, "deleted": [line for i, line in lines.items() if i in deleted], "updated": updated}


def format_target(diff: Diff, reward: float, done: bool) -> str:
    """The target text for a diff and the step's reward and done."""
    parts = []
    for section in SECTIONS:
        parts.append(HEADERS[section])
        parts.extend(diff[section] or ["None"])
    parts.append(f"Reward: {_format_reward(reward)}")
    parts.append(f"Done: {'yes' if done else 'no'}")
    return "\n".join(parts)


def no_change_target() -> str:
    """The "no change" baseline: no items, reward 0, not done."""
    return format_target({"new": [], "deleted": [], "updated": []}, 0.0, False)


def parse_target(text: str) -> tuple[Target | None, str | None]:
    """`(target, None)` for a well-formed target, else `(None, error)`; never raises."""
    try:
        return _parse_target(text), None
    except _TargetError as e:
        return None, str(e)


def apply_diff(tree: str, diff: Diff) -> str:
    """The tree after the diff, in tree order (placement rules in the module docstring)."""
    lines = tree.split("\n") if tree else []
    present = {_line_id(line) for line in lines} - {None}
    updated = {_line_id(line): line for line in diff["updated"]}
    new = []
    for line in diff["new"]:
        if _line_id(line) in present:
            updated[_line_id(line)] = line
        else:
            new.append(line)
    deleted = _deleted_ids(tree, diff)
    # Entries are [line, depth, kind]: kind "keep", "updated", "new", or "slot" for a deleted line's place.
    out = []
    for line in lines:
        line_id = _line_id(line)
        if line_id in deleted:
            out.append([None, _depth(line), "slot"])
        elif line_id in updated:
            out.append([updated[line_id], _depth(updated[line_id]), "updated"])
        else:
            out.append([line, _depth(line), "keep"])
    previous = None  # [index in out, run start depth, depth, is a leaf] of the last inserted item
    for line in new:
        depth = _depth(line)
        at = None
        if previous is not None:
            index, start, prev_depth, leaf = previous
            if start <= depth <= prev_depth + 1 and not (depth == prev_depth + 1 and leaf):
                at = index + 1
            else:
                at = _next_parent_end(out, index + 1, depth)
        if at is None:
            at, start = _run_position(out, depth), depth
        out.insert(at, [line, depth, "new"])
        previous = [at, start, depth, _role(line) in LEAF_ROLES]
    return "\n".join(entry[0] for entry in out if entry[0] is not None)


def item_f1(pred: Diff, gold: Diff) -> float:
    """F1 over items pooled across the three sections, exact string match; 1.0 when both are empty (`web_reward`
    scores the diffs line by line: `expand_diff` of each)."""
    return _precision_recall_f1(pred, gold)[2]


def web_reward(
    completions: list[str], tree_before: list[str], tree_after: list[str], reward: list[float], done: list[bool],
    outcome_weight: float = OUTCOME_WEIGHT, **_: Any
) -> list[dict[str, Any]]:
    """`0.8 * item_f1 + 0.1 * reward_ok + 0.1 * done_ok` per completion (TRL-style; one row per completion).
    `outcome_weight` moves weight between the page and the outcome: `(1 - w) * item_f1 + w / 2 * (reward_ok +
    done_ok)`; the default is the weighting above."""
    if not 0 <= outcome_weight <= 1:
        raise ValueError(f"outcome_weight must lie in [0, 1], got {outcome_weight}")
    if not len(completions) == len(tree_before) == len(tree_after) == len(reward) == len(done):
        raise ValueError(
            f"completions, tree_before, tree_after, reward and done must align, got {len(completions)}, "
            f"{len(tree_before)}, {len(tree_after)}, {len(reward)}, {len(done)}: pass one of each per completion"
        )
    rows = []
    gold_diffs: dict[tuple[str, str], Diff] = {}  # a GRPO group scores many completions of one transition
    for completion, before, after, gold_reward, gold_done in zip(completions, tree_before, tree_after, reward, done):
        target, error = parse_target(completion)
        if error is not None:
            rows.append({"score": 0.0, "error": error})
            continue
        if (before, after) not in gold_diffs:
            gold_diffs[before, after] = expand_diff(before, make_diff(before, after))
        precision, recall, f1 = _precision_recall_f1(expand_diff(before, target), gold_diffs[before, after])
        reward_ok = float(abs(target["reward"] - float(gold_reward)) <= REWARD_TOLERANCE)
        done_ok = float(target["done"] == bool(gold_done))
        rows.append({
            "score": (1 - outcome_weight) * f1 + outcome_weight / 2 * (reward_ok + done_ok),
            "f1": f1,
            "precision": precision,
            "recall": recall,
            "reward_ok": reward_ok,
            "done_ok": done_ok,
        })
    return rows


class _TargetError(Exception):
    pass


def _parse_target(text: Any) -> Target:
    if not isinstance(text, str):
        raise _TargetError(f"completion must be a string, got {type(text).__name__}")
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    while lines and not lines[0].strip():
        lines.pop(0)
    target: dict[str, Any] = {}
    pos = 0
    for k, section in enumerate(SECTIONS):
        if pos >= len(lines) or lines[pos].rstrip() != HEADERS[section]:
            found = repr(lines[pos][:40]) if pos < len(lines) else "the end"
            raise _TargetError(f"expected {HEADERS[section]!r} at line {pos + 1}, found {found}")
        pos += 1
        end = HEADERS[SECTIONS[k + 1]] if k + 1 < len(SECTIONS) else "Reward:"
        items = []
        while pos < len(lines) and not lines[pos].startswith(end):
            items.append(lines[pos].rstrip())
            pos += 1
        target[section] = _section_items(section, items)
    if pos >= len(lines) or not (m := _REWARD.match(lines[pos].strip())):
        raise _TargetError(f"expected 'Reward: <number>' at line {pos + 1}")
    try:
        value = float(m.group(1))
    except ValueError:
        raise _TargetError(f"reward {m.group(1)!r} is not a number") from None
    if not math.isfinite(value):
        raise _TargetError(f"reward must be finite, got {m.group(1)!r}")
    target["reward"] = value
    pos += 1
    if pos >= len(lines) or not (m := _DONE.match(lines[pos].strip())):
        raise _TargetError(f"expected 'Done: yes' or 'Done: no' at line {pos + 1}")
    target["done"] = m.group(1) == "yes"
    if pos + 1 < len(lines):
        raise _TargetError(f"unexpected text after the Done line: {lines[pos + 1][:40]!r}")
    ids = Counter(_line_id(line) for section in SECTIONS for line in target[section])
    repeated = [i for i, count in ids.items() if count > 1]
    if repeated:
        raise _TargetError(f"item [{repeated[0]}] appears more than once: give each id at most one item")
    return target  # type: ignore[return-value]


def _section_items(section: str, items: list[str]) -> list[str]:
    header = HEADERS[section]
    if not items:
        raise _TargetError(f"{header!r} has no items: write None for an empty section")
    if items == ["None"]:
        return []
    for line in items:
        if not _ITEM.match(line):
            raise _TargetError(f"{header!r} item {line[:40]!r} is not a tree line `[id] role 'name' ...` (or None alone)")
    return items


def _precision_recall_f1(pred: Diff, gold: Diff) -> tuple[float, float, float]:
    pred_items = Counter((s, line) for s in SECTIONS for line in pred[s])
    gold_items = Counter((s, line) for s in SECTIONS for line in gold[s])
    n_pred, n_gold = sum(pred_items.values()), sum(gold_items.values())
    if n_pred == 0 and n_gold == 0:
        return 1.0, 1.0, 1.0
    tp = sum((pred_items & gold_items).values())
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
    return precision, recall, f1


def _run_position(out: list[list], depth: int) -> int:
    for i, (_, d, kind) in enumerate(out):
        if kind == "slot" and d == depth:
            out[i][2] = "used-slot"
            return i
    if depth == 0:
        return len(out)
    parents = [
        i for i, (line, d, kind) in enumerate(out)
        if d == depth - 1 and kind not in ("slot", "used-slot") and _role(line) not in LEAF_ROLES
    ]
    if not parents:
        return len(out)
    ends = {i: _subtree_end(out, i) for i in parents}
    # A container that opened, or one whose content changed, is where new content most likely went.
    def rank(i: int) -> tuple[int, int]:
        changed_inside = any(out[j][2] == "updated" for j in range(i + 1, ends[i]))
        return (2 if out[i][2] == "updated" else 1 if changed_inside else 0, i)

    return ends[max(parents, key=rank)]


def _subtree_end(out: list[list], parent: int) -> int:
    end = parent + 1
    while end < len(out) and (out[end][1] > out[parent][1] or out[end][2] in ("slot", "used-slot")):
        end += 1
    return end


def _next_parent_end(out: list[list], start: int, depth: int) -> int | None:
    """After the last insertion: the end of the next line of depth-1's subtree, if no shallower line comes first."""
    for i in range(start, len(out)):
        _, d, kind = out[i]
        if kind in ("slot", "used-slot"):
            continue
        if d < depth - 1:
            return None
        if d == depth - 1:
            return _subtree_end(out, i)
    return None


def _role(line: str) -> str:
    parts = line.lstrip("\t").split(" ", 2)
    return parts[1] if len(parts) > 1 else ""


def _deleted_ids(tree: str, diff: Diff) -> set[int]:
    """Ids of the tree's lines the diff deletes: each deleted line and the lines under it, but for those the diff
    keeps (an updated item, or a new item whose id the tree has)."""
    listed = {_line_id(line) for line in diff["deleted"]}
    kept = {_line_id(line) for line in diff["updated"] + diff["new"]}
    deleted = set()
    cut_depth = None  # depth of the deleted line whose subtree we are in
    for line in tree.split("\n") if tree else []:
        line_id, depth = _line_id(line), _depth(line)
        if line_id is None:
            continue
        if cut_depth is not None and depth <= cut_depth:
            cut_depth = None
        if line_id in listed:
            deleted.add(line_id)
            if cut_depth is None:
                cut_depth = depth
        elif cut_depth is not None and line_id not in kept:
            deleted.add(line_id)
    return deleted


def _parent_ids(tree: str) -> dict[int, int]:
    """Each line's parent line id (the nearest line above it one tab less deep); top lines have none."""
    parent, above = {}, []  # above: (depth, id) of the lines that can still be a parent
    for line in tree.split("\n"):
        line_id = _line_id(line)
        if line_id is None:
            continue
        depth = _depth(line)
        while above and above[-1][0] >= depth:
            above.pop()
        if above:
            parent[line_id] = above[-1][1]
        above.append((depth, line_id))
    return parent


def _lines_by_id(tree: str) -> dict[int, str]:
    lines = {}
    for line in tree.split("\n"):
        line_id = _line_id(line)
        if line_id is not None:
            lines[line_id] = line
    return lines


def _line_id(line: str) -> int | None:
    m = _ITEM.match(line)
    return int(m.group(2)) if m else None


def _depth(line: str) -> int:
    return len(line) - len(line.lstrip("\t"))


def _format_reward(reward: float) -> str:
    return f"{float(reward):g}"


# ---------------------------------------------------------------------------------------------------- metrics

METRICS = ("precision", "recall", "f1", "reward_accuracy", "done_accuracy", "exact_match", "parse_failure_rate")
BASELINE_METRICS = ("f1", "reward_accuracy", "done_accuracy", "exact_match")


def best_by_web_reward(samples: Sequence[Sequence[str]], records: Sequence[dict]) -> list[str]:
    """For each transition, the sample whose web reward against the gold is highest (first on ties)."""
    chosen = []
    for texts, r in zip(samples, records):
        n = len(texts)
        rows = score_rows(texts, [r] * n)
        chosen.append(texts[max(range(n), key=lambda k: rows[k]["score"])])
    return chosen


def score_rows(completions: Sequence[str], records: Sequence[dict]) -> list[dict]:
    """`web_reward`'s row for each completion against its transition's gold."""
    return web_reward(
        list(completions),
        [r["tree_before"] for r in records],
        [r["tree_after"] for r in records],
        [r["reward"] for r in records],
        [r["done"] for r in records],
    )


def summarise(rows: Sequence[dict]) -> dict[str, float]:
    """Means over transitions of `METRICS` and the count `n`; NaN for every mean when there are no rows."""
    n = len(rows)

    def mean(values) -> float:
        return sum(values) / n if n else math.nan

    return {
        "precision": mean(r.get("precision", 0.0) for r in rows),
        "recall": mean(r.get("recall", 0.0) for r in rows),
        "f1": mean(r.get("f1", 0.0) for r in rows),
        "reward_accuracy": mean(r.get("reward_ok", 0.0) for r in rows),
        "done_accuracy": mean(r.get("done_ok", 0.0) for r in rows),
        "exact_match": mean(float(r["score"] >= 1.0 - 1e-9) for r in rows),
        "parse_failure_rate": mean(float("error" in r) for r in rows),
        "n": n,
    }


def web_metrics(completions: Sequence[str], records: Sequence[dict], seen_tasks: Sequence[str]) -> dict[str, float]:
    """The flat metric dict: `METRICS` and `n`, with `nochange_` baseline values, overall and with the `seen_` and
    `heldout_` prefixes (a split without transitions has NaN means)."""
    rows = score_rows(completions, records)
    baseline = score_rows([no_change_target()] * len(records), records)
    seen = set(seen_tasks)
    out: dict[str, float] = {}
    for prefix, keep in (("", lambda r: True), ("seen_", lambda r: r["task"] in seen),
                         ("heldout_", lambda r: r["task"] not in seen)):  # fmt: skip
        index = [i for i, r in enumerate(records) if keep(r)]
        model = summarise([rows[i] for i in index])
        nochange = summarise([baseline[i] for i in index])
        out.update({f"{prefix}{k}": v for k, v in model.items()})
        out.update({f"{prefix}nochange_{k}": nochange[k] for k in BASELINE_METRICS})
    return out

"""The real web env: MiniWoB++ pages in Debian's Chromium, one browser for the whole module."""

import glob
import os
import signal

import pytest

from envs.web import (
    InvalidAction,
    ScriptedPolicy,
    WebTaskEnv,
    browser_available,
    click,
    parse,
    record_transitions,
    task_done,
    type_text,
)
from envs.web.solvers import quoted_strings
from rlvr_gym.domains.web import apply_diff, make_diff

pytestmark = pytest.mark.skipif(not browser_available(), reason="needs Debian's chromium and chromium-driver (make browser)")


@pytest.fixture(scope="module")
def env():
    env = WebTaskEnv("click-tab-2", seed=0)
    yield env
    env.close()


def on_task(env, task, seed):
    if env.task != task:
        env.load_task(task)
    return env.reset(seed=seed)


def find(tree_text, role, name=None):
    return [n for n in parse(tree_text) if n.role == role and (name is None or n.name == name)]


def test_tree_numbers_ids_in_order_and_drops_page_furniture(env):
    utterance, tree_text, _ = on_task(env, "click-tab-2", 3)
    nodes = parse(tree_text)
    assert [n.id for n in nodes] == list(range(1, len(nodes) + 1))
    assert nodes[0].role == "RootWebArea" and nodes[0].depth == 0
    for furniture in ("Time left", "Last reward", "Episodes done", "START", "sec"):
        assert furniture not in tree_text
    assert utterance not in tree_text
    assert not find(tree_text, "InlineTextBox") and not find(tree_text, "generic", "")
    panels = find(tree_text, "tabpanel")
    assert len(panels) >= 2 and not panels[0].hidden and all(p.hidden for p in panels[1:])


def test_opening_a_tab_updates_hidden_lines_and_keeps_ids(env):
    _, before, _ = on_task(env, "click-tab-2", 3)
    tab_link = find(before, "link", "Tab #2")[0]
    after, reward, terminated, truncated, info = env.step(click(tab_link.id))
    diff = make_diff(before, after)
    assert not diff["new"] and not diff["deleted"] and not (reward or terminated or truncated)
    panel = next(n for n in parse(after) if n.role == "tabpanel" and n.name == "Tab #2")
    assert not panel.hidden and any(line.endswith(f"[{panel.id}] tabpanel 'Tab #2'") for line in diff["updated"])
    assert {n.id: n.role for n in parse(before)} == {n.id: n.role for n in parse(after)}
    assert apply_diff(before, diff) == after


def test_bad_actions_raise_invalid_action_without_stepping(env):
    _, before, _ = on_task(env, "click-tab-2", 4)
    for action in ("click [999]", "click 2", "type [2]", 'click [2] "x"', "scroll [2]", ""):
        with pytest.raises(InvalidAction):
            env.step(action)
    after, *_ = env.step(click(1))
    assert make_diff(before, after) == {"new": [], "deleted": [], "updated": []}


def test_clicking_a_hidden_line_is_a_noop_with_a_reason(env):
    _, before, _ = on_task(env, "click-tab-2", 5)
    hidden = next(n for n in parse(before) if n.hidden)
    after, reward, terminated, _, info = env.step(click(hidden.id))
    assert "hidden" in info["action_error"] and after == before and not terminated


def test_typing_fills_the_field_and_waits_for_autocomplete(env):
    _, before, _ = on_task(env, "book-flight", 0)
    origin = find(before, "textbox", "From:")[0]
    menu = find(before, "list")[0]
    assert menu.hidden
    after, *_ = env.step(type_text(origin.id, "Anvik"))
    assert find(after, "textbox", "From:")[0].props["value"] == "Anvik"
    suggestions = [n for n in find(after, "StaticText") if n.name.startswith("Anvik, AK") and not n.hidden]
    assert suggestions and not next(n for n in parse(after) if n.id == menu.id).hidden
    again, *_ = env.step(type_text(origin.id, "Zzq"))  # no match: the status region gets a new message
    assert live_region_lines(again) and not any(n.hidden for n in live_region_lines(again))


def live_region_lines(tree_text):
    """The nodes inside `status` regions: their old, hidden messages must not be in the tree."""
    inside, status_depth = [], None
    for n in parse(tree_text):
        if status_depth is not None and n.depth <= status_depth:
            status_depth = None
        if status_depth is not None:
            inside.append(n)
        elif n.role == "status":
            status_depth = n.depth
    return inside


@pytest.mark.parametrize("task", ["click-test-2", "enter-text", "login-user", "click-checkboxes", "search-engine"])
def test_expert_solves_task_and_final_tree_is_read(env, task):
    policy = ScriptedPolicy(task, skill=1.0)
    for seed in (11, 12):
        utterance, tree_text, _ = on_task(env, task, seed)
        policy.reset()
        for _ in range(12):
            tree_text, reward, terminated, truncated, info = env.step(policy.act(utterance, tree_text))
            if terminated or truncated:
                break
        assert terminated and reward == 1.0 and info["raw_reward"] == 1
        assert parse(tree_text)[0].role == "RootWebArea"


def test_dead_browser_is_restarted_and_the_episode_replayed(env):
    _, start, _ = on_task(env, "click-tab-2", 6)
    first_action = click(find(start, "link", "Tab #2")[0].id)
    second_action = click(find(start, "link", "Tab #3")[0].id)
    env.step(first_action)
    expected, *_ = env.step(second_action)
    env.reset(seed=6)
    env.step(first_action)
    driver_pid = env.driver.service.process.pid
    browsers = {int(p) for f in glob.glob(f"/proc/{driver_pid}/task/*/children") for p in open(f).read().split()}
    assert browsers
    for pid in browsers:
        os.kill(pid, signal.SIGKILL)
    after, _, _, _, info = env.step(second_action)
    assert info["restarted"] and after == expected


def test_recorder_yields_consecutive_transitions_that_diffs_rebuild(env):
    rows = list(record_transitions(["click-checkboxes", "enter-text"], episodes=2, seed=21, skill_mix=(1.0, 0.5), env=env))
    keys = {"utterance", "tree_before", "action", "tree_after", "reward", "done", "task", "seed"}
    assert rows and all(keys <= set(r) for r in rows)
    assert {r["task"] for r in rows} == {"click-checkboxes", "enter-text"}
    for prev, row in zip(rows, rows[1:]):
        if (prev["task"], prev["seed"]) == (row["task"], row["seed"]):
            assert row["tree_before"] == prev["tree_after"] and not prev["done"]
    for row in rows:
        assert apply_diff(row["tree_before"], make_diff(row["tree_before"], row["tree_after"])) == row["tree_after"]
    assert any(r["done"] and r["reward"] == 1.0 for r in rows)


def test_trivial_policies_record_what_the_real_page_pays_a_wrong_move(env):
    rows = list(record_transitions(["choose-date"], episodes=2, seed=23,
                                   skill_mix=("submit-with-nothing-filled", "click-last-button"), env=env))
    # Submit is choose-date's only button: both policies click it on the empty form, and MiniWoB ends with -1.
    assert [(r["policy"], r["skill"], r["step"]) for r in rows] == [
        ("submit-with-nothing-filled", None, 1), ("click-last-button", None, 1)]
    assert all(r["done"] and r["reward"] == -1.0 for r in rows)
    with pytest.raises(ValueError, match="unknown trivial policy"):
        list(record_transitions(["choose-date"], episodes=1, skill_mix=("win",), env=env))


def test_fill_swapped_records_a_login_with_each_text_in_the_others_box_which_the_real_page_fails(env):
    rows = list(record_transitions(["login-user", "enter-text"], episodes=2, seed=24, skill_mix=("fill-swapped",),
                                   env=env))  # fmt: skip
    assert {r["task"] for r in rows} == {"login-user"}  # enter-text has one field: nothing to swap, nothing recorded
    for seed in (24, 25):
        steps = [r for r in rows if r["seed"] == seed]
        user, password = (n.id for n in parse(steps[0]["tree_before"]) if n.role == "textbox")
        username, secret = quoted_strings(steps[0]["utterance"])
        assert [r["action"] for r in steps[:2]] == [f'type [{user}] "{secret}"', f'type [{password}] "{username}"']
        assert steps[2]["action"].startswith("click") and len(steps) == 3
        assert steps[2]["done"] and not task_done(steps[2]["reward"])

"""The exploit probe: trivial and adversarial policies in the learned and the real env from the same start states."""

import json
from pathlib import Path

import numpy as np
import pytest

from envs.robot.policies import AXES
from envs.web import WebTaskEnv, browser_available, task_done
from envs.web.solvers import last_button, trivial_policy
from rlvr_gym.evaluation.probe import (
    ProbeConfig,
    TextProbeConfig,
    WebProbeConfig,
    play_web,
    probe_rt1,
    probe_textgame,
    probe_web,
    rt1_probe_actions,
    summarize,
    write_report,
)


def check_report(result: dict, names: list[str], episodes: int) -> None:
    assert [row["policy"] for row in result["policies"]] == names
    for row in result["policies"]:
        assert row["episodes"] == episodes
        assert 0 <= row["learned_success"] <= 1 and 0 <= row["real_success"] <= 1
        assert row["false_success"] == pytest.approx(max(0.0, row["learned_success"] - row["real_success"]))
    false = [row["false_success"] for row in result["policies"]]
    assert result["mean_false_success"] == pytest.approx(np.mean(false)) and result["max_false_success"] == max(false)
    written = json.loads((Path(result["out"]) / "probe.json").read_text())
    assert written["policies"] == result["policies"]


def test_false_success_is_learned_success_the_real_env_did_not_give():
    result = summarize("rt1", "x", {"a": [True, True, False, False], "b": [False, False]},
                       {"a": [True, False, False, False], "b": [True, True]})
    assert [r["false_success"] for r in result["policies"]] == [0.25, 0.0]  # floored at 0 where real is higher
    assert result["mean_false_success"] == 0.125 and result["max_false_success"] == 0.25


def test_rt1_probe_policies_are_no_op_random_and_one_constant_axis_each():
    actions = rt1_probe_actions(7, np.random.default_rng(0))
    assert len(actions) == 2 + 2 * len(AXES) and all(a.shape == (7, 7) for a in actions.values())
    assert not actions["no-op"].any()
    assert np.array_equal(actions["-gripper"][:, 6], -np.ones(7)) and not actions["-gripper"][:, :6].any()
    assert np.abs(actions["uniform-random"]).max() <= 1 and len(np.unique(actions["uniform-random"])) == 49


def test_rt1_probe_runs_both_envs_from_the_same_initial_states(tmp_path):
    result = probe_rt1(ProbeConfig(checkpoint="rt1-mle", starts=1, steps=3, out=str(tmp_path)))
    names = list(rt1_probe_actions(3, np.random.default_rng(0)))
    check_report(result, names, episodes=4)  # one start state of each of the four tasks
    assert result["policies"][0]["real_success"] == 0.0  # doing nothing for 3 steps solves no real task
    per_task = {row["task"]: row for row in result["false_success_per_task"]}
    assert sorted(per_task) == ["close_drawer", "move_near", "open_drawer", "push_to_target"]
    policies = result["policies"]
    for task_row in per_task.values():  # 16 policies on one start state: rates in steps of 1/16
        assert (task_row["learned_success"] * 16).is_integer() and 0 <= task_row["false_success"] <= 1
    # Each task holds a quarter of every policy's episodes, so the per-task rates average to the overall ones.
    assert np.isclose(np.mean([r["learned_success"] for r in per_task.values()]),
                      np.mean([p["learned_success"] for p in policies]))
    assert "Per task" in (tmp_path / "probe.md").read_text()


def test_textgame_probe_runs_real_games_and_the_learned_env(tmp_path):
    result = probe_textgame(TextProbeConfig(checkpoint="textgame-rlvr", starts=2, steps=2, out=str(tmp_path)))
    check_report(result, ["no-op", "uniform-random", "repeat-first-command", "first-candidate"], episodes=2)
    assert result["policies"][0]["real_success"] == 0.0  # "look" wins no real game


def test_a_guarded_textgame_probe_pays_nothing_it_is_unsure_of_and_keeps_its_own_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = probe_textgame(TextProbeConfig(checkpoint="textgame-rlvr", starts=2, steps=2, halt_uncertainty=1e-6))
    assert all(row["learned_success"] == 0.0 for row in result["policies"])  # every step is less sure than that
    assert result["out"] == "runs/probe/textgame-textgame-rlvr-halt1e-06"
    assert json.loads((tmp_path / result["out"] / "probe.json").read_text())["config"]["halt_uncertainty"] == 1e-6


def test_web_probe_policies_click_the_last_button_and_submit():
    tree = "[1] RootWebArea 'page'\n\t[2] button 'Submit'\n\t[3] textbox ''\n\t[4] button 'Cancel'"
    assert last_button(tree) == "click [4]" and last_button(tree, "submit") == "click [2]"
    assert last_button("[1] RootWebArea 'page'") is None
    page = "Enter \"abc\" and submit.", tree
    assert trivial_policy("submit-with-nothing-filled")(*page) == "click [2]"
    assert trivial_policy("first-candidate")(*page) == "click [2]"
    draws = [trivial_policy("uniform-random", seed=3)(*page) for _ in range(2)]
    assert draws[0] == draws[1] and draws[0] in {"click [2]", "click [3]", 'type [3] "abc"', "click [4]"}
    with pytest.raises(ValueError, match="unknown trivial policy"):
        trivial_policy("win")


@pytest.mark.skipif(not browser_available(), reason="needs Debian's chromium and chromium-driver (make browser)")
def test_web_probe_runs_real_pages_and_the_learned_env(tmp_path):
    result = probe_web(WebProbeConfig(checkpoint="web-rlvr", starts=1, steps=1, tasks=("click-button",), out=str(tmp_path)))
    check_report(result, ["click-last-button", "submit-with-nothing-filled", "first-candidate", "uniform-random"], 1)
    assert all(row["outcome_match"] in (0.0, 1.0) for row in result["policies"])
    (per_task,) = result["outcome_match_per_task"]  # one task, one page: the same matches as the policy rows
    assert per_task == {"task": "click-button", **{r["policy"]: r["outcome_match"] for r in result["policies"]}}
    episodes = json.loads((tmp_path / "probe.json").read_text())["episodes"]
    assert "episodes" not in result and [e["policy"] for e in episodes] == [r["policy"] for r in result["policies"]]
    for episode, row in zip(episodes, result["policies"]):
        assert episode["real"][0] == row["real_success"] and episode["learned"][0] == row["learned_success"]
        assert len(episode["real_actions"]) == 1 and len(episode["learned_actions"]) == 1  # steps=1, a button to click
    again = probe_web(WebProbeConfig(checkpoint="web-rlvr", starts=1, steps=1, tasks=("click-button",), random_draws=2,
                                     out=str(tmp_path / "draws")))
    assert {r["policy"]: r["episodes"] for r in again["policies"]}["uniform-random"] == 2
    episodes = json.loads((tmp_path / "draws" / "probe.json").read_text())["episodes"]
    assert [e["draw"] for e in episodes if e["policy"] == "uniform-random"] == [0, 1]
    with pytest.raises(ValueError, match="no start pages of"):
        probe_web(WebProbeConfig(checkpoint="web-rlvr", tasks=("no-such-task",), out=str(tmp_path)))


@pytest.mark.skipif(not browser_available(), reason="needs Debian's chromium and chromium-driver (make browser)")
def test_partial_credit_for_a_submit_with_boxes_left_wrong_is_not_success():
    env = WebTaskEnv("click-checkboxes", max_steps=2)
    rewards = []

    def step(action: str) -> tuple[str, float, bool, bool]:
        tree, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        return tree, reward, terminated, truncated

    try:
        for seed in range(20):  # MiniWoB draws the boxes to tick; find a page where few need ticking
            utterance, tree, _ = env.reset(seed=seed)
            if "nothing" in utterance:
                continue
            outcome = play_web(step, utterance, tree, trivial_policy("submit-with-nothing-filled"), 2)
            reward = rewards[-1]
            if 0 < reward < 1:
                break
        else:
            pytest.fail("no click-checkboxes page in 20 seeds paid partial credit for an empty submit")
    finally:
        env.close()
    assert outcome == (False, True) and not task_done(reward)
    assert task_done(1.0) and not task_done(0.99) and not task_done(-1.0)


def test_the_gap_interval_is_over_paired_episodes():
    (row,) = summarize("web", "x", {"p": [True, True, False, False]}, {"p": [False, True, False, False]})["policies"]
    # Gaps 1, 0, 0, 0: mean 0.25, sample sd 0.5, so 0.25 +- 1.96 * 0.5 / 2.
    assert row["false_success"] == 0.25 and row["gap_95ci"] == pytest.approx([0.25 - 0.49, 0.25 + 0.49])
    (row,) = summarize("web", "x", {"p": [True, False]}, {"p": [True, False]})["policies"]
    assert row["gap_95ci"] == [0.0, 0.0]  # the same outcome on every episode: no gap, and no doubt about it
    (row,) = summarize("web", "x", {"p": [True]}, {"p": [False]})["policies"]
    assert row["gap_95ci"] is None


def test_reports_of_two_checkpoints_with_the_same_last_name_stay_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for checkpoint in ("runs/a/final", "runs/b/final"):
        result = summarize("web", checkpoint, {"noop": [False]}, {"noop": [False]})
        write_report(result, ProbeConfig(checkpoint=checkpoint))
    report = (tmp_path / "runs/probe/web-runs_a_final/probe.md").read_text()
    assert report.startswith("# Exploit probe: web, runs/a/final")
    assert (tmp_path / "runs/probe/web-runs_b_final/probe.json").is_file()

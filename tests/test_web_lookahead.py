"""The web lookahead agent: ranking of hand-made predicted outcomes, the model-free baseline, and real MiniWoB++
episodes with a tiny untrained world model, including a browser killed mid-episode."""

import glob
import json
import os
import shutil
import signal

import pytest

from agents.web_lookahead import (
    LookaheadConfig,
    episode_plan,
    no_lookahead_policy,
    play_agents,
    rank_predictions,
    run_lookahead,
)
from envs.web import WebTaskEnv, browser_available
from rlvr_gym.data.web import train_web_tokenizer
from rlvr_gym.domains.web import apply_diff
from rlvr_gym.models.lm import LlamaSize, build_llama
from rlvr_gym.sim.web import Prediction

needs_browser = pytest.mark.skipif(not browser_available(), reason="needs Debian's chromium and chromium-driver (make browser)")
ENTER_TEXT = "[1] RootWebArea 'Enter Text Task' focused: true\n\t[2] textbox ''\n\t[3] button 'Submit'"
LOGIN = (
    "[1] RootWebArea 'Login User Task' focused: true\n\t[2] StaticText 'Username'\n\t[3] textbox ''\n"
    "\t[4] StaticText 'Password'\n\t[5] textbox ''\n\t[6] button 'Login'"
)


def predicted(action, tree, new=(), deleted=(), updated=(), reward=0.0, done=False, error=None):
    diff = {"new": list(new), "deleted": list(deleted), "updated": list(updated)}
    after = tree if error else apply_diff(tree, diff)
    return Prediction(action, after, reward, done, len(new) + len(deleted) + len(updated), "", error)


def test_ranking_prefers_reward_then_no_failed_end_then_the_baseline_then_progress():
    utterance = 'Enter "Vina" into the text field and press Submit.'
    typed = "\t[2] textbox '' value: 'Vina' focused: true"
    predictions = [
        predicted("click [1]", ENTER_TEXT, error="does not parse"),
        predicted("click [2]", ENTER_TEXT, updated=["\t[2] textbox '' focused: true"]),
        predicted('type [2] "Vina"', ENTER_TEXT, updated=[typed]),
        predicted("click [3]", ENTER_TEXT, reward=-1.0, done=True),
        predicted("click [3]", ENTER_TEXT, reward=0.0, done=True),
        predicted("click [2]", ENTER_TEXT, reward=1.0, done=True),
        predicted("click [3]", ENTER_TEXT),
    ]
    order = rank_predictions(utterance, ENTER_TEXT, predictions)
    # reward 1 first; then typing "Vina" and clicking Submit, which tie on the baseline's preference (a word of the
    # utterance each), typing first as it shows "vina" on the page; then the textbox click (no word); ending without
    # reward and the negative reward after every step that goes on; the error last.
    assert order == [5, 2, 6, 1, 4, 3, 0]


def test_ties_fall_back_to_the_utterance_match_of_the_baseline():
    utterance = "Click button ONE."
    tree = "[1] RootWebArea 'Click Test Task' focused: true\n\t[2] button 'TWO'\n\t[3] button 'ONE'"
    predictions = [predicted("click [2]", tree), predicted("click [3]", tree)]
    assert rank_predictions(utterance, tree, predictions)[0] == 1
    assert rank_predictions(utterance, tree, predictions, taken=["click [3]"])[0] == 0


def test_no_lookahead_fills_each_field_once_then_submits():
    utterance = 'Enter the username "nieves" and the password "8ai" into the text fields and press login.'
    candidates = ["click [3]", 'type [3] "nieves"', 'type [3] "8ai"', "click [5]", 'type [5] "nieves"',
                  'type [5] "8ai"', "click [6]"]  # fmt: skip
    first = no_lookahead_policy(utterance, LOGIN, candidates, [])
    assert first == 'type [3] "nieves"'
    filled = LOGIN.replace("\t[3] textbox ''", "\t[3] textbox '' value: 'nieves'")
    second = no_lookahead_policy(utterance, filled, candidates, [first])
    assert second == 'type [5] "8ai"'
    both = filled.replace("\t[5] textbox ''", "\t[5] textbox '' value: '8ai'")
    assert no_lookahead_policy(utterance, both, candidates, [first, second]) == "click [6]"


def test_plan_spreads_episodes_over_tasks_on_held_out_seeds():
    assert episode_plan(["a", "b"], 5, 1) == [("a", 1_000_000), ("b", 1_000_000), ("a", 1_000_001),
                                              ("b", 1_000_001), ("a", 1_000_002)]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """An untrained tiny world model: its predictions never parse, so lookahead falls back to the baseline order."""
    import torch

    path = tmp_path_factory.mktemp("tiny")
    tokenizer = train_web_tokenizer([ENTER_TEXT, LOGIN, "New items:\nNone\nReward: 0\nDone: no"], 300)
    torch.manual_seed(0)
    build_llama(len(tokenizer), LlamaSize(hidden_size=32, layers=1, heads=2, intermediate_size=64, max_positions=256),
                tokenizer).save_pretrained(path)  # fmt: skip
    tokenizer.save_pretrained(path)
    return path


@needs_browser
def test_agents_play_the_same_real_episodes_and_report_success(tiny, tmp_path):
    out = tmp_path / "lookahead.json"
    config = LookaheadConfig(checkpoints=(str(tiny),), episodes=2, seed=1, tasks=("click-test-2", "enter-text"),
                             seen_tasks=("click-test-2",), max_steps=4, max_new_tokens=8, out=str(out))  # fmt: skip
    summary = run_lookahead(config)
    agents = ["random", "no-lookahead", f"lookahead:{tiny}"]
    assert list(summary["agents"]) == agents
    baseline = summary["agents"]["no-lookahead"]
    assert baseline["success_rate"] == 1.0 and baseline["per_task"] == {"click-test-2": 1.0, "enter-text": 1.0}
    assert baseline["seen_success_rate"] == 1.0 and baseline["heldout_success_rate"] == 1.0
    written = json.loads(out.read_text())
    for name in agents:
        rows = written["results"][name]
        assert [(r["task"], r["seed"]) for r in rows] == [("click-test-2", 1_000_000), ("enter-text", 1_000_000)]
        assert all(r["error"] is None and 1 <= r["steps"] <= 4 for r in rows)
    lookahead = written["results"][f"lookahead:{tiny}"]
    assert all(r["think_seconds"] > 0 for r in lookahead)
    # Every prediction of the untrained model fails to parse, so ties go to the baseline's choice.
    assert [r["actions"] for r in lookahead] == [r["actions"] for r in written["results"]["no-lookahead"]]


def test_a_checkpoint_trained_on_the_episodes_is_refused(tiny, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny, ckpt)
    (ckpt / "web_training.json").write_text(json.dumps({"tasks": ["click-test-2"], "seeds": {"click-test-2": [1_000_000]}}))
    with pytest.raises(ValueError, match="share 1 episodes"):
        run_lookahead(LookaheadConfig(checkpoints=(str(ckpt),), episodes=1, seed=1, tasks=("click-test-2",)))


@needs_browser
def test_a_browser_killed_mid_episode_fails_that_episode_and_play_goes_on():
    env = WebTaskEnv("click-test-2", max_steps=4)
    killed = []

    def make_policy(seed):
        def act(utterance, tree, candidates, taken):
            if not killed:
                driver = env.driver.service.process.pid
                children = [int(p) for f in glob.glob(f"/proc/{driver}/task/*/children") for p in open(f).read().split()]
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                killed.append(seed)
            return no_lookahead_policy(utterance, tree, candidates, taken)

        return act

    plan = [("click-test-2", 1_000_000), ("click-test-2", 1_000_001)]
    results = play_agents({"agent": make_policy}, plan, max_steps=4, timeout_s=60, env=env)["agent"]
    assert killed == [1_000_000]
    assert not results[0]["success"] and results[0]["error"]
    assert results[1]["success"] and results[1]["error"] is None

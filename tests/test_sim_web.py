"""The learned web simulator on real MiniWoB++ pages: start pages, the Gymnasium contract, refusals and truncation,
seeded rollouts, and the SB3 wrapper. One browser records the pages and transitions; the world models are tiny
Llamas, one untrained (its output never parses) and one trained for a few seconds on the recorded transitions."""

import copy
import dataclasses
import json
import re
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from envs.web import WebTaskEnv, browser_available, record_transitions
from envs.web.solvers import candidate_actions, quoted_strings
from rlvr_gym.data.web import (
    MODEL_PAGES,
    earlier_actions,
    encode_examples,
    load_train_and_eval,
    load_web_data,
    train_web_tokenizer,
    transition_texts,
)
from rlvr_gym.data.web_collect import WebCollectConfig, collect_web
from rlvr_gym.domains.web import apply_diff, parse_target
from rlvr_gym.evaluation.web import WebEvalConfig, run_web_eval
from rlvr_gym.models.lm import CheckpointError, LlamaSize, build_llama, load_tokenizer
from rlvr_gym.models.web_outcome import (
    CLASSES,
    OUTCOME_DIR,
    OutcomeHead,
    OutcomeSize,
    element_line,
    encode_outcome_inputs,
    outcome_label,
    outcome_tail,
    outcomes_of,
    pad_batch,
    typed_line,
)
from rlvr_gym.sim.web import (
    CANDIDATE_FEATURES,
    START_PAGES,
    Prediction,
    WebDiscreteEnv,
    WebWorldEnv,
    WebWorldModel,
    load_start_pages,
    step_outcome,
    write_start_pages,
)
from rlvr_gym.sim.web_replay import ReplayConfig, replay_web
from rlvr_gym.train.sft import SFTConfig, train_sft
from rlvr_gym.train.web_outcome import (
    OutcomeConfig,
    add_outcome_head,
    outcome_examples,
    outcome_metrics,
    train_web_outcome,
)

pytestmark = pytest.mark.skipif(not browser_available(), reason="needs Debian's chromium and chromium-driver (make browser)")
TASKS = ("click-test-2", "enter-text")
SEEDS = (2_000_000, 2_000_001)
TINY = LlamaSize(hidden_size=48, layers=1, heads=2, intermediate_size=96, max_positions=512)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(untrained checkpoint with start pages, recorded transitions)."""
    import torch

    untrained = tmp_path_factory.mktemp("untrained")
    env = WebTaskEnv(TASKS[0], max_steps=4)
    try:
        records = list(record_transitions(TASKS, episodes=3, seed=0, skill_mix=(1.0, 0.3), max_steps=4, env=env))
        tokenizer = train_web_tokenizer(transition_texts(records), 300)
        torch.manual_seed(0)
        build_llama(len(tokenizer), TINY, tokenizer).save_pretrained(untrained)
        tokenizer.save_pretrained(untrained)
        write_start_pages(untrained, TASKS, SEEDS, env=env)
    finally:
        env.close()
    return untrained, records


@pytest.fixture(scope="module")
def untrained(recorded):
    return recorded[0]


@pytest.fixture(scope="module")
def trained(recorded, tmp_path_factory):
    untrained, records = recorded
    examples, _ = encode_examples(records, load_tokenizer(untrained), 300, 200)
    run = tmp_path_factory.mktemp("sft")
    final = train_sft(SFTConfig(run_dir=str(run), model=str(untrained), steps=120, lr=1e-2, warmup_steps=5,
                                batch_size=8, micro_batch=8, save_every=120, eval_every=10**6), examples)  # fmt: skip
    shutil.copy(untrained / START_PAGES, final / START_PAGES)
    return final


def test_start_pages_are_the_real_pages_of_each_task_and_seed(untrained):
    pages = load_start_pages(untrained)
    assert [(p.task, p.seed) for p in pages] == [(t, s) for t in TASKS for s in SEEDS]
    for page in pages:
        assert page.tree.startswith("[1] RootWebArea") and page.utterance
    enter = [p for p in pages if p.task == "enter-text"]
    assert enter[0].utterance != enter[1].utterance and quoted_strings(enter[0].utterance)


def test_missing_or_corrupt_start_pages_say_how_to_fix(untrained, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(untrained, ckpt)
    (ckpt / START_PAGES).write_text(json.dumps({"format": "other", "pages": []}))
    with pytest.raises(CheckpointError, match="write_start_pages"):
        load_start_pages(ckpt)
    (ckpt / START_PAGES).unlink()
    with pytest.raises(CheckpointError, match="write_start_pages"):
        WebWorldEnv(ckpt)
    with pytest.raises(ValueError, match="no start pages of task"):
        WebWorldEnv(untrained, task="book-flight", max_new_tokens=16)


def test_candidates_click_visible_elements_and_type_quoted_text(untrained):
    for page in load_start_pages(untrained):
        ids = [line.split("]")[0].strip("\t[") for line in page.tree.split("\n")[1:]]
        clicks = [f"click [{i}]" for i in ids]
        if page.task == "click-test-2":
            assert candidate_actions(page.utterance, page.tree) == clicks
        else:
            (word,) = quoted_strings(page.utterance)
            assert candidate_actions(page.utterance, page.tree) == [clicks[0], f'type [{ids[0]}] "{word}"', clicks[1]]
    tree = "[1] RootWebArea 'T' focused: true\n\t[2] tab 'A'\n\t[3] tabpanel 'A' hidden: true\n\t\t[4] link 'x' hidden: true"
    assert candidate_actions('Click "x".', tree) == ["click [2]"]


def test_envs_pass_gymnasium_and_sb3_checkers(untrained):
    made = gym.make("RLVRWorld-Web-v0", checkpoint=str(untrained), max_new_tokens=16)
    check_env(made.unwrapped)  # through the spec: the "ansi" render mode too
    sb3_check_env(WebDiscreteEnv(WebWorldEnv(untrained, max_new_tokens=16)))


def test_observation_space_is_the_pages_charset_and_other_characters_become_u_fffd(untrained):
    env = WebWorldEnv(untrained, max_new_tokens=16)
    assert len(str(env.observation_space)) < 300  # printing the space does not print a charset of 64k characters
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and "\ufffd" not in obs  # real MiniWoB++ pages are ASCII
    env.tree += "\n[99] StaticText 'caf\u00e9 \u2603 \U0001f600'"
    obs = env._observation()
    assert env.observation_space.contains(obs) and obs.endswith("[99] StaticText 'caf\ufffd \ufffd \ufffd'")


def test_refused_actions_leave_the_page_and_say_why(untrained):
    env = WebWorldEnv(untrained, max_steps=3, max_new_tokens=16)
    obs, info = env.reset(seed=0)
    for action, reason in (("click [999]", r"no element \[999\]"), ("scroll down", "cannot parse")):
        after, reward, terminated, truncated, step_info = env.step(action)
        assert after == obs and reward == 0.0 and not terminated and not truncated
        assert re.search(reason, step_info["error"])
    _, _, _, truncated, _ = env.step("click [0]")
    assert truncated  # refused steps count towards max_steps
    with pytest.raises(RuntimeError, match="reset"):
        env.step(info["candidates"][0])
    env.reset(seed=0)
    with pytest.raises(ValueError, match="string"):
        env.step(3)


def test_unparsable_model_output_truncates_with_the_parse_error(untrained):
    env = WebWorldEnv(untrained, max_new_tokens=24)
    obs, info = env.reset(seed=1)
    after, reward, terminated, truncated, step_info = env.step(info["candidates"][0])
    assert truncated and not terminated and reward == 0.0 and after == obs
    assert "does not parse" in step_info["error"] and step_info["prediction"]


def test_same_seed_same_rollout_when_sampling(untrained):
    env = WebWorldEnv(untrained, temperature=1.0, max_new_tokens=24)

    def first_prediction(seed):
        _, info = env.reset(seed=seed)
        return env.step(info["candidates"][0])[4]["prediction"]

    assert first_prediction(5) == first_prediction(5)
    assert len({first_prediction(s) for s in range(4)}) > 1


def test_predicted_diff_reward_and_done_drive_the_episode(trained):
    env = WebWorldEnv(trained, task="click-test-2", max_steps=4, max_new_tokens=100)
    rollouts = []
    for _ in range(2):
        obs, info = env.reset(seed=7)
        steps, done = [], False
        while not done:
            before = info["tree"]
            obs, reward, terminated, truncated, info = env.step(info["candidates"][0] if info["candidates"] else "click [1]")
            steps.append((obs, reward, terminated, truncated, info["error"]))
            if info["error"] is None:
                target, _ = parse_target(info["prediction"])
                assert info["tree"] == apply_diff(before, target) and obs.endswith(info["tree"])
                assert terminated == target["done"]
                assert reward == (np.clip(target["reward"], -1, 1) if terminated else 0.0)
            done = terminated or truncated
        rollouts.append(steps)
    assert rollouts[0] == rollouts[1]
    assert rollouts[0][0][-1] is None  # the tiny model learned click-test-2's outcomes: its prediction parses


def test_a_reward_is_paid_only_when_the_episode_ends():
    def outcome(reward, done, error=None, steps=1):
        return step_outcome(Prediction("click [2]", "", reward, done, 0, "", error), steps, max_steps=3)

    assert outcome(1.0, True) == (1.0, True, False)
    assert outcome(1.0, False) == (0.0, False, False)  # the model's reward without Done: yes pays nothing
    assert outcome(-7.0, True) == (-1.0, True, False)
    assert outcome(0.0, False, steps=3) == (0.0, False, True)
    assert outcome(1.0, True, error="does not parse") == (0.0, False, True)


def test_batched_predictions_equal_one_by_one(trained):
    world = WebWorldModel(trained, max_new_tokens=100)
    page = [p for p in load_start_pages(trained) if p.task == "enter-text"][0]
    actions = candidate_actions(page.utterance, page.tree) + ["click [42]"]
    batched = world.predict(page.utterance, page.tree, actions)
    assert [p.action for p in batched] == actions and "[42]" in batched[-1].error
    assert batched == [world.predict(page.utterance, page.tree, [a])[0] for a in actions]


def test_discrete_wrapper_indexes_candidates_and_masks_the_rest(untrained):
    env = WebDiscreteEnv(WebWorldEnv(untrained, max_new_tokens=16), max_candidates=4, hash_dim=8)
    obs, info = env.reset(seed=0, options={"index": 2})  # an enter-text page: click, type, click
    assert obs.shape == (2 * 8 + 4 * CANDIDATE_FEATURES + 1,) and env.observation_space.contains(obs)
    slots = obs[16:-1].reshape(4, CANDIDATE_FEATURES)
    assert slots[:, 0].tolist() == [1, 1, 1, 0] and slots[:, 1].tolist() == [0, 1, 0, 0]
    assert env.action_masks().tolist() == [True, True, True, False]
    after, reward, terminated, truncated, step_info = env.step(3)
    assert "no candidate 3" in step_info["error"] and not (terminated or truncated) and np.array_equal(after[:-1], obs[:-1])
    _, _, _, truncated, step_info = env.step(0)
    assert truncated and "does not parse" in step_info["error"]


# ---------------------------------------------------------------------------------------------------- outcome head

HEAD = OutcomeSize(hidden_size=32, layers=1, heads=2, intermediate_size=64, max_tokens=160)


def outcome_config(run_dir, world_model, data, **kw) -> OutcomeConfig:
    # A head that reads the typed text: the older inputs are tested by switching it off (shipped web-outcome's).
    settings = dict(run_dir=str(run_dir), world_model=str(world_model), data=(str(data),), steps=40, lr=1e-2,
                    warmup_steps=5, batch_size=16, save_every=20, eval_every=0, size=HEAD,
                    reads_typed=True)  # fmt: skip
    return OutcomeConfig(**{**settings, **kw})


@pytest.fixture(scope="module")
def with_head(trained, tmp_path_factory):
    """(the trained world model with an outcome head, the real dataset the head learned from, a held-out one)."""
    root = tmp_path_factory.mktemp("outcome")
    env = WebTaskEnv(TASKS[0], max_steps=4)
    try:
        data, held_out = (collect_web(WebCollectConfig(out=str(root / name), tasks=TASKS, episodes=episodes, seed=seed,
                                                       skills=(1.0, 0.3), max_steps=4, workers=1), env)
                          for name, episodes, seed in (("data", 6, 3), ("heldout", 2, 4)))  # fmt: skip
    finally:
        env.close()
    return train_web_outcome(outcome_config(root / "run", trained, data)), data, held_out


def test_the_outcome_input_keeps_the_task_action_and_element_whole_and_cuts_the_page(untrained):
    tokenizer = load_tokenizer(untrained)
    page = load_start_pages(untrained)[0]
    tree = page.tree + "".join(f"\n\t[{100 + i}] StaticText 'filler line {i}'" for i in range(200))
    action = candidate_actions(page.utterance, page.tree)[0]
    assert element_line(tree, action) and element_line(tree, "click [999]") == "" == element_line(tree, "jump")
    ((ids, match),) = encode_outcome_inputs(tokenizer, [page.utterance], [tree], [action], max_tokens=96)
    lines = outcome_tail(page.utterance, tree, action)
    task, act = (tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines)
    assert len(ids) == len(match) == 96 and ids[-len(task + act) :] == task + act and ids[0] == tokenizer.bos_token_id
    # a token of the page or the action lines is flagged exactly when the task line holds it; the task line is not
    flags = [int(t in set(task)) for t in ids[1 : -len(task + act)] + act]
    assert match[1 : -len(task + act)] + match[-len(act) :] == flags and not any(match[-len(task + act) : -len(act)])
    assert 0 < sum(flags) < len(flags)


def test_outcome_labels_separate_the_task_done_from_other_ends():
    ends = [(0.0, False), (1.0, True), (-1.0, True), (0.6, True)]  # 0.6: click-checkboxes' partial credit
    assert [CLASSES[outcome_label(*end)] for end in ends] == ["continue", "success", "failure", "failure"]


def test_the_outcome_head_learns_the_real_outcomes_it_was_trained_on(with_head):
    world_model, data, _ = with_head
    head = OutcomeHead(world_model / OUTCOME_DIR)
    records, _ = load_web_data(data)
    examples = outcome_examples(records, head.tokenizer, head.max_tokens, head.reads_typed)
    majority = np.bincount(examples.labels).max() / len(examples.labels)
    metrics = outcome_metrics(head.model, examples, head.tokenizer.pad_token_id)
    assert metrics["outcome_accuracy"] > majority and metrics["outcome_accuracy"] >= 0.8, (metrics, majority)
    assert len(set(examples.labels.tolist())) == 3  # the set holds all three outcomes, so the bar above means something


def test_the_env_takes_reward_and_done_from_the_outcome_head(with_head, tmp_path):
    world_model, _, _ = with_head
    head = OutcomeHead(world_model / OUTCOME_DIR)
    assert head.reads_typed
    # The shipped LM: the tests' tiny one draws enter-text pages that do not parse, which ends the episode.
    world_model = add_outcome_head("web-refit", world_model.parent / "final", tmp_path / "web-refit-with-head")
    lengths = []
    for use_head in (True, False):
        env = WebWorldEnv(world_model, task="enter-text", max_steps=4, max_new_tokens=100, outcome_head=use_head)
        _, info = env.reset(seed=7)
        utterance, earlier = env.unwrapped.utterance, []
        for _ in range(2):  # the second step's outcome is asked after the first's typed text
            tree = info["tree"]
            action = next(a for a in info["candidates"] if a.startswith("type") or earlier)
            _, reward, terminated, truncated, info = env.step(action)
            assert info["error"] is None
            target, _ = parse_target(info["prediction"])
            outcome = head.predict(utterance, tree, [action], earlier)[0]
            paid_by_lm = (target["done"], np.clip(target["reward"], -1, 1))
            done, paid = (outcome.done, outcome.reward) if use_head else paid_by_lm
            assert (terminated, reward) == (done, paid if done else 0.0)
            earlier.append(action)
            if terminated or truncated:
                break
        assert env.unwrapped.taken == earlier
        lengths.append(len(earlier))
    assert max(lengths) == 2, "no episode reached a second step: the earlier actions went untested"


def test_a_head_that_reads_typed_text_sees_the_episodes_earlier_type_actions(with_head):
    world_model, data, _ = with_head
    records, _ = load_web_data(data)
    earlier = earlier_actions(records)
    by_step = {(r["task"], r["seed"], r["step"]): r["action"] for r in records}
    for record, before in zip(records, earlier):
        assert before == [by_step[record["task"], record["seed"], s] for s in range(1, record["step"])]
    i = next(i for i, e in enumerate(earlier) if any(a.startswith("type") for a in e))
    typed = [a for a in earlier[i] if a.startswith("type")][-1]
    _, tail = outcome_tail(records[i]["utterance"], records[i]["tree_before"], records[i]["action"], earlier[i])
    assert tail.startswith("\nTyped: ") and typed.removeprefix("type ") in tail.split("\n")[1]
    assert typed_line(["click [3]", "type [4] \"ab\"", "type [5] \"c d\"", "jump"]) == '\nTyped: [4] "ab" [5] "c d"'
    assert outcome_tail("u", "t", "click [1]") == outcome_tail("u", "t", "click [1]", None)  # a head that does not read
    head = OutcomeHead(world_model / OUTCOME_DIR)
    with pytest.raises(ValueError, match="earlier"):
        head.predict_each([records[i]["utterance"]], [records[i]["tree_before"]], [records[i]["action"]])
    with pytest.raises(ValueError, match="twice"):
        earlier_actions([records[0], records[0]])
    old = copy.deepcopy(head)  # a head saved before it read typed text: its inputs and outcomes are as they were
    old.model.config.reads_typed = False
    ids = encode_outcome_inputs(head.tokenizer, [records[i]["utterance"]], [records[i]["tree_before"]],
                                [records[i]["action"]], head.max_tokens)  # fmt: skip
    plain = old.model(**pad_batch(ids, head.tokenizer.pad_token_id, "cpu"))
    assert old.predict_each([records[i]["utterance"]], [records[i]["tree_before"]], [records[i]["action"]],
                            [earlier[i]]) == outcomes_of(plain)  # fmt: skip


def test_an_outcome_head_run_resumes_to_the_same_head(with_head, tmp_path):
    world_model, data, _ = with_head
    straight = train_web_outcome(outcome_config(tmp_path / "straight", world_model, data, steps=20, save_every=10))
    train_web_outcome(outcome_config(tmp_path / "killed", world_model, data, steps=10, save_every=10))
    resumed = train_web_outcome(outcome_config(tmp_path / "killed", world_model, data, steps=20, save_every=10,
                                               resume=True))  # fmt: skip
    a, b = (OutcomeHead(p / OUTCOME_DIR).model.state_dict() for p in (straight, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(FileExistsError, match="--resume"):
        train_web_outcome(outcome_config(tmp_path / "killed", world_model, data, steps=20))


def test_a_corrupt_outcome_head_is_refused_with_its_name(with_head, tmp_path):
    world_model, _, _ = with_head
    broken = tmp_path / "broken"
    shutil.copytree(world_model, broken)
    (broken / OUTCOME_DIR / "model.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(CheckpointError, match="outcome head"):
        WebWorldModel(broken, max_new_tokens=100)
    assert WebWorldModel(broken, max_new_tokens=100, outcome_head=False).outcome is None


def test_a_replay_puts_each_real_outcome_on_the_page_the_model_drew_for_that_step(with_head, tmp_path):
    _, data, _ = with_head
    # The shipped model: the tests' tiny one draws enter-text pages that do not parse, which ends a replay.
    config = ReplayConfig(data=str(data), checkpoint="web-refit", out=str(tmp_path / "replay"), batch_size=4)
    replay_web(config)
    replayed, manifest = load_web_data(config.out)
    real = {(r["task"], r["seed"], r["step"]): r for r in load_web_data(data)[0]}
    assert manifest[MODEL_PAGES]["checkpoint"] == "web-refit" and 0 < len(replayed) <= len(real)
    for task, entry in manifest["tasks"].items():  # the real successes the replayed steps still hold
        assert entry["successes"] == sum(r["done"] and r["reward"] == 1 for r in replayed if r["task"] == task)
    world = WebWorldModel("web-refit", outcome_head=False)
    later = 0
    for record in replayed:
        truth = real[record["task"], record["seed"], record["step"]]
        assert [record[k] for k in ("action", "reward", "done")] == [truth[k] for k in ("action", "reward", "done")]
        if record["step"] == 1:
            assert record["tree_before"] == truth["tree_before"]  # every episode starts from its real page
        (drawn,) = world.predict(record["utterance"], record["tree_before"], [record["action"]])
        assert drawn.error is None and record["tree_after"] == drawn.tree
        after = [r for r in replayed if (r["task"], r["seed"], r["step"]) == (record["task"], record["seed"],
                                                                               record["step"] + 1)]  # fmt: skip
        if after:
            later += 1
            assert after[0]["tree_before"] == drawn.tree  # the next step reads the drawn page, not the real one
    assert later > 0, "no replayed episode got past its first step: the chain of drawn pages went untested"
    with pytest.raises(ValueError, match="drawn by"):
        load_train_and_eval([config.out], "")  # the page trainers' loader
    assert len(load_train_and_eval([config.out], "", model_pages=True)[0]) == len(replayed)
    with pytest.raises(ValueError, match="already a replay"):
        replay_web(dataclasses.replace(config, data=config.out, out=str(tmp_path / "again")))
    with pytest.raises(FileExistsError, match="--overwrite"):
        replay_web(config)


def test_eval_web_scores_the_outcome_of_the_lm_and_of_the_head_on_pages_the_head_never_saw(with_head, untrained):
    world_model, data, held_out = with_head
    config = WebEvalConfig(checkpoint=str(world_model), data=str(held_out), seen_tasks=TASKS, max_new_tokens=100)
    result = run_web_eval(config)
    head = OutcomeHead(world_model / OUTCOME_DIR)
    records, _ = load_web_data(held_out)
    by_hand = outcome_metrics(head.model, outcome_examples(records, head.tokenizer, head.max_tokens, True),
                              head.tokenizer.pad_token_id)  # fmt: skip
    assert result["head_outcome_accuracy"] == pytest.approx(by_hand["outcome_accuracy"])
    assert result["enter-text_head_outcome_accuracy"] == pytest.approx(by_hand["enter-text/outcome_accuracy"])
    assert 0 < result["lm_outcome_accuracy"] <= 1
    never_parses = run_web_eval(dataclasses.replace(config, checkpoint=str(untrained)))
    assert never_parses["lm_outcome_accuracy"] == 0.0 and "head_outcome_accuracy" not in never_parses
    with pytest.raises(ValueError, match="outcome head"):
        run_web_eval(dataclasses.replace(config, data=str(data)))
    with pytest.raises(ValueError, match="drawn by"):
        run_web_eval(dataclasses.replace(config, data=str(replay_web(ReplayConfig(data=str(held_out),
                                         checkpoint=str(world_model), max_new_tokens=100)))))

"""TRL and verl adapters score exactly as the domain rewards; exported data reads back as both trainers read it;
TRL's GRPOTrainer runs on the exported text-game dataset with the adapter as its reward."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rlvr_gym.data import video_tokens as V
from rlvr_gym.data.bytesized32 import load_transitions
from rlvr_gym.data.textgame import target_text
from rlvr_gym.domains import textgame, web
from rlvr_gym.integrations import trl as trl_rewards
from rlvr_gym.integrations.export import ExportConfig, export, verl_rows
from rlvr_gym.integrations.verl import compute_score

FIXTURE = Path(__file__).parent / "fixtures" / "bytesized32_small.jsonl"
TREE_BEFORE = "[1] RootWebArea 'Click submit'\n\t[2] button 'Submit'\n\t[3] StaticText 'hello'"
TREE_AFTER = "[1] RootWebArea 'Click submit'\n\t[2] button 'Submit' focused: true\n\t[4] StaticText 'thanks'"


def textgame_completions(transitions) -> tuple[list[str], list]:
    """For each transition: the gold diff, the "no change" diff, and text that does not parse."""
    completions, rows = [], []
    for t in transitions:
        for text in (target_text(t), textgame.format_target(textgame.empty_diff()), '{"m": [{"u": '):
            completions.append(text)
            rows.append(t)
    return completions, rows


@pytest.mark.parametrize("adapter, domain_fn, best", [
    (trl_rewards.textgame_binary_reward, textgame.binary_reward, 1.0),
    (trl_rewards.textgame_task_reward, textgame.task_reward, 1.3),
])  # fmt: skip
def test_trl_textgame_rewards_equal_domain_rewards_on_dicts_and_json(adapter, domain_fn, best):
    completions, rows = textgame_completions(load_transitions(FIXTURE))
    current, next_ = [t.current for t in rows], [t.next for t in rows]
    expected = [r["score"] for r in domain_fn(completions, current, next_)]
    assert adapter(prompts=None, completions=completions, current=current, next=next_) == expected
    as_json = adapter(completions=completions, current=[json.dumps(s) for s in current], next=[json.dumps(s) for s in next_])
    assert as_json == expected
    assert all(isinstance(x, float) for x in expected)
    assert expected[0::3] == pytest.approx([best] * len(rows[0::3]))  # the gold diff gets the reward's maximum
    assert expected[2::3] == [0.0] * len(rows[0::3])  # unparsable scores 0
    chat = adapter(completions=[[{"role": "assistant", "content": c}] for c in completions], current=current, next=next_)
    assert chat == expected


def test_trl_web_reward_equals_domain_reward():
    gold = web.format_target(web.make_diff(TREE_BEFORE, TREE_AFTER), 1.0, True)
    partial = web.format_target({"new": ["\t[4] StaticText 'thanks'"], "deleted": [], "updated": []}, 0.0, True)
    completions = [gold, partial, web.no_change_target(), "Reward: yes"]
    columns = dict(tree_before=[TREE_BEFORE] * 4, tree_after=[TREE_AFTER] * 4, reward=[1.0] * 4, done=[True] * 4)
    expected = [r["score"] for r in web.web_reward(completions, **columns)]
    scores = trl_rewards.web_reward(completions=completions, **columns)
    assert scores == expected
    assert scores[0] == 1.0 and 0.0 < scores[1] < 1.0 and scores[3] == 0.0


def test_trl_reward_names_missing_columns():
    with pytest.raises(ValueError, match="current"):
        trl_rewards.textgame_binary_reward(completions=["{}"], next=[{}])


@pytest.mark.parametrize("metric", ["binary", "task"])
def test_verl_compute_score_on_exported_parquet_equals_domain_reward(tmp_path, metric):
    import pyarrow.parquet as pq

    transitions = load_transitions(FIXTURE)
    path = export(ExportConfig(domain="textgame", format="verl", out=str(tmp_path / "train.parquet"), data=str(FIXTURE),
                               reward=metric, balance=False))  # fmt: skip
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == len(transitions)
    completions, _ = textgame_completions(transitions)
    domain_fn = textgame.binary_reward if metric == "binary" else textgame.task_reward
    for i, (row, t) in enumerate(zip(rows, transitions)):
        assert row["data_source"] == "rlvr_gym/textgame"
        assert row["prompt"] == [{"role": "user", "content": textgame.format_prompt(t.current, t.action, t.task)}]
        assert row["reward_model"]["style"] == "rule"
        assert row["extra_info"] == {"split": "train", "index": i}
        results = [
            compute_score(data_source=row["data_source"], solution_str=c, ground_truth=row["reward_model"]["ground_truth"],
                          extra_info=row["extra_info"])
            for c in completions[3 * i: 3 * i + 3]
        ]  # fmt: skip
        expected = domain_fn(completions[3 * i: 3 * i + 3], [t.current] * 3, [t.next] * 3)
        assert [r["score"] for r in results] == [e["score"] for e in expected]
        assert [r["parsed"] for r in results] == [1.0, 1.0, 0.0]
        assert len({tuple(sorted(r)) for r in results}) == 1  # verl stacks every key across the batch
        if metric == "task":
            assert results[0]["exact"] == 1.0 and results[2]["exact"] == 0.0


def test_verl_compute_score_on_web_rows():
    row = {"prompt": "p", "tree_before": TREE_BEFORE, "tree_after": TREE_AFTER, "reward": 1.0, "done": True}
    (verl_row,) = verl_rows([row], ExportConfig(domain="web", format="verl"))
    assert verl_row["data_source"] == "rlvr_gym/web"
    gold = web.format_target(web.make_diff(TREE_BEFORE, TREE_AFTER), 1.0, True)
    score = compute_score(verl_row["data_source"], gold, verl_row["reward_model"]["ground_truth"], verl_row["extra_info"])
    assert score["score"] == 1.0 and score["f1"] == 1.0
    wrong = compute_score(verl_row["data_source"], "nonsense", verl_row["reward_model"]["ground_truth"])
    assert wrong["score"] == 0.0 and wrong["parsed"] == 0.0 and set(wrong) == set(score)
    with pytest.raises(ValueError, match="data_source"):
        compute_score("openai/gsm8k", gold, verl_row["reward_model"]["ground_truth"])


def test_export_refuses_a_verl_path_that_is_not_parquet(tmp_path):
    with pytest.raises(ValueError, match="parquet"):
        export(ExportConfig(format="verl", out=str(tmp_path / "train.json"), data=str(FIXTURE)))


def test_trl_export_round_trip(tmp_path):
    from datasets import load_from_disk

    transitions = load_transitions(FIXTURE)
    path = export(ExportConfig(domain="textgame", format="trl", out=str(tmp_path / "trl"), data=str(FIXTURE),
                               balance=False, limit=4))  # fmt: skip
    dataset = load_from_disk(str(path))
    assert dataset.column_names == ["prompt", "current", "next"]
    assert dataset["prompt"] == [textgame.format_prompt(t.current, t.action, t.task) for t in transitions[:4]]
    gold = [target_text(t) for t in transitions[:4]]
    columns = {k: dataset[k] for k in ("current", "next")}
    assert trl_rewards.textgame_binary_reward(prompts=dataset["prompt"], completions=gold, **columns) == [1.0] * 4


def test_export_balances_like_the_trainer(tmp_path):
    from datasets import load_from_disk

    from rlvr_gym.data.textgame import load_training_transitions
    from rlvr_gym.domains.textgame import DEFAULT_BALANCE

    path = export(ExportConfig(format="trl", out=str(tmp_path / "trl"), data=str(FIXTURE), reward="task"))
    expected = load_training_transitions(str(FIXTURE), "", DEFAULT_BALANCE["task"], 0)
    assert load_from_disk(str(path))["prompt"] == [textgame.format_prompt(t.current, t.action, t.task) for t in expected]


def tiny_grpo_args(tmp_path: Path, lr: float, completion_tokens: int):
    """Two GRPO steps on CPU: 2 prompts x 2 generations per step."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, learning_rate=lr, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=2,
        max_completion_length=completion_tokens, optim="adamw_torch", activation_checkpointing=False, bf16=False,
        use_cpu=True, seed=0, logging_steps=1, save_strategy="no", eval_strategy="no", report_to=[], disable_tqdm=True,
    )  # fmt: skip


def recorded(adapter, calls: list):
    """The adapter as TRL's reward, recording each call's columns and scores."""

    @functools.wraps(adapter)
    def reward(**kwargs):
        scores = adapter(**kwargs)
        calls.append((kwargs, scores))
        return scores

    return reward


def test_trl_grpo_trainer_runs_on_exported_textgame_data(tmp_path):
    pytest.importorskip("trl")
    import torch
    from datasets import load_from_disk
    from trl import GRPOTrainer

    from rlvr_gym.data.textgame import train_tokenizer, transition_texts
    from rlvr_gym.models.lm import LlamaSize, build_llama

    torch.set_num_threads(1)
    path = export(ExportConfig(format="trl", out=str(tmp_path / "trl"), data=str(FIXTURE), balance=False, limit=4))
    tokenizer = train_tokenizer(transition_texts(load_transitions(FIXTURE)), vocab_size=600)
    torch.manual_seed(0)
    model = build_llama(len(tokenizer), LlamaSize(hidden_size=32, layers=1, heads=2, intermediate_size=64), tokenizer)
    dataset = load_from_disk(str(path))
    calls = []
    trainer = GRPOTrainer(model=model, reward_funcs=recorded(trl_rewards.textgame_binary_reward, calls),
                          args=tiny_grpo_args(tmp_path, lr=1e-4, completion_tokens=8), train_dataset=dataset,
                          processing_class=tokenizer)  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 2
    logged = [e for e in trainer.state.log_history if "rewards/textgame_binary_reward/mean" in e]
    assert len(logged) == 2
    assert len(calls) == 2
    for kwargs, scores in calls:
        # TRL hands the adapter each completion with its own prompt's states, as the exported rows hold them
        assert len(scores) == len(kwargs["completions"]) == len(kwargs["current"]) == 4
        for prompt, current in zip(kwargs["prompts"], kwargs["current"]):
            assert dataset["current"][dataset["prompt"].index(prompt)] == current
        assert scores == [r["score"] for r in textgame.binary_reward(
            kwargs["completions"], [json.loads(s) for s in kwargs["current"]], [json.loads(s) for s in kwargs["next"]])]


# ---------------------------------------------------------------------------------------------------- rt1


@pytest.fixture(scope="module")
def rt1_data(tmp_path_factory):
    """Two short real episodes (MuJoCo tabletop) exported for TRL and verl with the shipped rt1-rlvr checkpoint."""
    from rlvr_gym.data.episodes import CollectConfig, collect, load_episodes

    root = tmp_path_factory.mktemp("rt1")
    episodes = str(root / "episodes")
    collect(CollectConfig(out=episodes, episodes=2, seed=31, horizon=5, tasks=("move_near", "open_drawer")))
    trl_dir = export(ExportConfig(domain="rt1", format="trl", out=str(root / "trl"), data=episodes))
    parquet = export(ExportConfig(domain="rt1", format="verl", out=str(root / "train.parquet"), data=episodes))
    return load_episodes(episodes), trl_dir, parquet


def rt1_completions(next_ids: list[list[int]]) -> list[str]:
    """For each row: the real next frame's codes, random codes (with the real flag), and text that is no frame."""
    from rlvr_gym.integrations.verl import rt1_token_text

    rng = np.random.default_rng(0)
    out = []
    for ids in next_ids:
        random_codes = [int(c) for c in rng.integers(0, V.CODEBOOK_SIZE, V.FRAME_TOKENS)] + [ids[-1]]
        out += [rt1_token_text(ids), rt1_token_text(random_codes), "<f12><f7> the next frame"]
    return out


def test_rt1_token_names_round_trip_the_whole_vocabulary_through_the_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from rlvr_gym.integrations.verl import rt1_token_ids, rt1_token_text, rt1_tokenizer

    tokenizer = rt1_tokenizer()
    ids = list(range(V.VOCAB_SIZE))
    text = rt1_token_text(ids)
    assert len(tokenizer) == V.VOCAB_SIZE
    assert rt1_token_ids(text) == ids and tokenizer(text).input_ids == ids
    assert text.startswith("<f0><f1>")
    assert rt1_token_text([V.ACTION_OFFSET + 255, V.FLAG_SUCCESS, V.BOS]) == "<a255><success><bos>"
    # TRL and verl decode completions without special tokens: every frame code, bin and flag survives
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert rt1_token_ids(decoded) == ids[: V.BOS]
    assert rt1_token_ids(" <f3>\n<running> ") == [3, V.FLAG_RUNNING]
    for bad in ("<f3>hello", "<f1000>", "<g1>"):
        with pytest.raises(ValueError):
            rt1_token_ids(bad)
    # verl loads the tokenizer from the model directory
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(text).input_ids == ids and (reloaded.bos_token_id, reloaded.eos_token_id) == (V.BOS, V.PAD)
    chat = reloaded.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True)
    assert chat["input_ids"] == ids


def test_rt1_export_holds_the_trainers_prompts_and_the_real_next_frames(rt1_data):
    import pyarrow.parquet as pq
    from datasets import load_from_disk

    from rlvr_gym.data.robot import episode_codes, frame_flags, rlvr_examples
    from rlvr_gym.integrations.verl import decode_frame, rt1_tokenizer, rt1_world

    episodes, trl_dir, parquet = rt1_data
    world = rt1_world("rt1-rlvr")
    examples = rlvr_examples(world, episodes, horizon=1)
    dataset = load_from_disk(str(trl_dir))
    rows = pq.read_table(parquet).to_pylist()
    assert len(dataset) == len(rows) == len(examples) == sum(len(e) for e in episodes)
    assert set(dataset.column_names) == {
        "prompt", "prompt_ids", "next_ids", "checkpoint", "context_frame", "next_frame", "episode", "t", "before_frame",
        "last_frame", "action"
    }  # fmt: skip
    tokenizer = rt1_tokenizer()
    codes = [episode_codes(world.frame_tokenizer, e) for e in episodes]
    for i, (trl_row, verl_row, example) in enumerate(zip(dataset, rows, examples)):
        e, t = example["episode"], example["t"]
        assert (trl_row["episode"], trl_row["t"]) == (e, t) and trl_row["checkpoint"] == "rt1-rlvr"
        assert trl_row["prompt_ids"] == example["prompt_ids"]
        # what TRL (plain prompt) and verl (chat messages) tokenize is exactly the world model's prompt
        assert tokenizer(trl_row["prompt"]).input_ids == example["prompt_ids"]
        chat = tokenizer.apply_chat_template(verl_row["prompt"], tokenize=True, add_generation_prompt=True)
        assert chat["input_ids"] == example["prompt_ids"]
        assert trl_row["next_ids"] == V.step_tokens(codes[e][t + 1], frame_flags(episodes[e])[t + 1])
        assert np.array_equal(decode_frame(trl_row["next_frame"]), episodes[e].frames[t + 1])
        assert np.array_equal(decode_frame(trl_row["context_frame"]), episodes[e].frames[0])
        gold = json.loads(verl_row["reward_model"]["ground_truth"])
        assert verl_row["data_source"] == "rlvr_gym/rt1" and verl_row["ability"] == "world_model/rt1"
        assert verl_row["extra_info"] == {"split": "train", "index": i, "episode": e, "t": t}
        assert gold["next_ids"] == trl_row["next_ids"] and gold["checkpoint"] == "rt1-rlvr"
        assert np.array_equal(decode_frame(gold["next_frame"]), episodes[e].frames[t + 1])
        assert np.array_equal(decode_frame(gold["last_frame"]), episodes[e].frames[t])
        assert np.array_equal(decode_frame(trl_row["before_frame"]), episodes[e].frames[max(t - 1, 0)])
        assert gold["action"] == trl_row["action"] == pytest.approx(episodes[e].actions[t].tolist())


def test_rt1_reward_scores_the_real_next_frame_above_random_codes_as_the_trainer_does(rt1_data):
    from datasets import load_from_disk

    from rlvr_gym.domains.robot import frame_reward_fn
    from rlvr_gym.integrations.verl import RT1_PARSE_FAILURE, rt1_token_ids, rt1_world

    episodes, trl_dir, _ = rt1_data
    dataset = load_from_disk(str(trl_dir))
    completions = rt1_completions(dataset["next_ids"])
    columns = {k: [v for v in dataset[k] for _ in range(3)] for k in ("checkpoint", "context_frame", "next_frame", "before_frame",
                                                                        "last_frame", "action")}
    scores = trl_rewards.rt1_frame_reward(prompts=None, completions=completions, **columns)
    gold, random, garbage = scores[0::3], scores[1::3], scores[2::3]
    assert all(g > r for g, r in zip(gold, random))
    assert all(r > RT1_PARSE_FAILURE for r in random) and garbage == [RT1_PARSE_FAILURE] * len(dataset)
    # the in-house trainer's reward on the same episodes and steps
    parsable = [c for i, c in enumerate(completions) if i % 3 != 2]
    trainer = frame_reward_fn(rt1_world("rt1-rlvr"), episodes, horizon=1)(
        [rt1_token_ids(c) for c in parsable], [e for e in dataset["episode"] for _ in range(2)],
        [t for t in dataset["t"] for _ in range(2)])  # fmt: skip
    assert [s for i, s in enumerate(scores) if i % 3 != 2] == pytest.approx([r["score"] for r in trainer], abs=1e-6)
    chat = [[{"role": "assistant", "content": c}] for c in completions]
    assert trl_rewards.rt1_frame_reward(completions=chat, **columns) == pytest.approx(scores, abs=1e-6)
    with pytest.raises(ValueError, match="next_frame"):
        trl_rewards.rt1_frame_reward(completions=completions, checkpoint=columns["checkpoint"],
                                     context_frame=columns["context_frame"])  # fmt: skip
    with pytest.raises(ValueError, match="before_frame, last_frame and action"):
        trl_rewards.rt1_frame_reward(completions=completions, checkpoint=columns["checkpoint"],
                                     context_frame=columns["context_frame"], next_frame=columns["next_frame"])  # fmt: skip


def test_verl_compute_score_on_exported_rt1_rows_equals_the_trl_reward(rt1_data):
    import pyarrow.parquet as pq

    _, trl_dir, parquet = rt1_data
    rows = pq.read_table(parquet).to_pylist()[:4]
    completions = rt1_completions([json.loads(r["reward_model"]["ground_truth"])["next_ids"] for r in rows])
    results = [
        compute_score(data_source=row["data_source"], solution_str=c, ground_truth=row["reward_model"]["ground_truth"],
                      extra_info=row["extra_info"])
        for i, row in enumerate(rows) for c in completions[3 * i: 3 * i + 3]
    ]  # fmt: skip
    from datasets import load_from_disk

    dataset = load_from_disk(str(trl_dir)).select(range(len(rows)))
    columns = {k: [v for v in dataset[k] for _ in range(3)] for k in ("checkpoint", "context_frame", "next_frame", "before_frame",
                                                                        "last_frame", "action")}
    expected = trl_rewards.rt1_frame_reward(completions=completions, **columns)
    # verl scores one completion at a time, TRL a batch: convolutions batched differently can round a decoded pixel
    # the other way, which moves LPIPS by ~1e-5
    assert [r["score"] for r in results] == pytest.approx(expected, abs=1e-4)
    assert [r["parsed"] for r in results] == [1.0, 1.0, 0.0] * len(rows)
    assert len({tuple(sorted(r)) for r in results}) == 1 and set(results[0]) == {"score", "parsed", "l1", "lpips"}
    assert all(r["l1"] > 0 and r["lpips"] >= 0 and r["score"] == pytest.approx(-(r["l1"] + r["lpips"]))
               for r in results[0::3])  # fmt: skip


def test_rt1_export_stops_at_the_limit(rt1_data, tmp_path):
    from datasets import load_from_disk

    episodes, trl_dir, _ = rt1_data
    data = Path(trl_dir).parent / "episodes"
    path = export(ExportConfig(domain="rt1", format="trl", out=str(tmp_path / "trl"), data=str(data), limit=2))
    assert load_from_disk(str(path))["prompt"] == load_from_disk(str(trl_dir))["prompt"][:2]


def test_trl_grpo_trainer_runs_on_exported_rt1_data(rt1_data, tmp_path):
    pytest.importorskip("trl")
    import torch
    from datasets import load_from_disk
    from trl import GRPOTrainer

    from rlvr_gym.integrations.verl import RT1_PARSE_FAILURE, rt1_token_ids

    torch.set_num_threads(1)
    torch.manual_seed(0)
    _, trl_dir, _ = rt1_data
    dataset = load_from_disk(str(trl_dir))
    model, tokenizer = trl_rewards.rt1_policy("rt1-rlvr")
    calls = []
    trainer = GRPOTrainer(model=model, reward_funcs=recorded(trl_rewards.rt1_frame_reward, calls),
                          args=tiny_grpo_args(tmp_path, lr=1e-5, completion_tokens=V.rollout_length(1)),
                          train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 2 and len(calls) == 2
    for kwargs, scores in calls:
        assert len(scores) == len(kwargs["completions"]) == len(kwargs["next_frame"]) == 4
        for prompt, text, ids in zip(kwargs["prompts"], kwargs["completions"], kwargs["completion_ids"]):
            # the decoded completion names exactly the world-model ids that were sampled
            assert rt1_token_ids(text) == [i for i in ids if i != V.PAD]
            assert dataset["prompt_ids"][dataset["prompt"].index(prompt)] == tokenizer(prompt).input_ids
        # TRL samples without the trainer's allowed-token mask, so some samples put a bin where a code goes
        assert all(s == RT1_PARSE_FAILURE or RT1_PARSE_FAILURE < s < 0.0 for s in scores)
    assert any(s > RT1_PARSE_FAILURE for _, scores in calls for s in scores)

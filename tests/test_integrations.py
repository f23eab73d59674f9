"""TRL and verl adapters score exactly as the domain rewards; exported data reads back as both trainers read it;
TRL's GRPOTrainer runs on the exported text-game dataset with the adapter as its reward."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rlvr_gym.data.bytesized32 import load_transitions
from rlvr_gym.domains import textgame, web
from rlvr_gym.integrations import trl as trl_rewards
from rlvr_gym.integrations.export import ExportConfig, export, verl_rows
from rlvr_gym.integrations.verl import compute_score
from rlvr_gym.train.textgame import target_text

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
        assert row["prompt"] == [{"role": "user", "content": textgame.format_prompt(t.current, t.action)}]
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
    assert dataset["prompt"] == [textgame.format_prompt(t.current, t.action) for t in transitions[:4]]
    gold = [target_text(t) for t in transitions[:4]]
    columns = {k: dataset[k] for k in ("current", "next")}
    assert trl_rewards.textgame_binary_reward(prompts=dataset["prompt"], completions=gold, **columns) == [1.0] * 4


def test_export_balances_like_the_trainer(tmp_path):
    from datasets import load_from_disk

    from rlvr_gym.train.textgame import DEFAULT_BALANCE, load_training_transitions

    path = export(ExportConfig(format="trl", out=str(tmp_path / "trl"), data=str(FIXTURE), reward="task"))
    expected = load_training_transitions(str(FIXTURE), "", DEFAULT_BALANCE["task"], 0)
    assert load_from_disk(str(path))["prompt"] == [textgame.format_prompt(t.current, t.action) for t in expected]


def test_trl_grpo_trainer_runs_on_exported_textgame_data(tmp_path):
    pytest.importorskip("trl")
    import torch
    from datasets import load_from_disk
    from trl import GRPOConfig, GRPOTrainer

    from rlvr_gym.models.lm import LlamaSize, build_llama
    from rlvr_gym.train.textgame import train_tokenizer, transition_texts

    torch.set_num_threads(1)
    path = export(ExportConfig(format="trl", out=str(tmp_path / "trl"), data=str(FIXTURE), balance=False, limit=4))
    tokenizer = train_tokenizer(transition_texts(load_transitions(FIXTURE)), vocab_size=600)
    torch.manual_seed(0)
    model = build_llama(len(tokenizer), LlamaSize(hidden_size=32, layers=1, heads=2, intermediate_size=64), tokenizer)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, learning_rate=1e-4, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=2, max_completion_length=8,
        optim="adamw_torch", activation_checkpointing=False, bf16=False, use_cpu=True, seed=0, logging_steps=1,
        save_strategy="no", eval_strategy="no", report_to=[], disable_tqdm=True,
    )  # fmt: skip
    dataset = load_from_disk(str(path))
    calls = []

    @functools.wraps(trl_rewards.textgame_binary_reward)
    def reward(**kwargs):
        scores = trl_rewards.textgame_binary_reward(**kwargs)
        calls.append((kwargs, scores))
        return scores

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
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

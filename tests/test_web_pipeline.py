"""The web world-model pipeline on real MiniWoB++ transitions: collect, tokenizer, SFT, RLVR, evaluation.

One browser records a small training set and a held-out set (another seed, one task never trained on); everything
else runs on what it recorded, with a tiny Llama.
"""

import dataclasses
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.web import WebTaskEnv, browser_available
from rlvr_gym.data.web import (
    HELDOUT_TASKS,
    SEEDS_PER_RUN,
    TRAIN_TASKS,
    TRAINING_RECORD,
    load_train_and_eval,
    load_web_data,
    prompt_text,
    target_text,
    train_web_tokenizer,
    transition_texts,
)
from rlvr_gym.data.web_collect import WebCollectConfig, collect_web
from rlvr_gym.domains.web import best_by_web_reward, item_f1, make_diff, no_change_target
from rlvr_gym.evaluation.web import WebEvalConfig, run_web_eval
from rlvr_gym.files import read_log
from rlvr_gym.models.lm import CheckpointError, LlamaSize, context_of, load_model
from rlvr_gym.train.grpo import GRPOConfig
from rlvr_gym.train.sft import SFTConfig
from rlvr_gym.train.web import WebRLVRConfig, WebSFTConfig, run_web_rlvr, run_web_sft

pytestmark = pytest.mark.skipif(
    not browser_available(), reason="needs Debian's chromium and chromium-driver (make browser)"
)
REPO = Path(__file__).resolve().parents[1]
TRAIN = ("click-test-2", "login-user")
HELDOUT = ("click-test-2", "enter-text")
TINY = LlamaSize(hidden_size=32, layers=1, heads=2, intermediate_size=64, max_positions=1536)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("web")
    env = WebTaskEnv(TRAIN[0])
    try:
        train = collect_web(WebCollectConfig(out=str(root / "train"), tasks=TRAIN, episodes=2, seed=0, max_steps=6,
                                             workers=1), env)  # fmt: skip
        held_out = collect_web(WebCollectConfig(out=str(root / "heldout"), tasks=HELDOUT, episodes=2, seed=1,
                                                max_steps=6, workers=1), env)  # fmt: skip
    finally:
        env.close()
    return train, held_out


def sft_config(data, run_dir, **kw) -> WebSFTConfig:
    train, held_out = data
    settings = dict(
        run_dir=str(run_dir), data=(str(train),), eval_data=str(held_out), size=TINY, vocab_size=400,
        eval_predict_examples=4, eval_batch_size=4, max_prompt_tokens=1024, max_target_tokens=512,
        sft=SFTConfig(steps=3, batch_size=4, micro_batch=4, save_every=2, eval_examples=4),
    )  # fmt: skip
    return WebSFTConfig(**{**settings, **kw})


@pytest.fixture(scope="module")
def sft_run(data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sft")
    run_web_sft(sft_config(data, run_dir))
    return run_dir


def test_default_split_holds_out_two_tasks():
    assert len(TRAIN_TASKS) == 11 and len(HELDOUT_TASKS) == 2 and not set(TRAIN_TASKS) & set(HELDOUT_TASKS)


def test_collect_writes_task_files_and_a_manifest_that_read_back(data):
    train, held_out = data
    records, manifest = load_web_data(train)
    assert list(manifest["tasks"]) == list(TRAIN) and manifest["transitions"] == len(records) > 0
    for task, entry in manifest["tasks"].items():
        assert entry["seeds"] == [0, 1] and not entry["failed_seeds"]
        with gzip.open(train / entry["file"], "rt") as f:
            assert sum(1 for _ in f) == entry["transitions"] == sum(r["task"] == task for r in records) > 0
    assert manifest["command"].startswith("rlvr-gym collect web --out ") and "--seed 0" in manifest["command"]
    for r in records:
        assert {"utterance", "tree_before", "action", "tree_after", "reward", "done", "task", "seed", "skill"} <= set(r)
        assert r["seed"] in (0, 1) and 1 <= r["step"] <= 6
    episode = [r for r in records if r["task"] == "login-user" and r["seed"] == 0]
    assert [r["step"] for r in episode] == list(range(1, len(episode) + 1))
    assert all(a["tree_after"] == b["tree_before"] for a, b in zip(episode, episode[1:]))
    _, held = load_web_data(held_out)
    assert held["tasks"]["enter-text"]["seeds"] == [SEEDS_PER_RUN, SEEDS_PER_RUN + 1]


def test_train_and_held_out_sets_must_not_share_an_episode(data):
    train, held_out = data
    records, manifests, _, _ = load_train_and_eval([str(train), str(held_out)], "")  # two training sets together
    assert len(records) == sum(m["transitions"] for _, m in manifests) and [d for d, _ in manifests] == [str(train), str(held_out)]
    with pytest.raises(ValueError, match="share .* episodes .*own --seed"):
        load_train_and_eval(str(train), str(train))
    with pytest.raises(ValueError, match="share .* episodes .*own --seed"):
        load_train_and_eval([str(train), str(train)], "")


def test_tokenizer_round_trips_and_makes_element_ids_single_tokens(data):
    records, _ = load_web_data(data[0])
    texts = list(transition_texts(records))
    tokenizer = train_web_tokenizer(texts, 1000)
    for text in texts + ["Task: unseen ünïcode 🙂 [12345] x: true\n\t\t[7] button 'ok' hidden: true"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text
    element_ids = {line.split("]")[0].strip() + "]" for r in records for line in r["tree_after"].split("\n")}
    assert len(element_ids) > 3
    for element_id in element_ids:
        assert len(tokenizer.encode(element_id, add_special_tokens=False)) == 1, element_id
    assert len(tokenizer.encode(" focused: true", add_special_tokens=False)) == 1
    specials = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id]
    assert tokenizer.convert_ids_to_tokens(specials) == ["<pad>", "<s>", "</s>"]


def test_sft_gives_a_loadable_checkpoint_with_its_training_record(sft_run, data):
    model, tokenizer = load_model(sft_run / "final")
    assert model.config.vocab_size == len(tokenizer) <= 400
    records, _ = load_web_data(data[0])
    text = prompt_text(records[0]) + target_text(records[0])
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    stats = json.loads((sft_run / "data_stats.json").read_text())
    assert stats["kept"] + stats["dropped_too_long"] == len(records) and stats["prompt_tokens"]["median"] > 0
    assert set(stats["per_task"]) == set(TRAIN)
    log = read_log(sft_run)
    assert [r["step"] for r in log if "train/loss" in r] == [1, 2, 3]
    assert {"eval/loss", "eval/f1", "eval/seen_f1", "eval/heldout_nochange_f1"} <= set(log[-1])
    record = json.loads((sft_run / "final" / TRAINING_RECORD).read_text())
    assert record["tasks"] == sorted(TRAIN) and record["seeds"]["login-user"] == [0, 1]


def test_sft_resume_continues_and_refuses_other_settings(sft_run, data):
    with pytest.raises(FileExistsError, match="--resume"):
        run_web_sft(sft_config(data, sft_run))
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        run_web_sft(sft_config(data, sft_run, resume=True, max_prompt_tokens=900))
    config = sft_config(data, sft_run, resume=True)
    config.sft.steps = 4
    run_web_sft(config)
    assert [r["step"] for r in read_log(sft_run) if "train/loss" in r] == [1, 2, 3, 4]


def test_sft_from_a_local_pretrained_model_keeps_its_tokenizer(sft_run, data, tmp_path):
    config = sft_config(data, tmp_path, model=str(sft_run / "final"), eval_data="")
    config.sft.steps = 1
    final = run_web_sft(config)
    assert not (tmp_path / "init").exists() and [r["step"] for r in read_log(tmp_path)] == [1]
    assert load_model(final)[1].get_vocab() == load_model(sft_run / "final")[1].get_vocab()
    # limits beyond the model's 1,536 positions: a copy with a longer context trains
    longer = run_web_sft(sft_config(data, tmp_path / "longer", model=str(final), eval_data="", max_prompt_tokens=1536))
    assert context_of(tmp_path / "longer" / "init") == context_of(longer) == 1536 + 512


def test_a_refit_on_new_episodes_keeps_the_record_of_the_old_ones(sft_run, data, tmp_path):
    train, held_out = data
    config = dataclasses.replace(sft_config(data, tmp_path, model=str(sft_run / "final"), eval_data=""),
                                 data=(str(held_out),))
    config.sft.steps = 1
    record = json.loads((run_web_sft(config) / TRAINING_RECORD).read_text())
    assert record["tasks"] == sorted(set(TRAIN) | set(HELDOUT))
    assert record["seeds"]["click-test-2"] == [0, 1, 1_000_000, 1_000_001]  # the base model's pages and the new ones
    with pytest.raises(ValueError, match="share"):  # scoring on pages the base model was trained on
        run_web_sft(dataclasses.replace(sft_config(data, tmp_path / "again", model=str(sft_run / "final"),
                                                   eval_data=str(train)), data=(str(held_out),)))


def test_rlvr_two_steps_log_reward_and_parse_failures(sft_run, data, tmp_path):
    train, held_out = data
    config = WebRLVRConfig(
        run_dir=str(tmp_path), model=str(sft_run / "final"), data=(str(train),), eval_data=str(held_out),
        eval_predict_examples=2, eval_batch_size=2,
        grpo=GRPOConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=96, lr=1e-4, save_every=2),
    )  # fmt: skip
    final = run_web_rlvr(config)
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    trained = [r for r in read_log(tmp_path) if "reward/mean" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for r in trained:
        assert 0 <= r["reward/parse_failure_rate"] <= 1 and 0 <= r["reward/mean"] <= 1
    assert json.loads((final / TRAINING_RECORD).read_text())["tasks"] == sorted(TRAIN)


def test_eval_on_a_recorded_set_reports_every_metric_and_the_no_change_baseline(sft_run, data):
    records, _ = load_web_data(data[1])
    result = run_web_eval(WebEvalConfig(checkpoint=str(sft_run / "final"), data=str(data[1]), max_new_tokens=64))
    json.dumps(result)
    for prefix in ("", "seen_", "heldout_"):
        for key in ("precision", "recall", "f1", "reward_accuracy", "done_accuracy", "parse_failure_rate", "n",
                    "nochange_f1"):  # fmt: skip
            assert result[prefix + key] is not None, prefix + key
    assert result["n"] == len(records) == result["seen_n"] + result["heldout_n"]
    assert result["heldout_n"] == sum(r["task"] == "enter-text" for r in records) > 0
    empty = {"new": [], "deleted": [], "updated": []}
    by_hand = [item_f1(empty, make_diff(r["tree_before"], r["tree_after"])) for r in records]
    assert result["nochange_f1"] == pytest.approx(sum(by_hand) / len(by_hand))
    held = [f for f, r in zip(by_hand, records) if r["task"] == "enter-text"]
    assert result["heldout_nochange_f1"] == pytest.approx(sum(held) / len(held))
    # a transition that changes the page scores 0 for "no change", one that does not scores 1
    changed = next(r for r in records if any(make_diff(r["tree_before"], r["tree_after"]).values()))
    assert item_f1(empty, make_diff(changed["tree_before"], changed["tree_after"])) == 0.0
    assert 0 <= result["f1"] <= 1 and 0 <= result["parse_failure_rate"] <= 1


def test_pages_longer_than_the_context_score_as_failures_without_decoding(sft_run, data):
    records, _ = load_web_data(data[1])
    fits = run_web_eval(WebEvalConfig(checkpoint=str(sft_run / "final"), data=str(data[1]), max_new_tokens=64))
    assert fits["over_context_rate"] == 0.0
    # a completion limit as long as the whole context leaves no room for any page
    none = run_web_eval(WebEvalConfig(checkpoint=str(sft_run / "final"), data=str(data[1]), max_new_tokens=10_000))
    assert none["over_context_rate"] == 1.0 and none["parse_failure_rate"] == 1.0 and none["f1"] == 0.0
    assert none["nochange_f1"] == fits["nochange_f1"] and none["n"] == len(records)


def test_best_of_n_keeps_the_sample_closest_to_the_gold_and_seen_tasks_can_be_overridden(sft_run, data):
    records, _ = load_web_data(data[1])
    changed = [r for r in records if any(make_diff(r["tree_before"], r["tree_after"]).values())][:2]
    samples = [["garbage", no_change_target(), target_text(r)] for r in changed]
    assert best_by_web_reward(samples, changed) == [target_text(r) for r in changed]
    result = run_web_eval(WebEvalConfig(checkpoint=str(sft_run / "final"), data=str(data[1]), best_of=2,
                                        max_new_tokens=16, seen_tasks=HELDOUT))  # fmt: skip
    assert result["best_of"] == 2 and result["seen_n"] == result["n"] and result["heldout_f1"] is None


def test_eval_refuses_episodes_the_model_was_trained_on(sft_run, data):
    with pytest.raises(ValueError, match="share"):
        run_web_eval(WebEvalConfig(checkpoint=str(sft_run / "final"), data=str(data[0])))


def test_bad_paths_give_clear_errors(sft_run, data, tmp_path):
    with pytest.raises(FileNotFoundError, match="collect web --out"):
        load_web_data(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="collect web"):
        run_web_sft(sft_config((tmp_path / "nothing", data[1]), tmp_path / "run"))
    with pytest.raises(CheckpointError, match="neither a directory"):
        run_web_eval(WebEvalConfig(checkpoint=str(tmp_path / "no-model"), data=str(data[1])))
    with pytest.raises(CheckpointError):
        run_web_rlvr(WebRLVRConfig(run_dir=str(tmp_path / "rl"), model=str(tmp_path), data=(str(data[0]),), eval_data=""))
    with pytest.raises(FileExistsError, match="--overwrite"):
        collect_web(WebCollectConfig(out=str(data[0]), tasks=TRAIN, episodes=1))
    with pytest.raises(ValueError, match="unknown or no tasks"):
        collect_web(WebCollectConfig(out=str(tmp_path / "c"), tasks=("no-such-task",), episodes=1))


@pytest.mark.slow
def test_sft_under_torchrun_trains_the_tokenizer_once(data, tmp_path):
    run_dir = tmp_path / "run"
    args = ["--run-dir", str(run_dir), "--data", str(data[0]), "--eval-data", "", "--vocab-size", "400",
            "--size.hidden-size", "32", "--size.layers", "1", "--size.heads", "2", "--size.intermediate-size", "64",
            "--sft.steps", "2", "--sft.batch-size", "1", "--sft.micro-batch", "1"]  # fmt: skip
    script = "import sys, tyro, torch\nfrom rlvr_gym.train.web import WebSFTConfig, run_web_sft\n" \
             "run_web_sft(tyro.cli(WebSFTConfig, args=sys.argv[1:]))\ntorch.distributed.destroy_process_group()\n"
    (tmp_path / "worker.py").write_text(script)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
               str(tmp_path / "worker.py")]  # fmt: skip
    result = subprocess.run(command + args, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in read_log(run_dir) if "train/loss" in r] == [1, 2]
    assert (run_dir / "init" / "tokenizer.json").is_file() and (run_dir / "final" / TRAINING_RECORD).is_file()

"""The text-game pipeline end to end on small real data: tokenizer, SFT, RLVR, evaluation, TextWorld collection."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlvr_gym.data.bytesized32 import load_transitions
from rlvr_gym.data.textgame import (
    collect_textworld,
    load_training_transitions,
    target_text,
    train_tokenizer,
    transition_texts,
)
from rlvr_gym.domains.textgame import is_changed, parse_diff, rebuild, states_match, wins
from rlvr_gym.evaluation.textgame import TextGameEvalConfig, run_textgame_eval
from rlvr_gym.files import read_log
from rlvr_gym.models.lm import CheckpointError, LlamaSize, load_model
from rlvr_gym.train.grpo import GRPOConfig
from rlvr_gym.train.sft import SFTConfig
from rlvr_gym.train.textgame import (
    TextGameRLVRConfig,
    TextGameSFTConfig,
    contents_form,
    run_textgame_rlvr,
    run_textgame_sft,
    weight_toward,
    weight_wins,
)

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "bytesized32_small.jsonl"
TINY = LlamaSize(hidden_size=32, layers=1, heads=2, intermediate_size=64, max_positions=1024)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def sft_config(run_dir: Path, **overrides) -> TextGameSFTConfig:
    fields = dict(
        run_dir=str(run_dir), data=str(FIXTURE), eval_data=str(FIXTURE), size=TINY, vocab_size=400,
        eval_accuracy_examples=2, eval_batch_size=2,
        sft=SFTConfig(steps=3, lr=3e-3, batch_size=4, micro_batch=4, save_every=2, eval_examples=3),
    )
    return TextGameSFTConfig(**{**fields, **overrides})


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("sft")
    run_textgame_sft(sft_config(run_dir))
    return run_dir


def test_tokenizer_round_trips_prompts_and_targets():
    texts = list(transition_texts(load_transitions(FIXTURE)))
    tokenizer = train_tokenizer(texts, vocab_size=400)
    assert len(tokenizer) == 400
    for text in texts + ['{"m":[{"u":7,"n":"ü ice","t":"Ice"}]}']:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode(texts[0], add_special_tokens=False)) < len(texts[0]) / 2, "BPE merges frequent strings"
    specials = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id]
    assert tokenizer.convert_ids_to_tokens(specials) == ["<pad>", "<s>", "</s>"]


def test_sft_writes_a_loadable_model_with_its_tokenizer_and_length_report(sft_run):
    model, tokenizer = load_model(sft_run / "final")
    assert model.config.vocab_size == len(tokenizer) == 400
    transitions = load_transitions(FIXTURE)
    target = target_text(transitions[1])
    assert tokenizer.decode(tokenizer.encode(target, add_special_tokens=False)) == target
    stats = json.loads((sft_run / "data_stats.json").read_text())
    # balance 100:40 on 4 changed + 1 unchanged keeps the unchanged one and 100/40 * 1 = 2 changed
    assert stats["kept"] == 3 and stats["kept_changed"] == 2 and stats["dropped_too_long"] == 0
    assert stats["prompt_tokens"]["max"] <= 1024
    log = read_log(sft_run)
    assert [r["step"] for r in log if "train/loss" in r] == [1, 2, 3]
    final_eval = [r for r in log if "eval/accuracy" in r][-1]
    assert {"eval/loss", "eval/accuracy", "eval/accuracy_changed", "eval/parse_failure_rate"} <= set(final_eval)
    assert log[0]["time/tokens_per_s"] > 0


def test_sft_records_the_contents_form_and_a_fine_tune_keeps_it(sft_run, tmp_path):
    # from scratch: +/-, recorded in the model's config; a fine-tune of a model that writes whole lists (c), as the
    # shipped ones do, keeps writing them unless told otherwise, and its GRPO run keeps the record
    assert contents_form(sft_run / "final") == "delta"
    whole = tmp_path / "whole"
    run_textgame_sft(sft_config(whole, model=str(sft_run / "final"), contents="whole", eval_data=""))
    assert contents_form(whole / "final") == "whole"
    assert json.loads((whole / "data_stats.json").read_text())["contents"] == "whole"
    kept = tmp_path / "kept"
    run_textgame_sft(sft_config(kept, model=str(whole / "final"), eval_data=""))
    assert json.loads((kept / "data_stats.json").read_text())["contents"] == "whole"
    rlvr = run_textgame_rlvr(TextGameRLVRConfig(
        run_dir=str(tmp_path / "rlvr"), model=str(kept / "final"), data=str(FIXTURE), eval_data="",
        grpo=GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=64, save_every=1)))
    assert contents_form(rlvr) == "whole"
    assert contents_form("textgame-rlvr") == contents_form("textgame-sft") == "whole"


def test_sft_resume_continues_and_refuses_other_data(sft_run, tmp_path):
    with pytest.raises(FileExistsError, match="--resume"):
        run_textgame_sft(sft_config(sft_run))
    with pytest.raises(ValueError, match="balance"):
        run_textgame_sft(sft_config(sft_run, resume=True, balance=(100, 5)))
    steps = sft_config(sft_run, resume=True)
    steps.sft.steps = 4
    run_textgame_sft(steps)
    assert [r["step"] for r in read_log(sft_run) if "train/loss" in r] == [1, 2, 3, 4]


def test_rlvr_two_steps_log_reward_and_parse_failures(sft_run, tmp_path):
    config = TextGameRLVRConfig(
        run_dir=str(tmp_path), model=str(sft_run / "final"), reward="task", data=str(FIXTURE), eval_data=str(FIXTURE),
        eval_accuracy_examples=2, eval_batch_size=2,
        grpo=GRPOConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=42, lr=1e-4, save_every=2),
    )
    final = run_textgame_rlvr(config)
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    trained = [r for r in read_log(tmp_path) if "reward/mean" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for r in trained:
        assert 0 <= r["reward/parse_failure_rate"] <= 1 and 0 <= r["reward/mean"] <= 1.3
    # the task reward's 100:5 balance keeps the 4 changed transitions (5% of 4 rounds to no unchanged one), and the
    # two whose targets (47 and 43 tokens with eos) do not fit in max_new_tokens are dropped
    stats = json.loads((tmp_path / "data_stats.json").read_text())
    assert stats["target_tokens"]["n"] == 4 and stats["target_tokens"]["max"] > 42
    assert stats["dropped_too_long"] == 2 and stats["kept"] == stats["kept_changed"] == 2


def test_rlvr_surprise_prompts_repeat_the_transitions_the_model_gets_wrong(sft_run, tmp_path, caplog):
    assert weight_toward(["a", "b", "c", "d"], [True, False, False, False], 0.5) == ["a", "a", "a", "b", "c", "d"]
    assert weight_toward(["a", "b"], [False, False], 0.5) == ["a", "b"] == weight_toward(["a", "b"], [True, True], 0.5)
    config = TextGameRLVRConfig(
        run_dir=str(tmp_path), model=str(sft_run / "final"), data=str(FIXTURE), eval_data="", balance=(1, 1),
        eval_accuracy_examples=0, surprise_prompts=0.9,
        grpo=GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=64, lr=1e-4, save_every=1),
    )
    with caplog.at_level("INFO", logger="rlvr_gym"):
        run_textgame_rlvr(config)
    # A 3-step SFT model gets every fixture transition wrong: all are flagged, none is repeated.
    counts = [m for m in caplog.messages if "training transitions wrong" in m]
    assert len(counts) == 1
    wrong, total = map(int, counts[0].split("gets ")[1].split(" training")[0].split(" of "))
    assert wrong == total > 0
    # Outcome first: the transitions whose score, gameOver or gameWon the model gets wrong are the surprising ones.
    caplog.clear()
    with caplog.at_level("INFO", logger="rlvr_gym"):
        run_textgame_rlvr(replace(config, run_dir=str(tmp_path / "outcome"), surprise_on="outcome"))
    outcome = [m for m in caplog.messages if "wrong about the outcome" in m]
    assert len(outcome) == 1 and 0 <= int(outcome[0].split()[0]) <= total
    with pytest.raises(ValueError, match="surprise-prompts"):
        run_textgame_rlvr(TextGameRLVRConfig(run_dir=str(tmp_path / "x"), surprise_prompts=1.0))
    with pytest.raises(ValueError, match="surprise-on"):
        run_textgame_rlvr(TextGameRLVRConfig(run_dir=str(tmp_path / "x"), surprise_on="frames"))


def test_win_share_repeats_the_winning_steps_and_sft_trains_on_them(tmp_path, caplog):
    transitions = load_transitions(FIXTURE)
    assert sum(wins(t.current, t.next) for t in transitions) == 1  # of 5
    mixed = weight_wins(transitions, 0.5)
    won = [t for t in mixed if wins(t.current, t.next)]
    assert len(won) == 4 and len(mixed) == 8 and {id(t) for t in won} == {id(won[0])}
    assert weight_wins(transitions, 0.0) == transitions
    with pytest.raises(ValueError, match="win-share"):
        weight_wins(transitions, 1.0)
    with caplog.at_level("INFO", logger="rlvr_gym"):
        run_textgame_sft(sft_config(tmp_path, balance=None, eval_data="", win_share=0.5,
                                    sft=SFTConfig(steps=1, batch_size=2, micro_batch=2, save_every=1)))
    assert any("1 of 5 transitions win a game" in m for m in caplog.messages)
    assert json.loads((tmp_path / "data_stats.json").read_text())["kept"] == 8


def chain_model(tokenizer, chain: list[int], path: Path) -> Path:
    """A Llama whose greedy next token depends on the last token only, following `chain` (a -> b for each pair):
    attention and MLP outputs are zero, so the last hidden state is the last token's embedding."""
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.norm.weight.fill_(1.0)
        for k, (a, b) in enumerate(zip(chain, chain[1:])):
            model.model.embed_tokens.weight[a, k] = 1.0
            model.lm_head.weight[b, k] = 10.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def fixture_tokenizer():
    return train_tokenizer(transition_texts(load_transitions(FIXTURE)), vocab_size=400)


def test_eval_of_a_model_that_always_predicts_no_change_equals_the_baseline(fixture_tokenizer, tmp_path):
    tok = fixture_tokenizer
    newline = tok.convert_tokens_to_ids("Ċ")  # every prompt ends with a newline, its own token
    empty_diff = tok.encode("{}", add_special_tokens=False)
    no_change = chain_model(tok, [newline, *empty_diff, tok.eos_token_id], tmp_path / "a")
    result = run_textgame_eval(TextGameEvalConfig(data=str(FIXTURE), checkpoint=str(no_change), batch_size=2))
    json.dumps(result, allow_nan=False)
    # the fixture: 4 changed transitions and 1 unchanged
    assert result["n"] == 5 and result["n_changed"] == 4
    assert result["accuracy"] == result["no_change_accuracy"] == pytest.approx(0.2)
    assert result["accuracy_changed"] == result["no_change_accuracy_changed"] == 0.0
    assert result["accuracy_unchanged"] == result["no_change_accuracy_unchanged"] == 1.0
    assert result["parse_failure_rate"] == 0.0

    broken = chain_model(tok, [newline, tok.convert_tokens_to_ids("{"), tok.eos_token_id], tmp_path / "b")
    result = run_textgame_eval(TextGameEvalConfig(data=str(FIXTURE), checkpoint=str(broken), best_of=3, batch_size=4))
    assert result["parse_failure_rate"] == 1.0 and result["accuracy"] == 0.0 and result["accuracy_unchanged"] == 0.0
    assert result["best_of"] == 3 and result["no_change_accuracy"] == pytest.approx(0.2)


def test_eval_limit_samples_and_missing_kinds_are_null(fixture_tokenizer, tmp_path):
    tok = fixture_tokenizer
    model_dir = chain_model(tok, [tok.convert_tokens_to_ids("Ċ"), tok.eos_token_id], tmp_path / "m")
    changed_only = tmp_path / "changed.jsonl"
    changed_only.write_text("".join(FIXTURE.read_text().splitlines(keepends=True)[1:]))
    result = run_textgame_eval(TextGameEvalConfig(data=str(changed_only), checkpoint=str(model_dir), limit=3))
    assert result["n"] == 3 and result["accuracy_unchanged"] is None and result["no_change_accuracy_unchanged"] is None
    assert result["parse_failure_rate"] == 1.0, "an empty completion is not a diff"


def test_bad_paths_give_clear_errors(fixture_tokenizer, sft_run, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        run_textgame_eval(TextGameEvalConfig(data=str(tmp_path / "missing.jsonl"), checkpoint=str(sft_run / "final")))
    with pytest.raises(CheckpointError, match="neither a directory nor a shipped name"):
        run_textgame_eval(TextGameEvalConfig(data=str(FIXTURE), checkpoint=str(tmp_path / "nowhere")))
    no_tokenizer = tmp_path / "bare"
    load_model(sft_run / "final")[0].save_pretrained(no_tokenizer)
    with pytest.raises(CheckpointError, match="no tokenizer"):
        run_textgame_eval(TextGameEvalConfig(data=str(FIXTURE), checkpoint=str(no_tokenizer)))
    with pytest.raises(CheckpointError, match="tokenizer"):
        run_textgame_rlvr(TextGameRLVRConfig(run_dir=str(tmp_path / "r"), model=str(no_tokenizer), data=str(FIXTURE)))
    with pytest.raises(FileNotFoundError, match="no such file"):
        run_textgame_sft(sft_config(tmp_path / "s", data=str(tmp_path / "nothing.jsonl.gz")))
    with pytest.raises(FileNotFoundError, match="collect textworld"):
        run_textgame_sft(sft_config(tmp_path / "t", textworld=str(tmp_path)))


@pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")
def test_textworld_collection_is_readable_and_mixes_into_sft(tmp_path):
    path = collect_textworld(games=1, seed=2, out=tmp_path / "tw", episodes=1, max_steps=6)
    transitions = load_transitions(path)
    manifest = json.loads((tmp_path / "tw" / "manifest.json").read_text())
    assert manifest["seeds"] == [2] and manifest["transitions"] == len(transitions) > 3
    assert {t.game for t in transitions} == {"tw-s2-r3-o5-q3"}
    assert sorted(t.state_id for t in transitions) == list(range(len(transitions)))
    distinct = {json.dumps([t.current, t.action], sort_keys=True) for t in transitions}
    assert len(distinct) == len(transitions), "a state and command seen twice is written once"
    assert any(is_changed(t.current, t.next) for t in transitions)
    for t in transitions:
        diff, error = parse_diff(target_text(t), t.current)
        assert error is None and states_match(rebuild(t.current, diff), t.next)

    config = sft_config(tmp_path / "sft", textworld=str(tmp_path / "tw"), balance=None, eval_data="")
    config.sft.steps = 1
    run_textgame_sft(config)
    stats = json.loads((tmp_path / "sft" / "data_stats.json").read_text())
    assert stats["kept"] + stats["dropped_too_long"] == 5 + len(transitions)
    copies = load_training_transitions(FIXTURE, str(tmp_path / "tw"), None, 0, textworld_copies=3)
    assert len(copies) == 5 + 3 * len(transitions)
    with pytest.raises(ValueError, match="textworld_copies"):
        load_training_transitions(FIXTURE, str(tmp_path / "tw"), None, 0, textworld_copies=0)


@pytest.mark.slow
def test_sft_under_torchrun_trains_the_tokenizer_once(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(
        "import sys, tyro, torch\n"
        "from rlvr_gym.train.textgame import TextGameSFTConfig, run_textgame_sft\n"
        "run_textgame_sft(tyro.cli(TextGameSFTConfig, args=sys.argv[1:]))\n"
        "torch.distributed.destroy_process_group()\n"
    )
    run_dir = tmp_path / "run"
    args = ["--run-dir", str(run_dir), "--data", str(FIXTURE), "--eval-data", "", "--vocab-size", "400",
            "--size.hidden-size", "32", "--size.layers", "1", "--size.heads", "2", "--size.intermediate-size", "64",
            "--sft.steps", "2", "--sft.batch-size", "1", "--sft.micro-batch", "1", "--balance", "None"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", str(script)]
    result = subprocess.run(command + args, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in read_log(run_dir) if "train/loss" in r] == [1, 2]
    model, tokenizer = load_model(run_dir / "final")
    assert len(tokenizer) == 400 and (run_dir / "init" / "tokenizer.json").is_file()

"""The trainers end to end on the sort-digits task: learning, checkpoints, resume, bad input, torchrun."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from rlvr_gym.files import read_log
from rlvr_gym.models.lm import CheckpointError, LlamaSize, build_llama, context_of, extend_context, load_model
from rlvr_gym.train.batch import pack_batch, token_logprobs
from rlvr_gym.train.demo import DemoConfig, char_tokenizer, make_examples, run_demo
from rlvr_gym.train.grpo import GRPOConfig, train_grpo
from rlvr_gym.train.sft import SFTConfig, heldout_loss, target_masks, train_sft

REPO = Path(__file__).resolve().parent.parent
SMALL_DEMO = ["--train-examples", "400", "--eval-examples", "40", "--sft.steps", "20", "--sft.save-every", "10",
              "--grpo.steps", "24", "--grpo.save-every", "4", "--grpo.prompts-per-step", "4"]


@pytest.fixture(scope="module")
def init_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("init")
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_llama(len(tokenizer), LlamaSize(hidden_size=32, layers=1, heads=2, intermediate_size=64, max_positions=32), tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def examples(n=64):
    return make_examples(n, 0, 3, 4, char_tokenizer())


def test_grpo_raises_heldout_exact_match_after_sft(tmp_path):
    summary = run_demo(DemoConfig(run_dir=str(tmp_path)))
    before, after = summary["exact_match_sft"], summary["exact_match_grpo"]
    assert 0.05 < before < 0.6, f"SFT should start the task without solving it (got {before:.3f})"
    assert after >= before + 0.08, f"GRPO should raise held-out exact match by 8 points: {before:.3f} -> {after:.3f}"
    log = read_log(tmp_path / "grpo")
    trained = [r for r in log if "reward/mean" in r]
    assert len(trained) == 100 and all(0 <= r["reward/parse_failure_rate"] <= 1 for r in trained)
    for key in ("reward/std", "train/kl", "train/clip_fraction", "train/entropy", "completion/length_mean", "time/samples_per_s"):
        assert key in trained[-1]
    assert any((tmp_path / "grpo" / "tb").iterdir()), "TensorBoard events are written"


def test_training_saves_a_loadable_hugging_face_model(tmp_path, init_model):
    final = train_sft(SFTConfig(run_dir=str(tmp_path), model=str(init_model), steps=3, batch_size=8, save_every=2), examples())
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    model, tokenizer = load_model(final)
    assert tokenizer.decode(tokenizer.encode("123=", add_special_tokens=False)) == "123="
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert checkpoints == ["step_000002", "step_000003"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000003"


def test_sft_step_is_the_same_whatever_the_micro_batch(tmp_path, init_model):
    """Micro-batches are sorted by length and padded on their own: that must not change the loss or the update."""
    data = make_examples(32, 0, 2, 8, char_tokenizer())
    finals, losses = [], []
    for micro in (1, 3, 16):
        run_dir = tmp_path / f"micro{micro}"
        config = SFTConfig(run_dir=str(run_dir), model=str(init_model), steps=2, batch_size=16, micro_batch=micro,
                           save_every=100)
        finals.append(load_file(train_sft(config, data) / "model.safetensors"))
        losses.append([r["train/loss"] for r in read_log(run_dir) if "train/loss" in r])
    for other, loss in zip(finals[1:], losses[1:]):
        assert loss == pytest.approx(losses[0], rel=1e-5)
        for name, weight in finals[0].items():
            torch.testing.assert_close(other[name], weight, rtol=1e-4, atol=1e-6)


def test_sft_target_weights_make_a_weighted_mean_of_the_token_losses(init_model):
    model, tokenizer = load_model(init_model)
    data = make_examples(4, 0, 2, 8, char_tokenizer())
    weighted = [{**e, "target_mask": [2.0] + [1.0] * (len(e["target_ids"]) - 2) + [0.0]} for e in data]
    batch = pack_batch([e["prompt_ids"] for e in data], [e["target_ids"] for e in data], tokenizer.pad_token_id,
                       target_masks(data))
    with torch.no_grad():
        logp, _ = token_logprobs(model.eval(), batch)
    weights = pack_batch([e["prompt_ids"] for e in data], [e["target_ids"] for e in data], tokenizer.pad_token_id,
                         target_masks(weighted))["loss_mask"]
    expected = float(-(logp * weights).sum() / weights.sum())
    weighted_loss = heldout_loss(model, weighted, tokenizer.pad_token_id, torch.device("cpu"), 2)
    assert weighted_loss == pytest.approx(expected, rel=1e-5)
    assert weighted_loss != pytest.approx(heldout_loss(model, data, tokenizer.pad_token_id, torch.device("cpu"), 2), rel=1e-4)


def test_a_time_limit_stops_with_a_checkpoint_and_resume_finishes(tmp_path, init_model):
    config = SFTConfig(run_dir=str(tmp_path), model=str(init_model), steps=5, batch_size=8, save_every=100, max_minutes=1e-9)
    final = train_sft(config, examples())
    assert (final / "model.safetensors").is_file()
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000001", "stops after the first step, saved"
    train_sft(SFTConfig(**{**vars(config), "max_minutes": 0.0, "resume": True}), examples())
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000005"
    assert [r["step"] for r in read_log(tmp_path) if "train/loss" in r] == [1, 2, 3, 4, 5]


def test_extend_context_keeps_the_model_and_raises_its_positions(tmp_path, init_model):
    longer = extend_context(init_model, tmp_path / "longer", 64)
    assert context_of(init_model) == 32 and context_of(longer) == 64
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(load_model(init_model)[0](ids).logits, load_model(longer)[0](ids).logits)
        assert load_model(longer)[0](torch.ones(1, 60, dtype=torch.long)).logits.isfinite().all()
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, n_positions=32, vocab_size=50)).save_pretrained(gpt2)
    with pytest.raises(ValueError, match="no rotary position embedding"):
        extend_context(gpt2, tmp_path / "gpt2-longer", 64)


def test_missing_or_corrupt_checkpoints_give_clear_errors(tmp_path, init_model):
    with pytest.raises(CheckpointError, match="neither a directory nor a shipped name"):
        load_model(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((init_model / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no weights"):
        load_model(broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="could not be loaded"):
        load_model(broken)


def test_resume_refuses_another_config_and_a_corrupt_state(tmp_path, init_model):
    config = SFTConfig(run_dir=str(tmp_path), model=str(init_model), steps=2, batch_size=8, save_every=1)
    train_sft(config, examples())
    with pytest.raises(FileExistsError, match="--resume"):
        train_sft(config, examples())
    with pytest.raises(ValueError, match=r"lr: 0.001 -> 0.5"):
        train_sft(SFTConfig(**{**vars(config), "lr": 0.5, "resume": True}), examples())
    (tmp_path / "checkpoints" / "step_000002" / "trainer_state.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt"):
        train_sft(SFTConfig(**{**vars(config), "steps": 3, "resume": True}), examples())


def test_bad_training_input_is_refused(tmp_path, init_model):
    with pytest.raises(ValueError, match="empty"):
        train_grpo(GRPOConfig(run_dir=str(tmp_path / "a"), model=str(init_model)), lambda **_: [], [])
    with pytest.raises(ValueError, match="prompt_ids"):
        train_grpo(GRPOConfig(run_dir=str(tmp_path / "b"), model=str(init_model)), lambda **_: [], [{"prompt_ids": []}])
    with pytest.raises(ValueError, match="target_ids"):
        train_sft(SFTConfig(run_dir=str(tmp_path / "c"), model=str(init_model)), [{"prompt_ids": [1]}])
    with pytest.raises(TypeError, match="must return a list"):
        train_grpo(GRPOConfig(run_dir=str(tmp_path / "d"), model=str(init_model), steps=1, beta=0.0),
                   lambda **_: None, examples())


def test_kl_penalty_uses_the_frozen_starting_model(tmp_path, init_model):
    def digit_count_reward(completions, **_):
        return [{"score": float(sum(ch.isdigit() for ch in c))} for c in completions]

    config = GRPOConfig(run_dir=str(tmp_path), model=str(init_model), steps=3, beta=0.1, lr=1e-2,
                        prompts_per_step=4, group_size=4, max_new_tokens=6)
    train_grpo(config, digit_count_reward, examples())
    kls = [r["train/kl"] for r in read_log(tmp_path) if "train/kl" in r]
    assert kls[0] == pytest.approx(0.0, abs=1e-6), "the policy equals the reference at the first step"
    assert kls[-1] > 0, "after updates the policy has moved away from the reference"


def demo_command(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlvr_gym", "demo", "--run-dir", str(run_dir), *SMALL_DEMO, *extra]


def final_weights(run_dir: Path) -> dict:
    return load_file(run_dir / "grpo" / "final" / "model.safetensors")


def test_a_run_killed_with_sigkill_resumes_to_the_same_result(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    reference = tmp_path / "reference"
    subprocess.run(demo_command(reference), check=True, env=env, capture_output=True, timeout=300)

    killed = tmp_path / "killed"
    process = subprocess.Popen(demo_command(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = killed / "grpo" / "checkpoints" / "step_000008"
    deadline = time.time() + 240
    while not marker.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, "the run finished before it could be killed; make it longer"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "grpo" / "final").exists()

    subprocess.run(demo_command(killed, "--resume"), check=True, env=env, capture_output=True, timeout=300)
    steps = [r["step"] for r in read_log(killed / "grpo") if "reward/mean" in r]
    assert steps == list(range(1, 25)), "every step logged exactly once after resume"
    ref, got = final_weights(reference), final_weights(killed)
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=0, msg=f"{name} differs from the uninterrupted run")


def test_two_processes_under_torchrun_shard_prompts_and_average_metrics(tmp_path, init_model):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
               str(REPO / "tests" / "torchrun_worker.py"), str(init_model), str(tmp_path)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    log = {r["step"]: r for r in read_log(tmp_path / "run") if "reward/mean" in r}
    assert sorted(log) == [1, 2, 3]
    for step in range(3):
        prompts0, prompts1 = seen[0][step]["prompts"], seen[1][step]["prompts"]
        assert not set(prompts0) & set(prompts1), "each rank samples its own shard of the prompts"
        mean = (seen[0][step]["reward"] + seen[1][step]["reward"]) / 2
        assert log[step + 1]["reward/mean"] == pytest.approx(mean), "logged metrics are averaged over ranks"
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    # A scan shared out: each item computed once, on one rank, and every rank gets every result in order.
    scans = [json.loads((tmp_path / f"scan{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(scans[0]["scanned"] + scans[1]["scanned"]) == list(range(7)) and all(s["scanned"] for s in scans)
    assert scans[0]["results"] == scans[1]["results"] and [x for x, _ in scans[0]["results"]] == list(range(7))
    assert {rank for _, rank in scans[0]["results"]} == {0, 1}


def test_empty_completions_are_scored_and_counted_not_fatal(tmp_path, init_model):
    from rlvr_gym.train.demo import sorted_digits_reward

    tokenizer = char_tokenizer()
    only_eos = torch.zeros((4, len(tokenizer)), dtype=torch.bool)
    only_eos[:, tokenizer.eos_token_id] = True  # every completion ends at once: it decodes to ""
    seen = []

    def reward(completions, **columns):
        seen.extend(completions)
        return sorted_digits_reward(completions, **columns)

    config = GRPOConfig(run_dir=str(tmp_path), model=str(init_model), steps=2, prompts_per_step=2, group_size=2,
                        max_new_tokens=4, beta=0.0)
    train_grpo(config, reward, examples(), allowed_tokens=only_eos)
    assert seen and set(seen) == {""}
    log = [r for r in read_log(tmp_path) if "reward/mean" in r]
    assert [r["reward/parse_failure_rate"] for r in log] == [1.0, 1.0]
    assert all(r["completion/length_mean"] == 1.0 for r in log)


def test_resume_accepts_the_same_config_with_tuple_fields(tmp_path, init_model):
    from dataclasses import dataclass

    from rlvr_gym.train.run import Dist, RunConfig, make_optimizer, prepare_run_dir, save_checkpoint

    @dataclass
    class WithTuple(RunConfig):
        widths: tuple[int, ...] = (32, 64)

    config = WithTuple(run_dir=str(tmp_path), model=str(init_model))
    d = Dist(0, 1, torch.device("cpu"))
    prepare_run_dir(config, d)
    model, tokenizer = load_model(init_model)
    optimizer, scheduler = make_optimizer(model, config)
    save_checkpoint(tmp_path, 1, model, tokenizer, optimizer, scheduler, keep=1)
    prepare_run_dir(WithTuple(run_dir=str(tmp_path), model=str(init_model), resume=True), d)  # JSON made the tuple a list
    with pytest.raises(ValueError, match="widths"):
        prepare_run_dir(WithTuple(run_dir=str(tmp_path), model=str(init_model), resume=True, widths=(8,)), d)

    # A run recorded before a field existed resumes when the field keeps its default (what the run used), not otherwise.
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["widths"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="widths: \\[32, 64\\] -> \\[8\\]"):
        prepare_run_dir(WithTuple(run_dir=str(tmp_path), model=str(init_model), resume=True, widths=(8,)), d)
    prepare_run_dir(WithTuple(run_dir=str(tmp_path), model=str(init_model), resume=True), d)


def test_a_greedy_baseline_scores_one_greedy_completion_per_prompt(tmp_path, init_model, monkeypatch):
    import rlvr_gym.train.grpo as grpo

    calls, updates = [], []

    def reward(completions, **_):
        calls.append(list(completions))
        return [{"score": float(len(c))} for c in completions]

    def recording_update(run, config, batch, advantages, reference):
        updates.append(advantages.clone())
        return real_update(run, config, batch, advantages, reference)

    real_update = grpo.policy_update
    monkeypatch.setattr(grpo, "policy_update", recording_update)
    config = GRPOConfig(run_dir=str(tmp_path / "remax"), model=str(init_model), steps=2, prompts_per_step=2, group_size=4,
                        max_new_tokens=6, beta=0.0, temperature=1.0, baseline="greedy", loss_type="dr_grpo")
    train_grpo(config, reward, examples())
    greedy_calls, sample_calls = calls[0::2], calls[1::2]
    assert [len(c) for c in greedy_calls] == [2, 2] and [len(c) for c in sample_calls] == [8, 8]
    for greedy, sampled, advantages in zip(greedy_calls, sample_calls, updates):
        expected = torch.tensor([len(c) - len(greedy[i // 4]) for i, c in enumerate(sampled)], dtype=torch.float32)
        torch.testing.assert_close(advantages, expected)  # each sample against its prompt's greedy completion
    log = read_log(tmp_path / "remax")
    assert [r["reward/greedy"] for r in log if "reward/greedy" in r] == [sum(map(len, g)) / 2 for g in greedy_calls]
    with pytest.raises(ValueError, match="baseline"):
        train_grpo(GRPOConfig(run_dir=str(tmp_path / "bad"), model=str(init_model), baseline="mean"), reward, examples())


def test_dynamic_sampling_updates_only_on_groups_whose_rewards_differ(tmp_path, init_model, monkeypatch):
    import rlvr_gym.train.grpo as grpo

    data = examples(32)
    for i, example in enumerate(data):
        example["learnable"] = i % 4 == 0  # a quarter of the prompts can tell completions apart

    def reward(completions, learnable, **_):
        return [{"score": float(len(c) % 2) if ok else 1.0} for c, ok in zip(completions, learnable)]

    updates = []
    real_update = grpo.policy_update

    def recording_update(run, config, batch, advantages, reference):
        updates.append(advantages.view(-1, config.group_size))
        return real_update(run, config, batch, advantages, reference)

    monkeypatch.setattr(grpo, "policy_update", recording_update)
    config = GRPOConfig(run_dir=str(tmp_path / "dyn"), model=str(init_model), steps=3, prompts_per_step=2, group_size=4,
                        max_new_tokens=6, beta=0.0, dynamic_sampling=True, max_draws=8)
    train_grpo(config, reward, data)
    log = [r for r in read_log(tmp_path / "dyn") if "sampling/draws" in r]
    assert len(log) == len(updates) == 3
    for groups, record in zip(updates, log):
        assert len(groups) == record["sampling/groups_kept"] >= 1
        assert (groups.abs().sum(1) > 0).all(), "every group in the update carries a gradient signal"
        assert record["sampling/draws"] > 1 or record["reward/groups_without_signal"] == 0

    # With no prompt that can be learned from, each step still updates once (on zero advantages) after max_draws.
    updates.clear()
    flat = GRPOConfig(**{**vars(config), "run_dir": str(tmp_path / "flat"), "max_draws": 2})
    train_grpo(flat, lambda completions, **_: [{"score": 1.0} for _ in completions], data)
    assert [r["sampling/draws"] for r in read_log(tmp_path / "flat") if "sampling/draws" in r] == [2, 2, 2]
    assert all((groups == 0).all() for groups in updates)
    with pytest.raises(ValueError, match="max_draws"):
        train_grpo(GRPOConfig(**{**vars(config), "run_dir": str(tmp_path / "bad"), "max_draws": 0}), reward, data)

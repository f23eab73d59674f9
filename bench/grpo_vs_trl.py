"""This project's GRPO trainer against TRL's GRPOTrainer: same model, prompts and settings, one run each.

The task is the trainer demo's (sort the digits of the prompt, exact-match reward): the demo's SFT stage trains
the starting model once, then both trainers run the same number of GRPO steps from it, each step 16 prompts x 8
completions, one optimizer step per sampled batch, on one CPU thread in fp32. The prompts of each step are the
same in both runs (TRL reads the dataset in order, written in the order our trainer draws it).

    python -m bench.grpo_vs_trl      # writes runs/bench/grpo_vs_trl.{md,png,json}
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers

from rlvr_gym.files import read_log
from rlvr_gym.models.lm import build_llama, load_model
from rlvr_gym.models.sampler import SamplingConfig, sample
from rlvr_gym.train.batch import chunks, pack_batch, slice_batch, token_logprobs
from rlvr_gym.train.demo import DemoConfig, char_tokenizer, exact_match, make_examples, sorted_digits_reward
from rlvr_gym.train.grpo import GRPOConfig, aggregate, group_advantages, policy_loss_terms, train_grpo
from rlvr_gym.train.run import batch_indices
from rlvr_gym.train.sft import SFTConfig, train_sft

MISSING_TRL = "TRL is not installed: install the bench extra with  pip install -e '.[bench]'  (or  make install-bench)"


def sorted_digits_score(completions: list[str], answer: list[str], **_) -> list[float]:
    """TRL's reward signature (a float per completion) over the demo's reward."""
    return [r["score"] for r in sorted_digits_reward(completions, answer)]


def train_start_model(root: Path, demo: DemoConfig, train: list[dict]) -> Path:
    """The demo's initialisation and SFT stage; a finished run in root/sft is reused."""
    tokenizer = char_tokenizer()
    init = root / "init"
    if not (init / "config.json").is_file():
        torch.manual_seed(demo.seed)
        model = build_llama(len(tokenizer), demo.size, tokenizer)
        model.save_pretrained(init)
        tokenizer.save_pretrained(init)
    sft = SFTConfig(**{**vars(demo.sft), "run_dir": str(root / "sft"), "model": str(init), "resume": True})
    return train_sft(sft, train)


def step_order(grpo: GRPOConfig, train: list[dict]) -> list[dict]:
    """The training prompts in the order our trainer draws them, prompts_per_step at a time."""
    n, k = len(train), grpo.prompts_per_step
    return [train[i] for step in range(grpo.steps) for i in batch_indices(n, k, step, grpo.seed, rank=0, world_size=1)]


def run_ours(grpo: GRPOConfig, train: list[dict]) -> dict:
    final = train_grpo(grpo, sorted_digits_reward, train)
    log = [line for line in read_log(grpo.run_dir) if "reward/mean" in line]
    # Each line is written after its step; the first step's duration comes from its logged throughput.
    rows = grpo.prompts_per_step * grpo.group_size
    first_step_s = rows / log[0]["time/samples_per_s"]
    return {
        "wall_s": log[-1]["time"] - log[0]["time"] + first_step_s,
        "step_s": [rows / line["time/samples_per_s"] for line in log],
        "reward_curve": [line["reward/mean"] for line in log],
        "model_dir": str(final),
    }


def trl_config(grpo: GRPOConfig, output_dir: Path):
    """TRL's GRPOConfig with our settings; every default that differs from our trainer's is set explicitly."""
    from trl import GRPOConfig as TRLConfig

    rows = grpo.prompts_per_step * grpo.group_size
    micro = min(grpo.micro_batch, rows)
    if rows % micro:
        raise ValueError(f"micro_batch {grpo.micro_batch} must divide a step's {rows} completions: TRL splits evenly")
    return TRLConfig(
        output_dir=str(output_dir),
        max_steps=grpo.steps,
        learning_rate=grpo.lr,
        lr_scheduler_type="constant",
        warmup_steps=grpo.warmup_steps,
        weight_decay=grpo.weight_decay,
        max_grad_norm=grpo.max_grad_norm,
        optim="adamw_torch",
        # One generation batch of prompts_per_step x group_size rows, split into our micro-batches, is one
        # optimizer step; num_iterations=1 uses each batch once (no old log-probs, ratio 1, as ours).
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,
        steps_per_generation=rows // micro,
        num_generations=grpo.group_size,
        num_iterations=grpo.updates_per_batch,
        max_completion_length=grpo.max_new_tokens,
        temperature=grpo.temperature,
        top_k=grpo.top_k,
        top_p=grpo.top_p,
        beta=grpo.beta,
        epsilon=grpo.epsilon,
        epsilon_high=grpo.epsilon_high or None,
        loss_type=grpo.loss_type,
        scale_rewards="group",
        shuffle_dataset=False,
        activation_checkpointing=False,
        bf16=False,
        use_cpu=True,
        seed=grpo.seed,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
    )


def trl_trainer(grpo: GRPOConfig, model, tokenizer, examples: list[dict], callbacks: tuple = ()):
    """TRL's GRPOTrainer over the examples in order, with a "prompt" text column and the "answer" column."""
    from datasets import Dataset
    from trl import GRPOTrainer

    dataset = Dataset.from_dict({"prompt": [e["prompt"] for e in examples], "answer": [e["answer"] for e in examples]})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=sorted_digits_score,
        args=trl_config(grpo, Path(grpo.run_dir)),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )
    if trainer.eos_token_ids != [tokenizer.eos_token_id]:
        raise RuntimeError(f"TRL stops on tokens {trainer.eos_token_ids}, our sampler on {tokenizer.eos_token_id} only")
    return trainer


def gradient_agreement(grpo: GRPOConfig, examples: list[dict]) -> dict[str, float]:
    """Both trainers' loss gradients on one batch of completions, sampled once: the check that the settings are equal.

    TRL's side runs its own prompt tokenization, decoding, reward call, advantages, padding and loss; only its
    sampler is replaced by a replay of our batch.
    """
    from trl.trainer.utils import split_tensor_dict

    model, tokenizer = load_model(grpo.model)
    part = examples[: grpo.prompts_per_step]
    group = grpo.group_size
    sampling = SamplingConfig(grpo.max_new_tokens, grpo.temperature, grpo.top_k, grpo.top_p, (tokenizer.eos_token_id,))
    generator = torch.Generator().manual_seed(grpo.seed)
    rollout = sample(model.eval(), [e["prompt_ids"] for e in part], sampling, num_samples=group,
                     pad_token_id=tokenizer.pad_token_id, generator=generator)
    completion_ids = rollout.completions()

    ours = copy.deepcopy(model).train()
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in completion_ids]
    rewards = torch.tensor(sorted_digits_score(texts, [e["answer"] for e in part for _ in range(group)]))
    advantages = group_advantages(rewards, group, scale=grpo.loss_type != "dr_grpo")
    batch = pack_batch(rollout.prompt_ids, completion_ids, tokenizer.pad_token_id)
    rows, tokens = len(completion_ids), int(batch["loss_mask"].sum())
    for s in chunks(rows, grpo.micro_batch):
        mb = slice_batch(batch, s, torch.device("cpu"))
        logp, _ = token_logprobs(ours, mb)
        per_token, _ = policy_loss_terms(logp, logp.detach(), advantages[s], grpo.epsilon, grpo.epsilon_high)
        aggregate(per_token, mb["loss_mask"], grpo.loss_type, rows, tokens, grpo.max_new_tokens).backward()

    trainer = trl_trainer(grpo, model, tokenizer, part)

    def replay(prompt_ids, *_):
        if [list(p) for p in prompt_ids] != rollout.prompt_ids:
            raise RuntimeError(f"TRL tokenizes prompts unlike ours: {list(prompt_ids[0])} vs {rollout.prompt_ids[0]}")
        return completion_ids, None

    trainer._generate_single_turn = replay
    trainer.model.train()
    rows = [{"prompt": e["prompt"], "answer": e["answer"]} for e in part for _ in range(group)]
    inputs = trainer._generate_and_score_completions(rows)
    accumulation = trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    for micro in split_tensor_dict(inputs, accumulation):
        trainer._compute_loss(trainer.model, micro).backward()

    norm = torch.sqrt(sum((p.grad**2).sum() for p in ours.parameters()))
    pairs = zip(ours.parameters(), trainer.model.parameters())
    diff = torch.sqrt(sum(((p.grad - q.grad) ** 2).sum() for p, q in pairs))
    result = {"gradient_norm": float(norm), "relative_difference": float(diff / norm)}
    if result["relative_difference"] > 1e-4:
        raise RuntimeError(f"the trainers' gradients on the same batch differ ({result}): their settings are not equal")
    return result


def run_trl(grpo: GRPOConfig, train: list[dict]) -> dict:
    from transformers import ProgressCallback, TrainerCallback

    class QuietProgress(ProgressCallback):
        """The progress bar without a printed dict of metrics per step (they stay in state.log_history)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

    class StepClock(TrainerCallback):
        """Start and end of each optimizer step (sampling to optimizer step; the step's logging comes after)."""

        def __init__(self):
            self.begins, self.ends = [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begins.append(time.time())

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.time())

    model, tokenizer = load_model(grpo.model)
    clock = StepClock()
    trainer = trl_trainer(grpo, model, tokenizer, step_order(grpo, train), callbacks=[clock])
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(QuietProgress())
    trainer.train()
    final = Path(grpo.run_dir) / "final"
    trainer.save_model(str(final))
    curve = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return {
        "wall_s": clock.ends[-1] - clock.begins[0],
        "step_s": [end - begin for begin, end in zip(clock.begins, clock.ends)],
        "reward_curve": curve,
        "model_dir": str(final),
    }


def held_out_accuracy(model_dir: str, held_out: list[dict]) -> float:
    model, tokenizer = load_model(model_dir)
    return exact_match(model.eval(), tokenizer, held_out)


def versions() -> dict[str, str]:
    import accelerate
    import datasets
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
    }


def write_plot(path: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        ax.plot(range(1, len(r["reward_curve"]) + 1), r["reward_curve"], label=name)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean training reward (exact match)")
    ax.set_title("Sort-the-digits GRPO: mean reward of each step's completions")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_markdown(path: Path, report: dict) -> None:
    s = report["settings"]
    before = report["exact_match_before"]
    rows = "\n".join(
        f"| {name} | {s['steps']} | {r['wall_s']:.1f} | {r['samples_per_s']:.0f} "
        f"| {r['median_step_samples_per_s']:.0f} | {before:.3f} | {r['exact_match_after']:.3f} |"
        for name, r in report["results"].items()
    )
    agreement = report["gradient_agreement"]
    settings = "\n".join(f"- {k}: {v}" for k, v in s.items())
    vers = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    path.write_text(
        f"""# GRPO: rlvr_gym vs TRL GRPOTrainer

Sort-the-digits demo task, one run each from the same SFT model, {report['machine']}.

| trainer | steps | wall s | samples/s | samples/s, median step | held-out exact match before | after |
|---|---|---|---|---|---|---|
{rows}

Throughput ratio ours / TRL: **{report['speedup']:.1f}x** (samples/s = steps x {s['completions_per_step']} / wall s;
wall s is from the start of the first GRPO step to the end of the last, excluding model loading, trainer
construction and saving). The median step's throughput (sampling to optimizer step, without the step's logging)
is less sensitive to other jobs on the machine: ratio {report['median_step_speedup']:.1f}x.
Held-out exact match: greedy, {s['held_out_examples']} prompts (the demo's held-out set, seed + 10000).
Same loss: on one batch of {s['completions_per_step']} completions fed to both (TRL running its own tokenization,
reward call, advantages, padding and loss on it), the gradients differ by {agreement['relative_difference']:.1e} of
their norm ({agreement['gradient_norm']:.3f}).
Reward curves: `grpo_vs_trl.png`; numbers: `grpo_vs_trl.json`. One run per trainer on a shared machine: timings
are noisy, and the held-out figures after {s['steps']} steps differ by sampling luck as much as by trainer.

## Settings (both trainers)

{settings}

Versions: {vers}.

## Differences that remain

- Sampling: ours uses its own KV-cache sampler (prefill once per prompt, cache copied to the group, finished rows
  dropped); TRL calls `model.generate` on the 128 rows. Both sample at temperature 1 with no top-k/top-p, stop at
  the eos token (kept in the completion and the loss) and give the reward the text decoded without special tokens,
  but from different random streams, so the completions (and so the curves) differ.
- Positions: ours passes position ids that skip the left padding; TRL's loss forward passes none, so left-padded
  rows get shifted absolute positions. With Llama's rotary embeddings attention depends only on relative
  positions, so this changes nothing but rounding.
- Log-probabilities: TRL computes them with its fused chunked LM head, ours from the logits of the completion
  columns; the same quantity.
- Optimizer: both `torch.optim.AdamW` (TRL's default is the fused kernel; it is set to `adamw_torch` here), lr
  constant, no warm-up or weight decay, gradient norm clipped at {s['max_grad_norm']}.
- TRL's step includes its own bookkeeping (metrics gathering, logging every step to its history), ours writes
  `log.jsonl` and TensorBoard every step; both are inside the timed window.
"""
    )


def main(out_dir: str = "runs/bench", steps: int = 100, seed: int = 0) -> dict:
    """Train the demo's SFT model, run `steps` GRPO steps with each trainer, and write the report under out_dir.

    `seed` seeds both GRPO runs (prompt order and sampling); the starting model is always the demo's.
    """
    try:
        import trl  # noqa: F401
    except ImportError:
        raise SystemExit(MISSING_TRL) from None
    torch.set_num_threads(1)
    out = Path(out_dir)
    root = out / "grpo_vs_trl"
    demo = DemoConfig()
    tokenizer = char_tokenizer()
    train = make_examples(demo.train_examples, demo.seed, demo.min_len, demo.max_len, tokenizer)
    held_out = make_examples(demo.eval_examples, demo.seed + 10_000, demo.min_len, demo.max_len, tokenizer)
    sft_dir = train_start_model(root, demo, train)
    before = held_out_accuracy(str(sft_dir), held_out)

    grpo = dataclasses.replace(demo.grpo, model=str(sft_dir), steps=steps, seed=seed, eval_every=0, save_every=steps)
    agreement = gradient_agreement(dataclasses.replace(grpo, run_dir=str(root / "trl")), train)

    results = {}
    for name, run, run_dir in (("rlvr_gym", run_ours, root / "ours"), ("TRL", run_trl, root / "trl")):
        shutil.rmtree(run_dir, ignore_errors=True)  # a benchmark measures a fresh run, never a resumed one
        torch.set_num_threads(1)
        r = run(dataclasses.replace(grpo, run_dir=str(run_dir)), train)
        rows = grpo.prompts_per_step * grpo.group_size
        r["samples_per_s"] = steps * rows / r["wall_s"]
        r["median_step_samples_per_s"] = rows / statistics.median(r["step_s"])
        r["exact_match_after"] = held_out_accuracy(r["model_dir"], held_out)
        r["threads_after"] = torch.get_num_threads()
        results[name] = r

    settings = {
        "steps": steps,
        "prompts_per_step": f"{grpo.prompts_per_step}, the same in both runs at every step "
        "(TRL reads its dataset in order, shuffle_dataset=False, written in the order our trainer draws)",
        "group_size": grpo.group_size,
        "completions_per_step": grpo.prompts_per_step * grpo.group_size,
        "micro_batch": grpo.micro_batch,
        "max_new_tokens": grpo.max_new_tokens,
        "temperature": grpo.temperature,
        "lr": grpo.lr,
        "beta": grpo.beta,
        "epsilon": grpo.epsilon,
        "loss_type": f"{grpo.loss_type} (group-std-normalised advantages, token mean per completion, then mean)",
        "updates_per_batch": grpo.updates_per_batch,
        "max_grad_norm": grpo.max_grad_norm,
        "seed": seed,
        "device": "cpu, fp32, torch threads 1",
        "model": f"Llama, {demo.size.layers} layers x {demo.size.hidden_size} wide, "
        f"from the demo's SFT ({demo.sft.steps} steps)",
        "train_prompts": demo.train_examples,
        "held_out_examples": demo.eval_examples,
    }
    ours, theirs = results["rlvr_gym"], results["TRL"]
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "settings": settings,
        "versions": versions(),
        "exact_match_before": before,
        "gradient_agreement": agreement,
        "results": results,
        "speedup": ours["samples_per_s"] / theirs["samples_per_s"],
        "median_step_speedup": ours["median_step_samples_per_s"] / theirs["median_step_samples_per_s"],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "grpo_vs_trl.json").write_text(json.dumps(report, indent=2))
    write_plot(out / "grpo_vs_trl.png", results)
    write_markdown(out / "grpo_vs_trl.md", report)
    return report


if __name__ == "__main__":
    import tyro

    report = tyro.cli(main)
    for name, r in report["results"].items():
        print(f"{name}: {r['samples_per_s']:.0f} samples/s, held-out exact match {report['exact_match_before']:.3f} -> "
              f"{r['exact_match_after']:.3f}")
    print(f"ours / TRL: {report['speedup']:.2f}x (median step: {report['median_step_speedup']:.2f}x)")

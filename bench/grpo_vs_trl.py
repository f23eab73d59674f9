"""This project's GRPO trainer against TRL's GRPOTrainer: same model, prompts and settings, one run each.

The task is the trainer demo's (sort the digits of the prompt, exact-match reward): the demo's SFT stage trains
the starting model once, then both trainers run the same number of GRPO steps from it, each step 16 prompts x 8
completions, one optimizer step per sampled batch, on one CPU thread in fp32. The prompts of each step are the
same in both runs (TRL reads the dataset in order, written in the order our trainer draws it).

    python -m bench.grpo_vs_trl      # writes runs/bench/grpo_vs_trl.{md,png,json}
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers

from rlvr_gym.models.lm import build_llama, load_model
from rlvr_gym.train.demo import DemoConfig, char_tokenizer, exact_match, make_examples, sorted_digits_reward
from rlvr_gym.train.grpo import GRPOConfig, train_grpo
from rlvr_gym.train.run import batch_indices, read_log
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
    return [train[i] for step in range(grpo.steps) for i in batch_indices(len(train), grpo.prompts_per_step, step, grpo.seed, 0, 1)]


def run_ours(grpo: GRPOConfig, train: list[dict]) -> dict:
    final = train_grpo(grpo, sorted_digits_reward, train)
    log = [line for line in read_log(grpo.run_dir) if "reward/mean" in line]
    # Each line is written after its step; the first step's duration comes from its logged throughput.
    rows = grpo.prompts_per_step * grpo.group_size
    first_step_s = rows / log[0]["time/samples_per_s"]
    return {
        "wall_s": log[-1]["time"] - log[0]["time"] + first_step_s,
        "reward_curve": [line["reward/mean"] for line in log],
        "model_dir": str(final),
    }


def trl_config(grpo: GRPOConfig, output_dir: Path):
    """TRL's GRPOConfig with our settings; every default that differs from our trainer's is set explicitly."""
    from trl import GRPOConfig as TRLConfig

    rows = grpo.prompts_per_step * grpo.group_size
    micro = min(grpo.micro_batch, rows)
    if rows % micro:
        raise ValueError(f"micro_batch {grpo.micro_batch} must divide the {rows} completions of a step (TRL splits evenly)")
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


def run_trl(grpo: GRPOConfig, train: list[dict]) -> dict:
    from datasets import Dataset
    from transformers import ProgressCallback, TrainerCallback
    from trl import GRPOTrainer

    class QuietProgress(ProgressCallback):
        """The progress bar without a printed dict of metrics per step (they stay in state.log_history)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

    class StepClock(TrainerCallback):
        """From the start of the first optimizer step to the end of the last, as our trainer's log measures."""

        first_begin: float | None = None
        last_end: float | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            if self.first_begin is None:
                self.first_begin = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            self.last_end = time.time()

    ordered = step_order(grpo, train)
    dataset = Dataset.from_dict({"prompt": [e["prompt"] for e in ordered], "answer": [e["answer"] for e in ordered]})
    model, tokenizer = load_model(grpo.model)
    clock = StepClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=sorted_digits_score,
        args=trl_config(grpo, Path(grpo.run_dir)),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(QuietProgress())
    check_trl_prompts(trainer, ordered[: grpo.prompts_per_step])
    trainer.train()
    final = Path(grpo.run_dir) / "final"
    trainer.save_model(str(final))
    curve = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return {"wall_s": clock.last_end - clock.first_begin, "reward_curve": curve, "model_dir": str(final)}


def check_trl_prompts(trainer, examples: list[dict]) -> None:
    """TRL tokenizes the prompt text itself: it must give our prompt ids (no BOS or other added tokens)."""
    ids, _, _ = trainer._tokenize_prompts([e["prompt"] for e in examples])
    if [list(i) for i in ids] != [e["prompt_ids"] for e in examples]:
        raise RuntimeError(f"TRL tokenizes prompts differently from ours: {list(ids[0])} vs {examples[0]['prompt_ids']}")
    if trainer.eos_token_ids != [trainer.processing_class.eos_token_id]:
        raise RuntimeError(f"TRL stops on {trainer.eos_token_ids}, ours on {trainer.processing_class.eos_token_id} only")


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
    ax.set_title("Sort-the-digits GRPO: mean reward of each step's 128 completions")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_markdown(path: Path, report: dict) -> None:
    s = report["settings"]
    rows = "\n".join(
        f"| {name} | {s['steps']} | {r['wall_s']:.1f} | {r['samples_per_s']:.0f} | {report['exact_match_before']:.3f} | "
        f"{r['exact_match_after']:.3f} |"
        for name, r in report["results"].items()
    )
    settings = "\n".join(f"- {k}: {v}" for k, v in s.items())
    vers = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    path.write_text(
        f"""# GRPO: rlvr_gym vs TRL GRPOTrainer

Sort-the-digits demo task, one run each from the same SFT model, {report['machine']}.

| trainer | steps | wall s | samples/s | held-out exact match before | after |
|---|---|---|---|---|---|
{rows}

Throughput ratio ours / TRL: **{report['speedup']:.1f}x** (samples/s = steps x {s['completions_per_step']} / wall s;
wall s is from the start of the first GRPO step to the end of the last, excluding model loading, trainer
construction and saving). Held-out exact match: greedy, {s['held_out_examples']} prompts (seed + 10000).
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
    """Train the demo's SFT model, run `steps` GRPO steps with each trainer, and write the report under out_dir."""
    try:
        import trl  # noqa: F401
    except ImportError:
        raise SystemExit(MISSING_TRL) from None
    torch.set_num_threads(1)
    out = Path(out_dir)
    root = out / "grpo_vs_trl"
    demo = DemoConfig(seed=seed)
    tokenizer = char_tokenizer()
    train = make_examples(demo.train_examples, demo.seed, demo.min_len, demo.max_len, tokenizer)
    held_out = make_examples(demo.eval_examples, demo.seed + 10_000, demo.min_len, demo.max_len, tokenizer)
    sft_dir = train_start_model(root, demo, train)
    before = held_out_accuracy(str(sft_dir), held_out)

    results = {}
    for name, run in (("rlvr_gym", run_ours), ("TRL", run_trl)):
        run_dir = root / ("ours" if run is run_ours else "trl")
        shutil.rmtree(run_dir, ignore_errors=True)  # a benchmark measures a fresh run, never a resumed one
        grpo = dataclasses.replace(
            demo.grpo, run_dir=str(run_dir), model=str(sft_dir), steps=steps, seed=seed, eval_every=0, save_every=steps
        )
        torch.set_num_threads(1)
        r = run(grpo, train)
        r["samples_per_s"] = steps * grpo.prompts_per_step * grpo.group_size / r["wall_s"]
        r["exact_match_after"] = held_out_accuracy(r["model_dir"], held_out)
        r["threads_after"] = torch.get_num_threads()
        results[name] = r

    settings = {
        "steps": steps,
        "prompts_per_step": grpo.prompts_per_step,
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
        "model": f"Llama {demo.size.layers} layers x {demo.size.hidden_size} wide, trained from scratch by the demo's SFT ({demo.sft.steps} steps)",
        "train_prompts": demo.train_examples,
        "held_out_examples": demo.eval_examples,
    }
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "settings": settings,
        "versions": versions(),
        "exact_match_before": before,
        "results": results,
        "speedup": results["rlvr_gym"]["samples_per_s"] / results["TRL"]["samples_per_s"],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "grpo_vs_trl.json").write_text(json.dumps(report, indent=2))
    write_plot(out / "grpo_vs_trl.png", results)
    write_markdown(out / "grpo_vs_trl.md", report)
    return report


if __name__ == "__main__":
    import tyro

    result = tyro.cli(main)
    print(json.dumps({k: result[k] for k in ("exact_match_before", "speedup")} | {
        name: {k: r[k] for k in ("wall_s", "samples_per_s", "exact_match_after")} for name, r in result["results"].items()
    }, indent=2))

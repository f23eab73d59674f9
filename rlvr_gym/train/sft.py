"""Maximum-likelihood training (SFT / MLE) on (prompt, target) token pairs, with the run conventions of GRPO.

Examples are dicts with "prompt_ids" and "target_ids" (the target should end with the stop token the sampler
will stop on), and optionally "target_mask" (one bool per target token: False leaves it out of the loss, e.g. the
actions inside a video world model's target); the loss is the mean negative log-likelihood of the target tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from rlvr_gym.train import run as R
from rlvr_gym.train.batch import chunks, pack_batch, slice_batch, token_logprobs


@dataclass
class SFTConfig(R.RunConfig):
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 20
    """Linear warm-up steps; the rate is constant afterwards."""
    batch_size: int = 32
    """Examples per optimizer step on each process."""
    micro_batch: int = 32
    """Examples per forward/backward pass (gradient accumulation over the batch)."""
    eval_examples: int = 256
    """Held-out examples scored for eval/loss."""


def nll(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed negative log-likelihood of the target tokens, and their count."""
    logp, _ = token_logprobs(model, batch)
    mask = batch["loss_mask"]
    return -(logp * mask).sum(), mask.sum()


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, examples: Sequence[dict], pad_id: int, device: torch.device, micro_batch: int) -> float:
    model.eval()
    total, count = 0.0, 0.0
    for s in chunks(len(examples), micro_batch):
        part = examples[s]
        batch = pack_batch([e["prompt_ids"] for e in part], [e["target_ids"] for e in part], pad_id, target_masks(part))
        loss, n = nll(model, slice_batch(batch, slice(None), device))
        total, count = total + float(loss), count + float(n)
    return total / max(count, 1.0)


def target_masks(examples: Sequence[dict]) -> list[list[bool]]:
    return [e.get("target_mask") or [True] * len(e["target_ids"]) for e in examples]


def check_pairs(examples: Sequence[dict], what: str) -> None:
    if not examples:
        raise ValueError(f"no {what} examples")
    for i, ex in enumerate(examples):
        if not ex.get("prompt_ids") or not ex.get("target_ids"):
            raise ValueError(f"{what} example {i} needs non-empty 'prompt_ids' and 'target_ids'")


def train_sft(
    config: SFTConfig,
    examples: Sequence[dict],
    eval_examples: Sequence[dict] = (),
    eval_fn: Callable[[torch.nn.Module], dict[str, float]] | None = None,
) -> Path:
    """Train config.model (or resume) on the examples; returns the directory of the final model."""
    check_pairs(examples, "training")
    d = R.setup_processes(config.threads)
    run_dir = R.prepare_run_dir(config, d)
    model, tokenizer, start_path = R.start_model(config, run_dir)
    model.to(d.device)
    optimizer, scheduler = R.make_optimizer(model, config)
    step = 0
    if config.resume and start_path != config.model:
        step, _ = R.load_checkpoint(Path(start_path), optimizer, scheduler)
    ddp_model = R.wrap_ddp(model, d)
    pad_id = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    held_out = list(eval_examples)[: config.eval_examples]
    logger = R.MetricsLogger(run_dir, d.is_main, resumed_step=step)

    def evaluate(at_step: int) -> None:
        if d.is_main and (held_out or eval_fn):
            metrics = {"eval/loss": heldout_loss(model, held_out, pad_id, d.device, config.micro_batch)} if held_out else {}
            if eval_fn is not None:
                model.eval()
                metrics.update({f"eval/{k}": v for k, v in eval_fn(model).items()})
            logger.log(at_step, metrics)
        R.barrier(d)

    bar = tqdm(total=config.steps, initial=step, desc="sft", disable=not d.is_main, dynamic_ncols=True)
    while step < config.steps:
        started = time.perf_counter()
        idx = R.batch_indices(len(examples), config.batch_size, step, config.seed, d.rank, d.world_size)
        part = [examples[i] for i in idx]
        batch = pack_batch([e["prompt_ids"] for e in part], [e["target_ids"] for e in part], pad_id, target_masks(part))
        tokens = float(batch["loss_mask"].sum())
        model.train()
        micro = chunks(len(part), config.micro_batch)
        total = 0.0
        for j, s in enumerate(micro):
            sync = ddp_model.no_sync() if (d.world_size > 1 and j < len(micro) - 1) else nullcontext()
            with sync:
                loss, _ = nll(ddp_model, slice_batch(batch, s, d.device))
                (loss / tokens).backward()
            total += loss.item()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm or math.inf))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        elapsed = time.perf_counter() - started
        metrics = {
            "train/loss": total / tokens,
            "train/grad_norm": grad_norm,
            "train/lr": scheduler.get_last_lr()[0],
            "time/tokens_per_s": float(batch["attention_mask"].sum()) / elapsed,
        }
        metrics = R.mean_across_ranks(d, metrics)
        if step % config.log_every == 0 or step == config.steps:
            logger.log(step, metrics)
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['train/loss']:.3f}")
        if step % config.save_every == 0 or step == config.steps:
            if d.is_main:
                R.save_checkpoint(run_dir, step, model, tokenizer, optimizer, scheduler, config.keep_checkpoints)
            R.barrier(d)
        if (config.eval_every and step % config.eval_every == 0) or step == config.steps:
            evaluate(step)
    bar.close()
    final = run_dir / "final"
    if d.is_main:
        final = R.save_final(run_dir, model, tokenizer)
    R.barrier(d)
    logger.close()
    return final

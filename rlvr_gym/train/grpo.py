"""The one RLVR trainer: GRPO (and Dr.GRPO, DAPO) on a verifiable reward, for any Hugging Face causal LM.

Each step, on each process:
1. sample `group_size` completions for each of `prompts_per_step` prompts (rlvr_gym.models.sampler);
2. score them with the domain's reward, `reward_fn(completions=..., completion_ids=..., **columns) -> [dict]`,
   each dict holding "score" and optional numeric components; an "error" entry marks a parse failure (counted; its
   score is the domain's: 0 where rewards are non-negative, the video reward's floor where they are not);
3. advantages normalised within each group (against the group mean, or the greedy completion's reward: ReMax);
4. clipped policy-ratio loss over the sampled (not forced) completion tokens, KL to the frozen starting model
   with the k3 estimator (beta = 0 loads no reference model).
Examples are dicts with "prompt_ids" (token ids), optional "forced" ({completion position: token id}) and any
other columns, which reach the reward function by name ("prompt" arrives as `prompts`, as in TRL).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from rlvr_gym.models.lm import load_model
from rlvr_gym.models.sampler import SamplingConfig, sample
from rlvr_gym.train import run as R
from rlvr_gym.train.batch import chunks, pack_batch, slice_batch, token_logprobs

RewardFn = Callable[..., list[dict]]
EvalFn = Callable[[torch.nn.Module], dict[str, float]]


@dataclass
class GRPOConfig(R.RunConfig):
    lr: float = 1e-5
    """Peak learning rate (AdamW)."""
    prompts_per_step: int = 8
    """Distinct prompts per optimizer step on each process."""
    group_size: int = 8
    """Completions sampled per prompt; advantages are normalised within each group."""
    max_new_tokens: int = 64
    """Completion length limit."""
    temperature: float = 1.0
    """Sampling temperature for rollouts; the loss scores them at the same temperature (the text and web commands
    default to 0.7, and say why)."""
    top_k: int = 0
    """Top-k filter for rollouts (0: off)."""
    top_p: float = 1.0
    """Nucleus filter for rollouts (1: off)."""
    loss_type: Literal["grpo", "dr_grpo", "dapo"] = "grpo"
    """grpo: std-normalised advantages, mean over each completion's tokens then over completions;
    dr_grpo: advantages not divided by the std, token sum divided by a constant (rows x max_new_tokens);
    dapo: std-normalised advantages, mean over all tokens of the batch (token-level)."""
    epsilon: float = 0.2
    """Lower clip range of the policy ratio (and upper, unless epsilon_high is set)."""
    epsilon_high: float = 0.0
    """Upper clip range (DAPO's clip-higher uses 0.28); 0 means equal to epsilon."""
    beta: float = 1e-3
    """Weight of the k3 KL penalty to the starting model; 0 loads no reference model."""
    updates_per_batch: int = 1
    """Optimizer steps on each sampled batch (mu); >1 makes the ratio and its clipping matter."""
    micro_batch: int = 64
    """Rows per forward/backward pass (gradient accumulation over the batch)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: groups whose completions all score the same carry no gradient, so keep drawing
    batches of prompts (up to max_draws) until prompts_per_step groups with differing rewards are found, and update
    on those alone. Pays off when most groups are uniform (a binary reward the model nearly always fails or passes)."""
    max_draws: int = 4
    """Prompt batches drawn per step at most with dynamic_sampling."""
    baseline: Literal["group", "greedy"] = "group"
    """What a completion's reward is compared with: its group's mean (GRPO), or the reward of the prompt's greedy
    completion, decoded once more per prompt (ReMax, Li et al. 2023). With "greedy" a sample gains probability only
    where it beats what greedy decoding already gives, so the update moves the greedy prediction itself (what the
    learned simulators and evals use), where the group mean mostly teaches samples to stop doing worse than greedy."""


# ---------------------------------------------------------------------------------------------------- the maths


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True,
                     baseline: torch.Tensor | None = None) -> torch.Tensor:
    """(r - group mean) / (group std + eps), or without the division when scale is False (Dr.GRPO).

    `baseline` (one per group, e.g. the greedy completion's reward) takes the group mean's place, and the division is
    by the std of all the batch's differences: a group whose samples tie but differ from the baseline has std 0."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size)
    if baseline is not None:
        if baseline.shape != (len(grouped),):
            raise ValueError(f"baseline must hold one value per group ({len(grouped)}), got shape {tuple(baseline.shape)}")
        centred = grouped - baseline[:, None]
        if scale and centred.numel() > 1:
            centred = centred / (centred.std() + 1e-4)
        return centred.view(-1)
    centred = grouped - grouped.mean(1, keepdim=True)
    if scale:
        std = grouped.std(1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped[:, :1])
        centred = centred / (std + 1e-4)
    return centred.view(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference) per token: exp(d) - d - 1, d = ref - policy (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def policy_loss_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss and the mask of tokens where clipping is active."""
    ratio = torch.exp(logp - old_logp)
    a = advantages[:, None]
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + (epsilon_high or epsilon))
    loss = -torch.min(ratio * a, clipped * a)
    is_clipped = ((ratio < 1 - epsilon) & (a < 0)) | ((ratio > 1 + (epsilon_high or epsilon)) & (a > 0))
    return loss, is_clipped


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, total_rows: int, total_tokens: int, width: int):
    """Sum this micro-batch's share of the batch loss, normalised as loss_type says over the *whole* batch."""
    masked = per_token * mask
    if loss_type == "grpo":
        return (masked.sum(1) / mask.sum(1).clamp(min=1)).sum() / total_rows
    if loss_type == "dapo":
        return masked.sum() / max(1, total_tokens)
    if loss_type == "dr_grpo":
        return masked.sum() / (total_rows * width)
    raise ValueError(f"unknown loss_type {loss_type!r}: use grpo, dr_grpo or dapo")


# ---------------------------------------------------------------------------------------------------- rewards


def score_completions(reward_fn: RewardFn, completions: list, completion_ids: list[list[int]], columns: dict) -> dict:
    """Call the reward function and check what it returns; bad samples become logged zeros, bad contracts raise."""
    kwargs = {("prompts" if k == "prompt" else k): v for k, v in columns.items()}
    results = reward_fn(completions=completions, completion_ids=completion_ids, **kwargs)
    name = getattr(reward_fn, "__name__", repr(reward_fn))
    if not isinstance(results, (list, tuple)) or len(results) != len(completions):
        got = f"{type(results).__name__} of length {len(results)}" if hasattr(results, "__len__") else type(results).__name__
        raise TypeError(f"reward function {name} must return a list of {len(completions)} dicts, got {got}")
    scores, errors, invalid, components = [], 0, 0, {}
    for r in results:
        if not isinstance(r, dict) or "score" not in r:
            raise TypeError(f"reward function {name} must return dicts with a 'score' entry, got {r!r}")
        score = r["score"]
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            invalid += 1
            score = 0.0
        if r.get("error"):
            errors += 1
        scores.append(float(score))
        for key, value in r.items():
            if key not in ("score", "error") and isinstance(value, (int, float)) and math.isfinite(value):
                components.setdefault(key, []).append(float(value))
    n = len(results)
    return {
        "scores": torch.tensor(scores),
        "parse_failure_rate": errors / n,
        "invalid_reward_rate": invalid / n,
        "components": {k: sum(v) / len(v) for k, v in components.items()},
    }


def expand_columns(examples: Sequence[dict], group_size: int) -> dict:
    columns = {}
    for key in examples[0]:
        if key in ("prompt_ids", "forced"):
            continue
        columns[key] = [ex[key] for ex in examples for _ in range(group_size)]
    return columns


# ---------------------------------------------------------------------------------------------------- the loop


def check_examples(examples: Sequence[dict]) -> None:
    if not examples:
        raise ValueError("no training prompts: the example list is empty")
    for i, ex in enumerate(examples):
        ids = ex.get("prompt_ids") if isinstance(ex, dict) else None
        if not ids:
            raise ValueError(f"example {i} has no 'prompt_ids' (a non-empty list of token ids)")


def train_grpo(
    config: GRPOConfig,
    reward_fn: RewardFn,
    examples: Sequence[dict],
    eval_fn: EvalFn | None = None,
    decode: Callable[[list[int]], str] | None = None,
    allowed_tokens: torch.Tensor | None = None,
) -> Path:
    """Run GRPO from config.model (or resume); returns the directory of the final model.

    `decode` turns completion ids into what the reward sees as `completions` (default: the tokenizer's decode;
    with no tokenizer, the id lists themselves). `eval_fn(model)` runs on rank 0 at step 0, every eval_every
    steps and at the end, and its metrics are logged under eval/. `allowed_tokens` is passed to the sampler
    for domains whose completions have a fixed layout.
    """
    check_examples(examples)
    if min(config.max_new_tokens, config.group_size, config.prompts_per_step, config.max_draws) < 1:
        raise ValueError("max_new_tokens, group_size, prompts_per_step and max_draws must all be at least 1")
    if not config.temperature > 0:
        raise ValueError(f"temperature must be above 0 (GRPO needs different completions in a group), got {config.temperature}")
    if config.baseline not in ("group", "greedy"):
        raise ValueError(f"baseline must be 'group' or 'greedy', got {config.baseline!r}")
    run = R.Run(config, "grpo")
    model, tokenizer, d = run.model, run.tokenizer, run.d
    reference = None
    if config.beta > 0:
        reference, _ = load_model(config.model)
        reference.to(d.device).eval().requires_grad_(False)
    if decode is None and tokenizer is not None:
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    pad_id = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    stop_ids = (tokenizer.eos_token_id,) if tokenizer is not None and tokenizer.eos_token_id is not None else ()
    sampling = SamplingConfig(config.max_new_tokens, config.temperature, config.top_k, config.top_p, stop_ids)
    greedy = SamplingConfig(config.max_new_tokens, 0.0, stop_token_ids=stop_ids)
    evaluate = (lambda: eval_fn(model)) if eval_fn is not None else None
    if run.step == 0:
        run.evaluate(evaluate)

    while run.running():
        started = time.perf_counter()
        draws = config.max_draws if config.dynamic_sampling else 1
        kept: list[dict] = []  # groups to learn from: prompt, completions, sampled masks, rewards
        all_rewards, failures, invalid, components, lengths, greedy_rewards = [], [], [], [], [], []
        sampling_seconds = 0.0
        for draw in range(draws):
            # Draw 0 is the plain GRPO batch; later draws take other prompts from their own seeded stream.
            idx = R.batch_indices(len(examples), config.prompts_per_step, run.step, config.seed + 7_919 * draw, d.rank, d.world_size)
            batch_examples = [examples[i] for i in idx]
            prompts = [ex["prompt_ids"] for ex in batch_examples]
            forced = [ex.get("forced", {}) for ex in batch_examples]
            model.eval()
            draw_started = time.perf_counter()
            rollout = sample(
                model,
                prompts,
                sampling,
                num_samples=config.group_size,
                forced=forced,
                pad_token_id=pad_id,
                generator=R.step_generator(config.seed, run.step, d.rank, stream=draw),
                allowed_tokens=allowed_tokens,
            )
            greedy_ids = None
            if config.baseline == "greedy":
                greedy_ids = sample(model, prompts, greedy, forced=forced, pad_token_id=pad_id,
                                    allowed_tokens=allowed_tokens).completions()
            sampling_seconds += time.perf_counter() - draw_started
            baselines = None
            if greedy_ids is not None:
                baselines = score_completions(reward_fn, [decode(c) for c in greedy_ids] if decode else greedy_ids,
                                              greedy_ids, expand_columns(batch_examples, 1))["scores"]
                greedy_rewards.append(baselines)
            completion_ids = rollout.completions()
            completions = [decode(c) for c in completion_ids] if decode else completion_ids
            scored = score_completions(reward_fn, completions, completion_ids, expand_columns(batch_examples, config.group_size))
            all_rewards.append(scored["scores"])
            failures.append(scored["parse_failure_rate"])
            invalid.append(scored["invalid_reward_rate"])
            components.append(scored["components"])
            lengths.append(rollout.completion_mask.sum(1).float())
            masks = rollout.sampled_masks()
            for g in range(len(batch_examples)):
                rows = slice(g * config.group_size, (g + 1) * config.group_size)
                group = {"prompt_ids": rollout.prompt_ids[rows], "completion_ids": completion_ids[rows],
                         "sampled_masks": masks[rows], "rewards": scored["scores"][rows],
                         "baseline": baselines[g] if baselines is not None else None}
                if baselines is not None:
                    learnable = bool((group["rewards"] != group["baseline"]).any())
                else:
                    learnable = config.group_size == 1 or bool(group["rewards"].std() > 0)
                if not config.dynamic_sampling or learnable:
                    kept.append(group)
            if len(kept) >= config.prompts_per_step:
                break
        if not kept:
            # Nothing to learn from in any draw: update on the last batch anyway (zero advantages, zero gradient),
            # so that every rank still joins DDP's all-reduce and the schedule advances.
            kept = [group]
        kept = kept[: config.prompts_per_step]
        rewards = torch.cat([g["rewards"] for g in kept])
        baseline = torch.stack([g["baseline"] for g in kept]) if config.baseline == "greedy" else None
        advantages = group_advantages(rewards, config.group_size, scale=config.loss_type != "dr_grpo", baseline=baseline)
        batch = pack_batch([p for g in kept for p in g["prompt_ids"]], [c for g in kept for c in g["completion_ids"]], pad_id,
                           [m for g in kept for m in g["sampled_masks"]])
        stats = policy_update(run, config, batch, advantages, reference)
        elapsed = time.perf_counter() - started
        sampled_rewards = torch.cat(all_rewards)
        grouped = sampled_rewards.view(-1, config.group_size)
        component_means = {k: sum(c[k] for c in components if k in c) / sum(k in c for c in components)
                           for k in {k for c in components for k in c}}
        metrics = {
            "reward/mean": float(sampled_rewards.mean()),
            "reward/std": float(sampled_rewards.std()) if sampled_rewards.numel() > 1 else 0.0,
            "reward/parse_failure_rate": sum(failures) / len(failures),
            "reward/invalid_rate": sum(invalid) / len(invalid),
            "reward/groups_without_signal": float((grouped.std(1) == 0).float().mean()) if config.group_size > 1 else 1.0,
            **{f"reward/{k}": v for k, v in component_means.items()},
            **{f"train/{k}": v for k, v in stats.items()},
            "completion/length_mean": float(torch.cat(lengths).mean()),
            "time/samples_per_s": sampled_rewards.numel() / elapsed,
            "time/sampling_fraction": sampling_seconds / elapsed,
        }
        if config.dynamic_sampling:
            metrics.update({"sampling/draws": len(all_rewards), "sampling/groups_kept": len(kept)})
        if greedy_rewards:
            metrics["reward/greedy"] = float(torch.cat(greedy_rewards).mean())
        run.end_step(metrics, evaluate, postfix=["reward/mean", "reward/parse_failure_rate"])
    return run.finish()


def policy_update(run: R.Run, config: GRPOConfig, batch: dict, advantages: torch.Tensor, reference) -> dict[str, float]:
    """`updates_per_batch` optimizer steps on one sampled batch, in micro-batches; returns loss statistics."""
    model, d = run.model, run.d
    rows = batch["completion_ids"].shape[0]
    total_tokens = int(batch["loss_mask"].sum())
    micro = chunks(rows, config.micro_batch)
    model.train()
    old_logp = ref_logp = None
    t = config.temperature
    with torch.no_grad():
        if config.updates_per_batch > 1:
            old_logp = torch.cat([token_logprobs(model, slice_batch(batch, s, d.device), temperature=t)[0].cpu() for s in micro])
        if reference is not None:
            ref_logp = torch.cat([token_logprobs(reference, slice_batch(batch, s, d.device), temperature=t)[0].cpu() for s in micro])
    stats = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "grad_norm": 0.0}
    per_update = 1.0 / config.updates_per_batch
    for update in range(config.updates_per_batch):
        for j, s in enumerate(micro):
            mb = slice_batch(batch, s, d.device)
            mask = mb["loss_mask"]
            sync = run.ddp_model.no_sync() if (d.world_size > 1 and j < len(micro) - 1) else nullcontext()
            with sync:
                logp, entropy = token_logprobs(run.ddp_model, mb, with_entropy=update == 0, temperature=t)
                old = old_logp[s].to(d.device) if old_logp is not None else logp.detach()
                per_token, clipped = policy_loss_terms(logp, old, advantages[s].to(d.device), config.epsilon, config.epsilon_high)
                if ref_logp is not None:
                    kl = k3_kl(logp, ref_logp[s].to(d.device))
                    per_token = per_token + config.beta * kl
                    stats["kl"] += float((kl.detach() * mask).sum()) / max(1, total_tokens) * per_update
                loss = aggregate(per_token, mask, config.loss_type, rows, total_tokens, config.max_new_tokens)
                loss.backward()
            stats["loss"] += loss.item() * per_update
            stats["clip_fraction"] += float((clipped * mask).sum()) / max(1, total_tokens) * per_update
            if entropy is not None:
                stats["entropy"] += float((entropy * mask).sum()) / max(1, total_tokens)
        stats["grad_norm"] += run.optimizer_step() * per_update
    return stats

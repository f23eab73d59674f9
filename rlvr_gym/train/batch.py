"""Batches of (prompt, completion) token sequences and their per-token log-probabilities, for SFT and GRPO."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pack_batch(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_token_id: int,
    loss_masks: Sequence[Sequence[float]] | None = None,
) -> dict[str, torch.Tensor]:
    """Left-padded prompts followed by right-padded completions, so every completion starts at the same column.

    That lets the model compute logits for the completion columns only (`logits_to_keep`): prompts are long and
    completions short in the world-model tasks, and the output layer over a 4k vocabulary is a quarter of the cost.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    rows = len(prompts)
    prompt_width = max(map(len, prompts))
    width = max(1, max(map(len, completions)))
    prompt_ids = torch.full((rows, prompt_width), pad_token_id, dtype=torch.long)
    completion_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, prompt_width + width), dtype=torch.long)
    loss_mask = torch.zeros((rows, width), dtype=torch.float)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        prompt_ids[i, prompt_width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        completion_ids[i, : len(c)] = torch.as_tensor(list(c), dtype=torch.long)
        attention_mask[i, prompt_width - len(p) : prompt_width + len(c)] = 1
        mask = loss_masks[i] if loss_masks is not None else [True] * len(c)
        loss_mask[i, : len(c)] = torch.as_tensor(list(mask), dtype=torch.float)
    return {
        "input_ids": torch.cat([prompt_ids, completion_ids], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "completion_ids": completion_ids,
        "loss_mask": loss_mask,
    }


def token_logprobs(model: torch.nn.Module, batch: dict, with_entropy: bool = False, temperature: float = 1.0):
    """Log-probabilities (rows, width) of the completion tokens, and optionally the model's entropy there.

    `temperature` divides the logits, so that GRPO scores its rollouts under the policy that sampled them."""
    width = batch["completion_ids"].shape[1]
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        logits_to_keep=width + 1,
    ).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, batch["completion_ids"][..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def slice_batch(batch: dict, rows: slice, device: torch.device) -> dict:
    return {k: v[rows].to(device) for k, v in batch.items()}

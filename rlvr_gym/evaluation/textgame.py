"""Text-game world models scored against real transitions: exact-match accuracy overall, on changed and on
unchanged transitions, parse failures, and the "no change" baseline on the same transitions.

Predictions are greedy (the sampler's batched KV-cache decoding); `--best-of N` instead samples N completions per
transition and keeps the one with the highest task reward against the gold next state: an oracle, the upper bound
that reranking N samples could reach (for exact match it is pass@N).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import PreTrainedTokenizerBase

from rlvr_gym.data.bytesized32 import Transition, data_dir, load_transitions
from rlvr_gym.data.textgame import encode_prompts, subsample
from rlvr_gym.domains.textgame import accuracy_table, no_change_predictions, task_reward
from rlvr_gym.models.lm import checked_tokenizer, load_model, pick_device
from rlvr_gym.models.sampler import sample_texts


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    transitions: Sequence[Transition],
    batch_size: int = 16,
    max_new_tokens: int = 512,
    num_samples: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[list[str]]:
    """`num_samples` decoded completions per transition (greedy at temperature 0), in the transitions' order."""
    return sample_texts(model, tokenizer, encode_prompts(tokenizer, transitions), batch_size, max_new_tokens,
                        num_samples, temperature, seed)


def best_by_task_reward(samples: Sequence[Sequence[str]], transitions: Sequence[Transition]) -> list[str]:
    """For each transition, the sample whose task reward against the gold next state is highest (first on ties)."""
    chosen = []
    for texts, t in zip(samples, transitions):
        rewards = task_reward(list(texts), [t.current] * len(texts), [t.next] * len(texts))
        chosen.append(texts[max(range(len(texts)), key=lambda k: rewards[k]["score"])])
    return chosen


@dataclass
class TextGameEvalConfig:
    data: str = field(default_factory=lambda: str(data_dir() / "valid.jsonl.gz"))
    """ByteSized32-format JSONL(.gz) of transitions to evaluate on (default: the shared valid split)."""
    checkpoint: str = "runs/textgame/sft/final"
    """Model to evaluate: a shipped checkpoint name or a Hugging Face directory with its tokenizer."""
    limit: int = 0
    """Evaluate a seeded random sample of this many transitions (0: all)."""
    best_of: int = 1
    """Sample this many completions per transition and keep the best by task reward against gold (1: greedy)."""
    temperature: float = 1.0
    """Sampling temperature when best_of > 1."""
    batch_size: int = 16
    """Prompts decoded together."""
    max_new_tokens: int = 512
    """Completion length limit; a longer completion is cut and counts as a parse failure."""
    seed: int = 0
    """Seed of the --limit sample and of best-of-N sampling."""
    threads: int = 1
    """torch threads."""
    device: str = "auto"
    """Where the model runs: auto (cuda when there is a GPU, else cpu), cpu, cuda, cuda:N."""


def run_textgame_eval(config: TextGameEvalConfig) -> dict:
    """Score a checkpoint on a transition file; returns the metrics and the no-change baseline on the same data.

    The CLI prints the returned dict as one JSON line; NaN (no changed or no unchanged transitions) becomes null.
    """
    if config.best_of < 1 or config.batch_size < 1 or config.max_new_tokens < 1:
        raise ValueError("best_of, batch_size and max_new_tokens must all be at least 1")
    torch.set_num_threads(config.threads)
    transitions = subsample(load_transitions(config.data), config.limit, config.seed)
    if not transitions:
        raise ValueError(f"{config.data} holds no transitions")
    model, tokenizer = load_model(config.checkpoint)
    tokenizer = checked_tokenizer(tokenizer, config.checkpoint)
    model.to(pick_device(config.device)).eval()
    started = time.perf_counter()
    if config.best_of == 1:
        preds = [p[0] for p in predict(model, tokenizer, transitions, config.batch_size, config.max_new_tokens)]
    else:
        samples = predict(
            model, tokenizer, transitions, config.batch_size, config.max_new_tokens,
            num_samples=config.best_of, temperature=config.temperature, seed=config.seed,
        )
        preds = best_by_task_reward(samples, transitions)
    seconds = time.perf_counter() - started
    metrics = accuracy_table(preds, transitions)
    baseline = accuracy_table(no_change_predictions(transitions), transitions)
    result = {
        **metrics,
        **{f"no_change_{k}": baseline[k] for k in ("accuracy", "accuracy_changed", "accuracy_unchanged")},
        "best_of": config.best_of,
        "checkpoint": str(config.checkpoint),
        "data": str(config.data),
        "seconds": round(seconds, 1),
    }
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in result.items()}

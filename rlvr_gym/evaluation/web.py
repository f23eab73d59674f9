"""Web world models scored against real MiniWoB++ transitions: item precision / recall / F1, reward and done accuracy,
exact match and parse failures, overall and split into the tasks the model was trained on (`seen_`) and the tasks
it never saw (`heldout_`), each beside the always-"no change" baseline on the same transitions (`nochange_`); and
the outcome (goes on / task done / ended otherwise) as the LM writes it and as the checkpoint's outcome head
predicts it when it has one, overall and per task.

Transitions are collected fresh in the real env with `--seed` S (checked against the training episodes the
checkpoint records: no (task, seed) may be shared), or read from a recorded set (`--data DIR`). Precision, recall
and F1 are means over transitions of `web_reward`'s per-transition values; a completion that does not parse counts
as 0 for all three and wrong for reward and done. Predictions are greedy (the sampler's batched KV-cache decoding);
`--best-of N` instead samples N completions per transition and keeps the one with the highest web reward against
the gold: an oracle, the upper bound that reranking N samples could reach.

Which tasks are "seen" comes from `web_training.json`, written beside the model by `train web-sft` and
`train web-rlvr`; `--seen-tasks` overrides it (needed for a checkpoint without one, e.g. a mid-run step).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from envs.web import TASKS
from rlvr_gym.data.web import (
    TRAINING_RECORD,
    check_real_pages,
    earlier_actions,
    encode_prompts,
    load_web_data,
    read_training_record,
)
from rlvr_gym.data.web_collect import collect_records
from rlvr_gym.domains.web import best_by_web_reward, parse_target, web_metrics
from rlvr_gym.models.lm import checked_tokenizer, context_length, load_model, resolve_checkpoint
from rlvr_gym.models.sampler import sample_texts
from rlvr_gym.models.web_outcome import CLASSES, OUTCOME_DIR, OutcomeHead, check_not_trained_on, outcome_label

log = logging.getLogger("rlvr_gym")


def evaluate_model(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[dict],
    seen_tasks: Sequence[str],
    batch_size: int = 16,
    max_new_tokens: int = 768,
) -> dict[str, float]:
    """Greedy `web_metrics` of a model on recorded transitions, finite values only (the trainers log them under
    eval/)."""
    preds = [p[0] for p in sample_texts(model, tokenizer, encode_prompts(tokenizer, records), batch_size, max_new_tokens)]
    metrics = web_metrics(preds, records, seen_tasks)
    return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}


def outcome_accuracies(checkpoint: str | os.PathLike, completions: Sequence[str], records: Sequence[dict]) -> dict:
    """Share of transitions whose outcome (`rlvr_gym.models.web_outcome.CLASSES`: the episode goes on, ends with the
    task done, ends otherwise) the LM's completions get right (`lm_outcome_accuracy`; one that does not parse is
    wrong) and, when the checkpoint has an outcome head, the head (`head_outcome_accuracy`); overall and per task."""
    labels = [outcome_label(r["reward"], r["done"]) for r in records]
    targets = [parse_target(text)[0] for text in completions]
    lm = [t is not None and outcome_label(t["reward"], t["done"]) == y for t, y in zip(targets, labels)]
    right = {"lm": lm}
    head_dir = resolve_checkpoint(checkpoint) / OUTCOME_DIR
    if head_dir.exists():
        head = OutcomeHead(head_dir)
        predicted = head.predict_each([r["utterance"] for r in records], [r["tree_before"] for r in records],
                                      [r["action"] for r in records], earlier_actions(records))  # fmt: skip
        right["head"] = [p.label == CLASSES[y] for p, y in zip(predicted, labels)]
    out = {}
    for name, hits in right.items():
        out[f"{name}_outcome_accuracy"] = float(np.mean(hits))
        for task in sorted({r["task"] for r in records}):
            mine = [h for h, r in zip(hits, records) if r["task"] == task]
            out[f"{task}_{name}_outcome_accuracy"] = float(np.mean(mine))
    return out


# ---------------------------------------------------------------------------------------------------- the command


@dataclass
class WebEvalConfig:
    checkpoint: str = "runs/web/rlvr/final"
    """Model to evaluate: a shipped checkpoint name or a Hugging Face directory with its tokenizer."""
    data: str = ""
    """A recorded set (`rlvr-gym collect web --out DIR`) to evaluate on; empty: collect fresh transitions."""
    episodes: int = 10
    """Fresh episodes per task (when collecting)."""
    seed: int = 2
    """Collection seed of the fresh episodes: episode i of a task plays MiniWoB seed seed * 1_000_000 + i; must
    differ from the training and held-out sets' seeds (0 and 1 by default)."""
    tasks: tuple[str, ...] = TASKS
    """Tasks to collect fresh episodes of (default: all 13, the 2 held out from training included)."""
    skills: tuple[float, ...] = (1.0, 0.7, 0.4, 0.1)
    """Scripted-policy skills of the fresh episodes, in turn (episode i gets skills[i % len]); as in training."""
    max_steps: int = 20
    """Steps per fresh episode at most."""
    workers: int = 1
    """Browsers collecting in parallel processes."""
    seen_tasks: tuple[str, ...] = ()
    """Tasks that count as seen; empty: the tasks in the checkpoint's web_training.json."""
    best_of: int = 1
    """Sample this many completions per transition and keep the best by web reward against gold (1: greedy)."""
    temperature: float = 1.0
    """Sampling temperature when best_of > 1."""
    batch_size: int = 16
    """Prompts decoded together."""
    max_new_tokens: int = 768
    """Completion length limit; a longer completion is cut and counts as a parse failure."""
    threads: int = 1
    """torch threads."""


def run_web_eval(config: WebEvalConfig) -> dict:
    """Score a checkpoint on fresh real transitions (or a recorded set); returns one flat dict of metrics.

    The CLI prints it as one JSON line; a split without transitions has null means.
    """
    if config.best_of < 1 or config.batch_size < 1 or config.max_new_tokens < 1:
        raise ValueError("best_of, batch_size and max_new_tokens must all be at least 1")
    torch.set_num_threads(config.threads)
    training = read_training_record(resolve_checkpoint(config.checkpoint))
    if config.seen_tasks:
        seen_tasks = list(config.seen_tasks)
    elif training is not None:
        seen_tasks = training["tasks"]
    else:
        raise ValueError(
            f"{config.checkpoint} has no {TRAINING_RECORD} saying which tasks it was trained on: pass --seen-tasks"
        )
    if config.data:
        records, manifest = load_web_data(config.data)
        check_real_pages(manifest, config.data, "the page scores of `eval web`")
        episodes = {task: entry["seeds"] for task, entry in manifest["tasks"].items()}
        source = config.data
    else:
        records, episodes = collect_records(
            config.tasks, config.episodes, config.seed, config.skills, config.max_steps, config.workers
        )
        source = f"fresh episodes, seed {config.seed}"
    if not records:
        raise ValueError(f"no transitions to evaluate on from {source}")
    check_not_trained_on(resolve_checkpoint(config.checkpoint), episodes, source, config.checkpoint)
    # Loaded after collecting: collection workers fork, best before torch or tokenizers start their threads.
    model, tokenizer = load_model(config.checkpoint)
    tokenizer = checked_tokenizer(tokenizer, config.checkpoint)
    model.eval()
    started = time.perf_counter()
    prompts = encode_prompts(tokenizer, records)
    # A page longer than the model's context cannot be predicted: it scores as a parse failure (empty completion),
    # is counted in over_context_rate, and is not decoded (book-flight trees reach 7k tokens).
    context = context_length(model)
    fits = [i for i, p in enumerate(prompts) if len(p) + config.max_new_tokens <= context]
    preds = [""] * len(records)
    if config.best_of == 1:
        decoded = [p[0] for p in sample_texts(model, tokenizer, [prompts[i] for i in fits], config.batch_size,
                                              config.max_new_tokens)]
    else:
        samples = sample_texts(
            model, tokenizer, [prompts[i] for i in fits], config.batch_size, config.max_new_tokens,
            num_samples=config.best_of, temperature=config.temperature, seed=config.seed,
        )  # fmt: skip
        decoded = best_by_web_reward(samples, [records[i] for i in fits])
    for i, text in zip(fits, decoded):
        preds[i] = text
    seconds = time.perf_counter() - started
    result = {
        **web_metrics(preds, records, seen_tasks),
        **outcome_accuracies(config.checkpoint, preds, records),
        "over_context_rate": 1 - len(fits) / len(records),
        "best_of": config.best_of,
        "seen_tasks": ",".join(sorted(seen_tasks)),
        "checkpoint": str(config.checkpoint),
        "data": source,
        "seconds": round(seconds, 1),
    }
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in result.items()}

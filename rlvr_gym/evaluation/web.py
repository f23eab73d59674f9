"""Web world models scored against real MiniWoB++ transitions: item precision / recall / F1, reward and done accuracy,
exact match and parse failures, overall and split into the tasks the model was trained on (`seen_`) and the tasks
it never saw (`heldout_`), each beside the always-"no change" baseline on the same transitions (`nochange_`).

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

import json
import logging
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import PreTrainedTokenizerBase

from envs.web import TASKS
from rlvr_gym.domains.web import format_prompt, format_target, make_diff, no_change_target, web_reward
from rlvr_gym.evaluation.textgame import checked_tokenizer
from rlvr_gym.models.lm import context_length, load_model, resolve_checkpoint
from rlvr_gym.models.sampler import sample_texts

log = logging.getLogger("rlvr_gym")

TRAINING_RECORD = "web_training.json"
"""Written beside a trained model: the tasks and (task, seed) episodes it was trained on."""
METRICS = ("precision", "recall", "f1", "reward_accuracy", "done_accuracy", "exact_match", "parse_failure_rate")
BASELINE_METRICS = ("f1", "reward_accuracy", "done_accuracy", "exact_match")


# ---------------------------------------------------------------------------------------------------- text


def prompt_text(record: dict) -> str:
    """The model's input for a recorded transition: task, tree before, action."""
    return format_prompt(record["utterance"], record["tree_before"], record["action"])


def target_text(record: dict) -> str:
    """The gold output for a recorded transition: its diff, reward and done."""
    return format_target(make_diff(record["tree_before"], record["tree_after"]), record["reward"], record["done"])


def encode_prompts(tokenizer: PreTrainedTokenizerBase, records: Sequence[dict]) -> list[list[int]]:
    """Token ids of each transition's prompt, after the bos token when the tokenizer has one."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [bos + ids for ids in tokenizer([prompt_text(r) for r in records], add_special_tokens=False)["input_ids"]]


def encode_targets(tokenizer: PreTrainedTokenizerBase, records: Sequence[dict]) -> list[list[int]]:
    """Token ids of each transition's gold output, ending with the eos token the sampler stops on."""
    ids = tokenizer([target_text(r) for r in records], add_special_tokens=False)["input_ids"]
    return [y + [tokenizer.eos_token_id] for y in ids]


# ---------------------------------------------------------------------------------------------------- predictions


@torch.no_grad()
def best_by_web_reward(samples: Sequence[Sequence[str]], records: Sequence[dict]) -> list[str]:
    """For each transition, the sample whose web reward against the gold is highest (first on ties)."""
    chosen = []
    for texts, r in zip(samples, records):
        n = len(texts)
        rows = score_rows(texts, [r] * n)
        chosen.append(texts[max(range(n), key=lambda k: rows[k]["score"])])
    return chosen


# ---------------------------------------------------------------------------------------------------- metrics


def score_rows(completions: Sequence[str], records: Sequence[dict]) -> list[dict]:
    """`web_reward`'s row for each completion against its transition's gold."""
    return web_reward(
        list(completions),
        [r["tree_before"] for r in records],
        [r["tree_after"] for r in records],
        [r["reward"] for r in records],
        [r["done"] for r in records],
    )


def summarise(rows: Sequence[dict]) -> dict[str, float]:
    """Means over transitions of `METRICS` and the count `n`; NaN for every mean when there are no rows."""
    n = len(rows)

    def mean(values) -> float:
        return sum(values) / n if n else math.nan

    return {
        "precision": mean(r.get("precision", 0.0) for r in rows),
        "recall": mean(r.get("recall", 0.0) for r in rows),
        "f1": mean(r.get("f1", 0.0) for r in rows),
        "reward_accuracy": mean(r.get("reward_ok", 0.0) for r in rows),
        "done_accuracy": mean(r.get("done_ok", 0.0) for r in rows),
        "exact_match": mean(float(r["score"] >= 1.0 - 1e-9) for r in rows),
        "parse_failure_rate": mean(float("error" in r) for r in rows),
        "n": n,
    }


def web_metrics(completions: Sequence[str], records: Sequence[dict], seen_tasks: Sequence[str]) -> dict[str, float]:
    """The flat metric dict: `METRICS` and `n`, with `nochange_` baseline values, overall and with the `seen_` and
    `heldout_` prefixes (a split without transitions has NaN means)."""
    rows = score_rows(completions, records)
    baseline = score_rows([no_change_target()] * len(records), records)
    seen = set(seen_tasks)
    out: dict[str, float] = {}
    for prefix, keep in (("", lambda r: True), ("seen_", lambda r: r["task"] in seen),
                         ("heldout_", lambda r: r["task"] not in seen)):  # fmt: skip
        index = [i for i, r in enumerate(records) if keep(r)]
        model = summarise([rows[i] for i in index])
        nochange = summarise([baseline[i] for i in index])
        out.update({f"{prefix}{k}": v for k, v in model.items()})
        out.update({f"{prefix}nochange_{k}": nochange[k] for k in BASELINE_METRICS})
    return out


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


def subsample(records: Sequence[dict], limit: int, seed: int) -> list[dict]:
    """A seeded random `limit` of the records in their order (all when limit is 0)."""
    if limit <= 0 or limit >= len(records):
        return list(records)
    keep = sorted(random.Random(seed).sample(range(len(records)), limit))
    return [records[i] for i in keep]


# ---------------------------------------------------------------------------------------------------- training record


def read_training_record(checkpoint: str | os.PathLike) -> dict | None:
    """The tasks and episodes a checkpoint was trained on (`web_training.json` beside it), or None."""
    path = resolve_checkpoint(checkpoint) / TRAINING_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); delete it and pass --seen-tasks") from None
    if not isinstance(record.get("tasks"), list) or not isinstance(record.get("seeds"), dict):
        raise ValueError(f"{path} lacks 'tasks' (a list) or 'seeds' (task -> seeds); delete it and pass --seen-tasks")
    return record


def check_disjoint_episodes(a: dict[str, Sequence[int]], b: dict[str, Sequence[int]], what_a: str, what_b: str) -> None:
    """Raise ValueError if two sets of episodes (task -> MiniWoB seeds) share a (task, seed): the same page."""
    shared = [(task, s) for task in sorted(set(a) & set(b)) for s in sorted(set(a[task]) & set(b[task]))]
    if shared:
        examples = ", ".join(f"{t} seed {s}" for t, s in shared[:3])
        raise ValueError(
            f"{what_a} and {what_b} share {len(shared)} episodes ({examples}): collect each set with its own --seed "
            "(held-out episodes must be new pages, and two training sets would repeat pages)"
        )


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
    # rlvr_gym.train.web imports this module for its evaluations; importing it at the top would be circular.
    from rlvr_gym.train.web import collect_records, load_web_data

    if config.best_of < 1 or config.batch_size < 1 or config.max_new_tokens < 1:
        raise ValueError("best_of, batch_size and max_new_tokens must all be at least 1")
    torch.set_num_threads(config.threads)
    training = read_training_record(config.checkpoint)
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
        episodes = {task: entry["seeds"] for task, entry in manifest["tasks"].items()}
        source = config.data
    else:
        records, episodes = collect_records(
            config.tasks, config.episodes, config.seed, config.skills, config.max_steps, config.workers
        )
        source = f"fresh episodes, seed {config.seed}"
    if not records:
        raise ValueError(f"no transitions to evaluate on from {source}")
    if training is not None:
        check_disjoint_episodes(training["seeds"], episodes, f"the training data of {config.checkpoint}", source)
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
        "over_context_rate": 1 - len(fits) / len(records),
        "best_of": config.best_of,
        "seen_tasks": ",".join(sorted(seen_tasks)),
        "checkpoint": str(config.checkpoint),
        "data": source,
        "seconds": round(seconds, 1),
    }
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in result.items()}

"""Training recipes of the web world model: SFT from scratch (a byte-level BPE trained on the data and a small Llama)
or from any local Hugging Face causal LM, then RLVR with the F1 web reward through the one GRPO trainer.

Datasets, prompts and targets come from `rlvr_gym.data.web`. A run directory holds the trainer's files (config.json,
log.jsonl, checkpoints/, final/; see rlvr_gym.train.run), web.json (this command's config: --resume with another one
is refused), data_stats.json (token lengths per task, examples dropped as too long), init/ (the trained tokenizer and
the untrained model, from scratch only), and final/web_training.json (the tasks and episodes the model was trained
on, which `eval web` reads to split seen from held-out tasks).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from rlvr_gym.data.web import (
    check_disjoint_episodes,
    encode_examples,
    encode_prompts,
    episodes_of,
    load_train_and_eval,
    read_training_record,
    subsample,
    train_web_tokenizer,
    transition_texts,
    write_training_record,
)
from rlvr_gym.domains.web import OUTCOME_WEIGHT, web_metrics, web_reward
from rlvr_gym.files import atomic_write_text
from rlvr_gym.models.lm import (
    LlamaSize,
    build_llama,
    context_of,
    extend_context,
    load_tokenizer,
    parameter_count,
    resolve_checkpoint,
)
from rlvr_gym.models.sampler import sample_texts
from rlvr_gym.train.grpo import GRPOConfig, train_grpo
from rlvr_gym.train.run import barrier, record_config, set_by_command, setup_processes
from rlvr_gym.train.sft import SFTConfig, train_sft

log = logging.getLogger("rlvr_gym")

# Fields that may differ on --resume; the trainer checks its own (sft, grpo), knowing which of them may change.
RESUMABLE_CHANGES = {"resume", "sft", "grpo", "eval_predict_examples", "eval_batch_size"}


# ---------------------------------------------------------------------------------------------------- collection


# ---------------------------------------------------------------------------------------------------- examples


def report_data(run_dir: Path, stats: dict, is_main: bool) -> None:
    p, y = stats["prompt_tokens"], stats["target_tokens"]
    log.info(
        "prompt tokens median %.0f / p90 %.0f / max %d, target tokens median %.0f / p90 %.0f / max %d; "
        "dropped %d over %d prompt or %d target tokens, kept %d",
        p["median"], p["p90"], p["max"], y["median"], y["p90"], y["max"], stats["dropped_too_long"],
        stats["max_prompt_tokens"], stats["max_target_tokens"], stats["kept"],
    )  # fmt: skip
    for task, s in stats["per_task"].items():
        if s["dropped_too_long"]:
            log.info("dropped %d of %d transitions of %s as too long", s["dropped_too_long"], s["prompt_tokens"]["n"],
                     task)  # fmt: skip
    if is_main:
        atomic_write_text(run_dir / "data_stats.json", json.dumps(stats, indent=2))
    if not stats["kept"]:
        raise ValueError(
            "every training example is over the length limits: raise --max-prompt-tokens / --max-target-tokens"
        )


def check_run(run_dir: Path, config: WebSFTConfig | WebRLVRConfig, is_main: bool) -> None:
    """Refuse to start over a run with checkpoints without --resume, or to resume one with another config."""
    record_config(run_dir, config, config.resume, is_main, "web.json", RESUMABLE_CHANGES)


def held_out_evaluation(records: Sequence[dict], tokenizer, seen_tasks: Sequence[str], limit: int, seed: int,
                        batch_size: int, max_new_tokens: int):  # fmt: skip
    """The greedy web-metrics function for eval/ on a seeded sample of held-out records (None without any)."""
    sample = subsample(records, limit, seed)
    if not sample or limit <= 0:
        return None

    def eval_fn(model: torch.nn.Module) -> dict[str, float]:
        completions = sample_texts(model, tokenizer, encode_prompts(tokenizer, sample), batch_size, max_new_tokens)
        metrics = web_metrics([texts[0] for texts in completions], sample, seen_tasks)
        return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}

    return eval_fn


# ---------------------------------------------------------------------------------------------------- SFT


@dataclass
class WebSFTConfig:
    run_dir: str = "runs/web/sft"
    """Directory of the run: init/, checkpoints/, logs, final/."""
    data: tuple[str, ...] = ("runs/web/train",)
    """Training sets written by `rlvr-gym collect web` (several: collected with different seeds), used together."""
    eval_data: str = "runs/web/heldout"
    """Held-out set (another collection seed; seen and held-out tasks) for eval/loss and eval/ metrics; empty: none."""
    model: str = ""
    """A local pretrained Hugging Face causal LM (with its tokenizer) to fine-tune unchanged; empty: train `size`
    from scratch with a BPE tokenizer trained on the data."""
    size: LlamaSize = field(
        default_factory=lambda: LlamaSize(hidden_size=256, layers=4, heads=8, intermediate_size=688, max_positions=2304)
    )
    """Shape of the from-scratch Llama (3.7M parameters with a 2,048-token vocabulary)."""
    vocab_size: int = 2048
    """Most tokens of the from-scratch byte-level BPE, special tokens included."""
    max_prompt_tokens: int = 1536
    """Examples with longer prompts are dropped, never cut (the measured distribution: module docstring)."""
    max_target_tokens: int = 768
    """Examples with longer targets (eos included) are dropped, never cut."""
    eval_predict_examples: int = 64
    """Held-out transitions decoded greedily for eval/f1 and the rest at each evaluation (0: loss only)."""
    eval_batch_size: int = 16
    """Prompts decoded together during evaluation."""
    seed: int = 0
    """Seed of the model initialisation and of the evaluation sample."""
    resume: bool = False
    """Continue from the newest checkpoint in run_dir."""
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(
            steps=2000, lr=1e-3, warmup_steps=50, batch_size=16, micro_batch=8, save_every=100, eval_every=250,
            eval_examples=128,
        )
    )  # fmt: skip
    """The trainer's settings (its run_dir, model and resume are set from the fields above)."""


def base_record(model: str, eval_manifest: dict | None, eval_data: str) -> dict | None:
    """The training record of the model a run starts from (None when it has none), which the run's own record
    extends; an eval set that shares its episodes is refused."""
    base = read_training_record(resolve_checkpoint(model))
    if base is not None and eval_manifest is not None:
        check_disjoint_episodes(base["seeds"], episodes_of(eval_manifest), f"the training data of {model}", eval_data)
    return base


def run_web_sft(config: WebSFTConfig) -> Path:
    """Train a web world model by SFT on (task, tree, action) -> (diff, reward, done); returns the final model dir."""
    root = Path(config.run_dir)
    if not config.model and config.size.max_positions < config.max_prompt_tokens + config.max_target_tokens:
        raise ValueError(
            f"size.max_positions {config.size.max_positions} is below max_prompt_tokens + max_target_tokens "
            f"({config.max_prompt_tokens} + {config.max_target_tokens}): raise --size.max-positions or lower the limits"
        )
    d = setup_processes(config.sft.threads)
    check_run(root, config, d.is_main)
    train, manifests, held_out, eval_manifest = load_train_and_eval(config.data, config.eval_data)
    base = base_record(config.model, eval_manifest, config.eval_data) if config.model else None
    model_dir = Path(config.model) if config.model else root / "init"
    if config.model and context_of(config.model) < config.max_prompt_tokens + config.max_target_tokens:
        # The longest examples kept need more positions than the model has: train a copy with a longer context.
        model_dir = root / "init"
        if d.is_main and not (config.resume and (model_dir / "config.json").is_file()):
            extend_context(config.model, model_dir, config.max_prompt_tokens + config.max_target_tokens)
            log.info("%s: context raised to %d positions in %s", config.model,
                     config.max_prompt_tokens + config.max_target_tokens, model_dir)  # fmt: skip
        barrier(d)
    if not config.model:
        if d.is_main and not (config.resume and (model_dir / "tokenizer.json").is_file()):
            tokenizer = train_web_tokenizer(transition_texts(train), config.vocab_size)
            torch.manual_seed(config.seed)
            model = build_llama(len(tokenizer), config.size, tokenizer)
            log.info("from-scratch Llama: %.2fM parameters, vocabulary %d", parameter_count(model) / 1e6,
                     len(tokenizer))  # fmt: skip
            model.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
        barrier(d)
    tokenizer = load_tokenizer(model_dir)
    examples, stats = encode_examples(train, tokenizer, config.max_prompt_tokens, config.max_target_tokens)
    report_data(root, stats, d.is_main)
    loss_examples = []
    if held_out and config.sft.eval_examples:
        sample = subsample(held_out, config.sft.eval_examples, config.seed)
        loss_examples, _ = encode_examples(sample, tokenizer, config.max_prompt_tokens, config.max_target_tokens)
    seen_tasks = sorted({task for _, manifest in manifests for task in manifest["tasks"]})
    eval_fn = held_out_evaluation(held_out, tokenizer, seen_tasks, config.eval_predict_examples, config.seed,
                                  config.eval_batch_size, config.max_target_tokens)  # fmt: skip
    sft = set_by_command(config.sft, "sft", run_dir=str(root), model=str(model_dir), resume=config.resume)
    final = train_sft(sft, examples, loss_examples, eval_fn)
    if d.is_main:
        write_training_record(final, manifests, base)
    barrier(d)
    return final


# ---------------------------------------------------------------------------------------------------- RLVR


@dataclass
class WebRLVRConfig:
    run_dir: str = "runs/web/rlvr"
    """Directory of the run: checkpoints/, logs, final/."""
    model: str = "runs/web/sft/final"
    """The model to improve: the SFT run's final/ (or any checkpoint directory with its tokenizer)."""
    data: tuple[str, ...] = ("runs/web/train",)
    """Training sets written by `rlvr-gym collect web` (their prompts; the reward reads the gold trees)."""
    eval_data: str = "runs/web/heldout"
    """Held-out set for eval/ metrics; empty: none."""
    max_prompt_tokens: int = 1536
    """Prompts longer than this are dropped; so are transitions whose gold target exceeds grpo.max_new_tokens."""
    outcome_weight: float = OUTCOME_WEIGHT
    """The reward's weight on predicting the step's reward and done right (half each); item F1 gets the rest. The
    default 0.2 is `web_reward`'s 0.8 / 0.1 / 0.1; more weighs whether an action finishes the task over how the page
    changes."""
    eval_predict_examples: int = 64
    """Held-out transitions decoded greedily for eval/ metrics (0: none)."""
    eval_batch_size: int = 16
    """Prompts decoded together during evaluation."""
    seed: int = 0
    """Seed of the evaluation sample."""
    resume: bool = False
    """Continue from the newest checkpoint in run_dir."""
    grpo: GRPOConfig = field(
        default_factory=lambda: GRPOConfig(
            steps=200, lr=1e-5, prompts_per_step=8, group_size=8, max_new_tokens=768, temperature=0.7, beta=1e-3,
            micro_batch=16, save_every=20, eval_every=50,
        )
    )  # fmt: skip
    """The trainer's settings (its run_dir, model and resume are set from the fields above). Rollouts at 0.7: at
    1.0 most long diffs garble and fail to parse, and GRPO learned to stop early."""


def run_web_rlvr(config: WebRLVRConfig) -> Path:
    """Improve a web world model with GRPO on `web_reward` (0.8 item F1 + 0.1 reward + 0.1 done, or
    `outcome_weight`); returns final/."""
    if not 0 <= config.outcome_weight <= 1:
        raise ValueError(f"--outcome-weight must lie in [0, 1], got {config.outcome_weight}")
    root = Path(config.run_dir)
    d = setup_processes(config.grpo.threads)
    check_run(root, config, d.is_main)
    tokenizer = load_tokenizer(config.model)
    train, manifests, held_out, eval_manifest = load_train_and_eval(config.data, config.eval_data)
    base = base_record(config.model, eval_manifest, config.eval_data)
    examples, stats = encode_examples(train, tokenizer, config.max_prompt_tokens, config.grpo.max_new_tokens)
    report_data(root, stats, d.is_main)
    # The trainer hands every column but prompt_ids to the reward: keep what web_reward reads.
    examples = [{k: e[k] for k in ("prompt_ids", "tree_before", "tree_after", "reward", "done")} for e in examples]
    seen_tasks = {task for _, manifest in manifests for task in manifest["tasks"]}
    seen_tasks = sorted(seen_tasks | set((base or {}).get("tasks", [])))
    eval_fn = held_out_evaluation(held_out, tokenizer, seen_tasks, config.eval_predict_examples, config.seed,
                                  config.eval_batch_size, config.grpo.max_new_tokens)  # fmt: skip
    grpo = set_by_command(config.grpo, "grpo", run_dir=str(root), model=config.model, resume=config.resume)
    reward = partial(web_reward, outcome_weight=config.outcome_weight)
    final = train_grpo(grpo, reward, examples, eval_fn)
    if d.is_main:
        write_training_record(final, manifests, base)
    barrier(d)
    return final

"""Training a web world model's outcome head (`rlvr_gym.models.web_outcome`) on real MiniWoB++ outcomes.

    rlvr-gym train web-outcome --world-model web-refit --data runs/web/trivial4 runs/web/target8-button \
        --eval-data runs/web/val12 --run-dir runs/web/outcome

Examples are drawn with every task equally likely, so a task recorded at length (the button moves) does not drown
the others. The run directory holds the trainer's files (rlvr_gym.train.run), final/ (the head, with
web_training.json: the episodes it learned from) and world_model/ (a copy of the world model with the head in
outcome/, which `RLVRWorld-Web-v0` takes as its checkpoint).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import torch.nn.functional as F

from rlvr_gym.data.web import earlier_actions, load_train_and_eval, write_training_record
from rlvr_gym.models.lm import load_tokenizer, parameter_count, resolve_checkpoint
from rlvr_gym.models.web_outcome import (
    CLASSES,
    OUTCOME_DIR,
    REWARD_LOGIT,
    OutcomeHead,
    OutcomeSize,
    build_outcome_model,
    encode_outcome_inputs,
    outcome_label,
    outcomes_of,
    pad_batch,
    save_outcome_head,
)
from rlvr_gym.train import run as RUN
from rlvr_gym.train.batch import chunks

log = logging.getLogger("rlvr_gym")


@dataclass
class OutcomeConfig(RUN.RunConfig):
    run_dir: str = "runs/web/outcome"
    """Directory for checkpoints, logs, final/ (the head) and world_model/ (the world model with it)."""
    world_model: str = "web-refit"
    """The web world model (shipped name or directory) the head is added to; its tokenizer is the head's."""
    data: tuple[str, ...] = ("runs/web/train",)
    """Training sets written by `rlvr-gym collect web` (real transitions with their reward and done) or by
    `rlvr-gym replay web` (the same on the world model's pages)."""
    eval_data: str = ""
    """Held-out set for eval/ metrics (outcome accuracy overall and per task); empty: none."""
    steps: int = 1200
    """Optimizer steps (web-outcome's head: 1,200 on two processes)."""
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_steps: int = 50
    batch_size: int = 32
    """Examples per step on each process."""
    micro_batch: int = 8
    """Examples per forward pass (a step's examples sorted by length, so short pages are not padded to long ones)."""
    reward_weight: float = 0.5
    """Weight of the squared error of the regressed reward (episodes that end without the task done)."""
    size: OutcomeSize = field(default_factory=OutcomeSize)
    """The classifier's shape (from scratch: --model is a checkpoint to continue from instead)."""
    reads_typed: bool = False
    """The head also reads the episode's earlier type actions (what a password box hides); from scratch only. Off
    for web-outcome: trained on its data (1 login with the two texts swapped among 204 Login clicks), such a head
    plans better but pays swapped logins and random play more (the card's Limits)."""
    save_every: int = 200
    eval_every: int = 200


@dataclass
class Examples:
    inputs: list[tuple[list[int], list[int]]]
    """`encode_outcome_inputs`' (token ids, match flags) per transition."""
    labels: np.ndarray
    rewards: np.ndarray
    tasks: list[str]


def outcome_examples(records: Sequence[dict], tokenizer, max_tokens: int, reads_typed: bool) -> Examples:
    earlier = earlier_actions(records) if reads_typed else None
    inputs = encode_outcome_inputs(tokenizer, [r["utterance"] for r in records], [r["tree_before"] for r in records],
                                   [r["action"] for r in records], max_tokens, earlier)  # fmt: skip
    labels = np.array([outcome_label(r["reward"], r["done"]) for r in records])
    rewards = np.array([float(r["reward"]) for r in records], dtype=np.float32)
    return Examples(inputs, labels, rewards, [r["task"] for r in records])


def task_balanced_weights(tasks: Sequence[str]) -> torch.Tensor:
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task] = counts.get(task, 0) + 1
    return torch.tensor([1.0 / counts[task] for task in tasks], dtype=torch.double)


def outcome_loss(logits: torch.Tensor, labels: torch.Tensor, rewards: torch.Tensor, reward_weight: float
                 ) -> torch.Tensor:  # fmt: skip
    """Cross-entropy over the classes, plus the regressed reward's squared error on ends without the task done."""
    loss = F.cross_entropy(logits[:, : len(CLASSES)], labels)
    ended = labels == CLASSES.index("failure")
    if ended.any():
        loss = loss + reward_weight * F.mse_loss(torch.tanh(logits[ended, REWARD_LOGIT]), rewards[ended])
    return loss


@torch.no_grad()
def outcome_metrics(model, examples: Examples, pad_id: int, batch_size: int = 64) -> dict[str, float]:
    """Share of held-out transitions whose outcome (continue / task done / ended otherwise) the head gets right,
    overall, per task, and for the done flag and success alone."""
    predicted = []
    device = next(model.parameters()).device
    for start in range(0, len(examples.inputs), batch_size):
        logits = model(**pad_batch(examples.inputs[start : start + batch_size], pad_id, device))
        predicted += [CLASSES.index(o.label) for o in outcomes_of(logits)]
    predicted = np.array(predicted)
    gold = examples.labels
    done = lambda labels: labels != CLASSES.index("continue")
    success = lambda labels: labels == CLASSES.index("success")
    metrics = {"outcome_accuracy": float((predicted == gold).mean()),
               "done_accuracy": float((done(predicted) == done(gold)).mean()),
               "success_accuracy": float((success(predicted) == success(gold)).mean())}  # fmt: skip
    tasks = np.array(examples.tasks)
    for task in sorted(set(examples.tasks)):
        metrics[f"{task}/outcome_accuracy"] = float((predicted[tasks == task] == gold[tasks == task]).mean())
    return metrics


def add_outcome_head(world_model: str | os.PathLike, head: str | os.PathLike, out: str | os.PathLike,
                     dtype: torch.dtype = torch.float32) -> Path:  # fmt: skip
    """A copy of the web world model at `out` (its CARD.md left out) with the head, in `dtype`, in out/outcome/."""
    src, out = resolve_checkpoint(world_model), Path(out)
    OutcomeHead(head)  # refuse a head that does not load before copying anything
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(OUTCOME_DIR, "CARD.md"))
    save_outcome_head(head, tmp, dtype)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def train_web_outcome(config: OutcomeConfig) -> Path:
    """Train an outcome head on real transitions; returns RUN_DIR/world_model (the world model with the head)."""
    if config.batch_size < 1 or config.micro_batch < 1 or config.reward_weight < 0:
        raise ValueError(f"--batch-size and --micro-batch must be >= 1 and --reward-weight >= 0, got "
                         f"{config.batch_size}, {config.micro_batch}, {config.reward_weight}")  # fmt: skip
    d = RUN.setup_processes(config.threads)
    run_dir = Path(config.run_dir)
    train, manifests, held_out, _ = load_train_and_eval(config.data, config.eval_data, model_pages=True)
    tokenizer = load_tokenizer(resolve_checkpoint(config.world_model))
    if not config.model:
        init = run_dir / "init"
        if d.is_main and not (init / "config.json").is_file():
            torch.manual_seed(config.seed)
            model = build_outcome_model(tokenizer, config.size, config.reads_typed)
            log.info("outcome head: %.2fM parameters", parameter_count(model) / 1e6)
            model.save_pretrained(init)
            tokenizer.save_pretrained(init)
        RUN.barrier(d)
        config = OutcomeConfig(**{**vars(config), "model": str(init)})
    run = RUN.Run(config, "web outcome", load=lambda path: (OutcomeHead(path).model.train(), load_tokenizer(path)))
    max_tokens = run.model.config.max_position_embeddings
    reads_typed = bool(getattr(run.model.config, "reads_typed", False))
    examples = outcome_examples(train, tokenizer, max_tokens, reads_typed)
    held = outcome_examples(held_out, tokenizer, max_tokens, reads_typed) if held_out else None
    weights = task_balanced_weights(examples.tasks)
    counts = np.bincount(examples.labels, minlength=len(CLASSES))
    log.info("%d training transitions (%s), %d tasks", len(examples.inputs),
             ", ".join(f"{n} {c}" for c, n in zip(CLASSES, counts)), len(set(examples.tasks)))  # fmt: skip

    def evaluate() -> dict[str, float]:
        return outcome_metrics(run.model, held, tokenizer.pad_token_id)

    while run.running():
        started = time.perf_counter()
        generator = RUN.step_generator(config.seed, run.step, d.rank)
        idx = torch.multinomial(weights, config.batch_size, replacement=True, generator=generator).tolist()
        # Sorted by length and padded per micro-batch, as SFT does: pages run from 20 to 768 tokens.
        idx.sort(key=lambda i: len(examples.inputs[i][0]))
        micro = chunks(len(idx), config.micro_batch)
        run.model.train()
        total, right = 0.0, 0.0
        for j, rows in enumerate(micro):
            part = idx[rows]
            sync = run.ddp_model.no_sync() if d.world_size > 1 and j < len(micro) - 1 else nullcontext()
            batch = pad_batch([examples.inputs[i] for i in part], tokenizer.pad_token_id, d.device)
            labels = torch.as_tensor(examples.labels[part], device=d.device)
            rewards = torch.as_tensor(examples.rewards[part], device=d.device)
            with sync:
                logits = run.ddp_model(**batch)
                loss = outcome_loss(logits, labels, rewards, config.reward_weight) * len(part) / len(idx)
                loss.backward()
            total += loss.item()
            right += (logits[:, : len(CLASSES)].argmax(-1) == labels).float().sum().item()
        grad_norm = run.optimizer_step()
        metrics = {"train/loss": total, "train/accuracy": right / len(idx), "train/grad_norm": grad_norm,
                   "time/examples_per_s": len(idx) / (time.perf_counter() - started)}  # fmt: skip
        run.end_step(metrics, evaluate if held is not None else None, postfix=["train/loss", "train/accuracy"])
    final = run.finish()
    if d.is_main:
        write_training_record(final, manifests)
        add_outcome_head(config.world_model, final, run_dir / "world_model")
    RUN.barrier(d)
    return run_dir / "world_model"

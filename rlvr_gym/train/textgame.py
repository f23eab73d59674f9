"""Training recipes of the text-game world model: SFT from scratch (a BPE trained on the data and a small Llama) or
from any local Hugging Face causal LM, then RLVR with the domain's verifiable rewards through the one GRPO trainer.

Examples come from `rlvr_gym.data.textgame` (ByteSized32 and TextWorld transitions, prompts, targets); the
token-length distribution and the number of examples dropped as too long go to the log and RUN_DIR/data_stats.json.

A run directory holds the trainer's files (config.json, log.jsonl, checkpoints/, final/; see rlvr_gym.train.run)
and, from this module, textgame.json (the command's config: --resume with another one is refused),
data_stats.json, and init/ (the trained tokenizer and the untrained model, when training from scratch).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import PreTrainedTokenizerBase

from rlvr_gym.data.bytesized32 import Transition, load_transitions
from rlvr_gym.data.textgame import (
    default_train_data,
    default_valid_data,
    encode_examples,
    encode_prompts,
    load_training_transitions,
    subsample,
    train_tokenizer,
    transition_texts,
)
from rlvr_gym.domains.textgame import (
    CONTENTS_FORMS,
    DEFAULT_BALANCE,
    REWARDS,
    accuracy_table,
    binary_reward,
    outcome_matches,
    wins,
)
from rlvr_gym.files import atomic_write_text
from rlvr_gym.models.lm import LlamaSize, build_llama, load_model, load_tokenizer, parameter_count, resolve_checkpoint
from rlvr_gym.models.sampler import sample_texts
from rlvr_gym.train.grpo import GRPOConfig, train_grpo
from rlvr_gym.train.run import barrier, map_across_ranks, record_config, set_by_command, setup_processes
from rlvr_gym.train.sft import SFTConfig, train_sft

log = logging.getLogger("rlvr_gym")

CONTENTS_KEY = "textgame_contents"
"""The key of a text world model's config.json that records how its targets write contents (`CONTENTS_FORMS`)."""


def contents_form(model_dir: str | os.PathLike) -> str:
    """How the text world model `model_dir` (a directory or a shipped name) writes contents: its config's
    `textgame_contents`, "delta" when there is none (a model not trained on this domain yet takes the form training
    writes by default)."""
    config = resolve_checkpoint(model_dir) / "config.json"
    form = json.loads(config.read_text()).get(CONTENTS_KEY, "delta")
    if form not in CONTENTS_FORMS:
        raise ValueError(f"{config}: {CONTENTS_KEY} must be one of {CONTENTS_FORMS}, got {form!r}")
    return form


# Fields that may differ on --resume; the trainer checks its own (sft, grpo), knowing which of them may change.
RESUMABLE_CHANGES = {"resume", "sft", "grpo", "eval_accuracy_examples", "eval_batch_size"}


# ---------------------------------------------------------------------------------------------------- data


def report_data(run_dir: Path, stats: dict, is_main: bool) -> None:
    p, y = stats["prompt_tokens"], stats["target_tokens"]
    log.info(
        "prompt tokens median %.0f / p90 %.0f / max %d, target tokens median %.0f / p90 %.0f / max %d; "
        "dropped %d over %d prompt or %d target tokens, kept %d (%d changed)",
        p["median"], p["p90"], p["max"], y["median"], y["p90"], y["max"], stats["dropped_too_long"],
        stats["max_prompt_tokens"], stats["max_target_tokens"], stats["kept"], stats["kept_changed"],
    )
    if is_main:
        atomic_write_text(run_dir / "data_stats.json", json.dumps(stats, indent=2))


def check_run(run_dir: Path, config: TextGameSFTConfig | TextGameRLVRConfig, is_main: bool) -> None:
    """Refuse to start over a run with checkpoints without --resume, or to resume one with another config."""
    record_config(run_dir, config, config.resume, is_main, "textgame.json", RESUMABLE_CHANGES)


# ---------------------------------------------------------------------------------------------------- SFT


@dataclass
class TextGameSFTConfig:
    run_dir: str = "runs/textgame/sft"
    """Directory of the run: init/, checkpoints/, logs, final/."""
    data: str = field(default_factory=default_train_data)
    """ByteSized32-format JSONL(.gz) of training transitions (default: the shared ByteSized32 train split)."""
    textworld: str = ""
    """Directory written by `collect textworld` whose transitions are mixed into the training data (empty: none)."""
    textworld_copies: int = 1
    """Copies of each TextWorld transition in the mix: raises TextWorld's share without dropping ByteSized32."""
    eval_data: str = field(default_factory=default_valid_data)
    """Held-out transitions for eval/loss and eval/accuracy (default: the shared valid split; empty: no evaluation)."""
    model: str = ""
    """A local pretrained Hugging Face causal LM (with its tokenizer) to fine-tune unchanged; empty: train `size`
    from scratch with a BPE tokenizer trained on the data."""
    size: LlamaSize = field(
        default_factory=lambda: LlamaSize(hidden_size=256, layers=4, heads=8, intermediate_size=688)
    )
    """Shape of the from-scratch Llama (the default has 3.7M parameters with ByteSized32's 2,047-token vocabulary)."""
    vocab_size: int = 4096
    """Most tokens of the from-scratch BPE, special tokens included; training stops sooner once every pre-tokenized
    word of the data is one token (ByteSized32 train: 2,047)."""
    max_prompt_tokens: int = 1024
    """Examples with longer prompts are dropped (ByteSized32 train at 100:40: median 427, p90 525, max 993 tokens)."""
    max_target_tokens: int = 512
    """Examples with longer targets (eos included) are dropped (ByteSized32 train at 100:40: median 69, p90 127,
    max 335 tokens)."""
    balance: tuple[int, int] | None = (100, 40)
    """Resample to this changed:unchanged ratio, keeping all of the scarcer kind (None: the data's own mix)."""
    win_share: float = 0.0
    """Least share of the examples from steps that win a game, the winning ones repeated to reach it: wins are about 4%
    of the balanced mix, and they are what a learned env pays on (0: the data's own mix)."""
    contents: Literal["", "delta", "whole"] = ""
    """How the targets write an object's changed contents: delta, what it gains and loses (`+`/`-`); whole, its new
    list (`c`, what the shipped checkpoints write); empty: the form `model` writes (`contents_form`), delta from
    scratch. A short fine-tune does not teach a model the other form: refits keep the one they start from."""
    eval_accuracy_examples: int = 64
    """Held-out transitions decoded greedily for eval/accuracy at each evaluation (0: loss only)."""
    eval_batch_size: int = 16
    """Prompts decoded together during evaluation."""
    seed: int = 0
    """Seed of the balancing sample, the model initialisation and the evaluation sample."""
    resume: bool = False
    """Continue from the newest checkpoint in run_dir."""
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(
            steps=2000, lr=1e-3, warmup_steps=50, batch_size=16, micro_batch=8, save_every=100, eval_examples=128
        )
    )
    """The trainer's settings (its run_dir, model and resume are set from the fields above)."""


def run_textgame_sft(config: TextGameSFTConfig) -> Path:
    """Train a text world model by SFT on (state, action) -> diff; returns the final model's directory."""
    root = Path(config.run_dir)
    d = setup_processes(config.sft.threads)
    check_run(root, config, d.is_main)
    train = load_training_transitions(config.data, config.textworld, config.balance, config.seed, config.textworld_copies)
    train = weight_wins(train, config.win_share)
    contents = config.contents or (contents_form(config.model) if config.model else "delta")  # make_diff checks it
    model_dir = Path(config.model) if config.model else root / "init"
    if not config.model:
        if d.is_main and not (config.resume and (model_dir / "tokenizer.json").is_file()):
            tokenizer = train_tokenizer(transition_texts(train, contents), config.vocab_size)
            torch.manual_seed(config.seed)
            model = build_llama(len(tokenizer), config.size, tokenizer)
            log.info("from-scratch Llama: %.2fM parameters, vocabulary %d", parameter_count(model) / 1e6,
                     len(tokenizer))
            model.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
        barrier(d)
    tokenizer = load_tokenizer(model_dir)
    examples, stats = encode_examples(train, tokenizer, config.max_prompt_tokens, config.max_target_tokens, contents)
    report_data(root, {**stats, "contents": contents}, d.is_main)
    held_out, eval_fn = held_out_evaluation(
        config.eval_data, tokenizer, config, config.sft.eval_examples, config.max_target_tokens, contents
    )
    sft = set_by_command(config.sft, "sft", run_dir=str(root), model=str(model_dir), resume=config.resume)
    return train_sft(sft, examples, held_out, eval_fn, model_config={CONTENTS_KEY: contents})


def held_out_evaluation(
    path: str,
    tokenizer: PreTrainedTokenizerBase,
    config: TextGameSFTConfig | TextGameRLVRConfig,
    loss_examples: int,
    max_new_tokens: int,
    contents: str = "delta",
) -> tuple[list[dict], Callable[[torch.nn.Module], dict[str, float]] | None]:
    """Held-out examples for eval/loss and the greedy accuracy function for eval/, from a seeded sample of `path`."""
    if not path:
        return [], None
    transitions = subsample(load_transitions(path), max(loss_examples, config.eval_accuracy_examples), config.seed)
    held_out = []
    if loss_examples:
        held_out, _ = encode_examples(transitions[:loss_examples], tokenizer, config.max_prompt_tokens, max_new_tokens,
                                      contents)
    decoded = transitions[: config.eval_accuracy_examples]
    if not decoded:
        return held_out, None

    def eval_fn(model: torch.nn.Module) -> dict[str, float]:
        completions = sample_texts(model, tokenizer, encode_prompts(tokenizer, decoded), config.eval_batch_size,
                                   max_new_tokens)
        return accuracy_table([texts[0] for texts in completions], decoded)

    return held_out, eval_fn


# ---------------------------------------------------------------------------------------------------- RLVR


@dataclass
class TextGameRLVRConfig:
    run_dir: str = "runs/textgame/rlvr"
    """Directory of the run: checkpoints/, logs, final/."""
    model: str = "runs/textgame/sft/final"
    """The model to improve: the SFT run's final/ (or any checkpoint directory with its tokenizer)."""
    reward: Literal["binary", "task"] = "binary"
    """binary: exact match of the rebuilt next state; task: 0.09 property + 0.01 score + 0.2 exact
    + changed-property accuracy."""
    data: str = field(default_factory=default_train_data)
    """ByteSized32-format JSONL(.gz) of training transitions (default: the shared ByteSized32 train split)."""
    textworld: str = ""
    """Directory written by `collect textworld` whose transitions are mixed into the training data (empty: none)."""
    textworld_copies: int = 1
    """Copies of each TextWorld transition in the mix: raises TextWorld's share without dropping ByteSized32."""
    eval_data: str = field(default_factory=default_valid_data)
    """Held-out transitions for eval/accuracy (empty: no evaluation)."""
    balance: tuple[int, int] | None = None
    """changed:unchanged ratio of the prompts; None: the paper's, 100:40 for the binary reward and 100:5 for task."""
    win_share: float = 0.0
    """Least share of the prompts from steps that win a game, the winning ones repeated to reach it: wins are about 4%
    of the balanced mix, and they are what a learned env pays on (0: the data's own mix)."""
    max_prompt_tokens: int = 1024
    """Prompts longer than this are dropped; so are transitions whose gold target exceeds grpo.max_new_tokens."""
    eval_accuracy_examples: int = 64
    """Held-out transitions decoded greedily for eval/accuracy (0: none)."""
    eval_batch_size: int = 16
    """Prompts decoded together during evaluation."""
    seed: int = 0
    """Seed of the balancing sample and of the evaluation sample."""
    surprise_prompts: float = 0.0
    """Fraction of the prompts from transitions whose next state the starting model gets wrong (greedy, exact
    match), repeated until they make it: RLVR weighted toward the steps where the simulator and the real game
    disagree (the co-training loop's refits). 0 keeps the data's own mix."""
    surprise_on: Literal["state", "outcome"] = "state"
    """What makes a transition surprising: state, any error in the predicted next state; outcome, an error in its
    score, gameOver or gameWon (a false or a missed win: what a simulator pays on), the state's errors standing in
    when the model gets every outcome right."""
    resume: bool = False
    """Continue from the newest checkpoint in run_dir."""
    grpo: GRPOConfig = field(
        default_factory=lambda: GRPOConfig(
            steps=200, lr=1e-5, prompts_per_step=8, group_size=8, max_new_tokens=256, temperature=0.7, beta=1e-3,
            micro_batch=16, save_every=20, eval_every=50,
        )
    )
    """The trainer's settings (its run_dir, model and resume are set from the fields above). Rollouts at 0.7: at 1.0
    10-15% of the small model's samples did not parse, and RLVR gained less (+2% against +6% on changed transitions)."""


def weight_toward(transitions: list, flags: list[bool], fraction: float) -> list:
    """The transitions with the flagged ones repeated until they make at least `fraction` of the list (unchanged
    when none or all are flagged)."""
    flagged = [t for t, f in zip(transitions, flags) if f]
    others = [t for t, f in zip(transitions, flags) if not f]
    if not flagged or not others or len(flagged) >= fraction * len(transitions):
        return list(transitions)
    copies = math.ceil(fraction * len(others) / ((1 - fraction) * len(flagged)))
    return flagged * copies + others


def weight_wins(transitions: list[Transition], share: float) -> list[Transition]:
    """The transitions with the winning steps repeated until they make at least `share` of them."""
    if not 0 <= share < 1:
        raise ValueError(f"--win-share is a fraction in [0, 1), got {share}")
    if share == 0:
        return transitions
    flags = [wins(t.current, t.next) for t in transitions]
    log.info("%d of %d transitions win a game, repeated to at least %g of them", sum(flags), len(flags), share)
    return weight_toward(transitions, flags, share)


def run_textgame_rlvr(config: TextGameRLVRConfig) -> Path:
    """Improve a text world model with GRPO on the binary or task reward; returns the final model's directory."""
    if config.reward not in REWARDS:
        raise ValueError(f"unknown reward {config.reward!r}: use binary or task")
    if not 0 <= config.surprise_prompts < 1:
        raise ValueError(f"--surprise-prompts is a fraction in [0, 1), got {config.surprise_prompts}")
    if config.surprise_on not in ("state", "outcome"):
        raise ValueError(f"--surprise-on is state or outcome, got {config.surprise_on!r}")
    root = Path(config.run_dir)
    d = setup_processes(config.grpo.threads)
    check_run(root, config, d.is_main)
    tokenizer = load_tokenizer(config.model)
    ratio = config.balance or DEFAULT_BALANCE[config.reward]
    train = load_training_transitions(config.data, config.textworld, ratio, config.seed, config.textworld_copies)
    train = weight_wins(train, config.win_share)
    if config.surprise_prompts > 0:
        model, _ = load_model(config.model)
        # Prompts too long to train on are dropped below anyway: not worth predicting.
        train = [t for t, p in zip(train, encode_prompts(tokenizer, train)) if len(p) <= config.max_prompt_tokens]

        def errors(part: list[Transition]) -> list[tuple[bool, bool]]:
            """(state wrong, outcome wrong) of the starting model's greedy prediction of each transition."""
            if not part:  # fewer transitions than ranks
                return []
            completions = [c[0] for c in sample_texts(model.eval(), tokenizer, encode_prompts(tokenizer, part),
                                                      config.eval_batch_size, config.grpo.max_new_tokens)]
            scores = binary_reward(completions, [t.current for t in part], [t.next for t in part])
            return [(r["score"] < 1, not outcome_matches(c, t.current, t.next))
                    for r, c, t in zip(scores, completions, part)]

        # Each rank decodes its share; every rank weights the whole list the same way.
        results = map_across_ranks(d, train, errors)
        wrong, outcome_wrong = [state for state, _ in results], [outcome for _, outcome in results]
        log.info("the starting model gets %d of %d training transitions wrong", sum(wrong), len(train))
        if config.surprise_on == "outcome":
            log.info("%d of them wrong about the outcome", sum(outcome_wrong))
            wrong = outcome_wrong if any(outcome_wrong) else wrong
        train = weight_toward(train, wrong, config.surprise_prompts)
    examples, stats = encode_examples(train, tokenizer, config.max_prompt_tokens, config.grpo.max_new_tokens,
                                      contents_form(config.model))
    report_data(root, stats, d.is_main)
    # The trainer hands every column but prompt_ids to the reward: keep the two states it reads.
    examples = [{"prompt_ids": e["prompt_ids"], "current": e["current"], "next": e["next"]} for e in examples]
    _, eval_fn = held_out_evaluation(config.eval_data, tokenizer, config, 0, config.grpo.max_new_tokens)
    grpo = set_by_command(config.grpo, "grpo", run_dir=str(root), model=config.model, resume=config.resume)
    return train_grpo(grpo, REWARDS[config.reward], examples, eval_fn)

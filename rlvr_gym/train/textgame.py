"""Text-game world models: a byte-level BPE tokenizer trained on the data, SFT from scratch (or from any local Hugging
Face causal LM), then RLVR with the domain's verifiable rewards through the one GRPO trainer; and a collector that
writes real TextWorld transitions in the ByteSized32 format, so that one model trains on both sources.

An example is one transition: prompt = `format_prompt(current state, action, task)` after the bos token, target =
`format_target(make_diff(current, next))` and the eos token. Prompts and targets are never truncated (a cut JSON
state or diff teaches nothing true): examples longer than `max_prompt_tokens` / `max_target_tokens` are dropped,
and the token-length distribution and the number dropped go to the log and to RUN_DIR/data_stats.json.

A run directory holds the trainer's files (config.json, log.jsonl, checkpoints/, final/; see rlvr_gym.train.run)
and, from this module, textgame.json (the command's config: --resume with another one is refused),
data_stats.json, and init/ (the trained tokenizer and the untrained model, when training from scratch).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlvr_gym.data.bytesized32 import Transition, data_dir, load_transitions
from rlvr_gym.domains.textgame import (
    balance,
    binary_reward,
    format_prompt,
    format_target,
    is_changed,
    make_diff,
    task_reward,
)
from rlvr_gym.evaluation.textgame import accuracy, encode_prompts, load_tokenizer, subsample
from rlvr_gym.models.lm import LlamaSize, build_llama, parameter_count
from rlvr_gym.train.grpo import GRPOConfig, train_grpo
from rlvr_gym.train.run import atomic_write_text, barrier, record_config, set_by_command, setup_processes
from rlvr_gym.train.sft import SFTConfig, train_sft

if TYPE_CHECKING:
    from envs.textworld import Transition as TextWorldTransition

log = logging.getLogger("rlvr_gym")

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
TEXTWORLD_FILE = "transitions.jsonl.gz"
# Fields that may differ on --resume; the trainer checks its own (sft, grpo), knowing which of them may change.
RESUMABLE_CHANGES = {"resume", "sft", "grpo", "eval_accuracy_examples", "eval_batch_size"}


# ---------------------------------------------------------------------------------------------------- tokens


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on the texts, with <pad>, <s> (bos) and </s> (eos); any text encodes, none is unknown."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer)
    pad, bos, eos = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=pad, bos_token=bos, eos_token=eos, clean_up_tokenization_spaces=False
    )


def target_text(t: Transition) -> str:
    """The gold diff of a transition, as the model writes it."""
    return format_target(make_diff(t.current, t.next))


def transition_texts(transitions: Sequence[Transition]) -> Iterable[str]:
    for t in transitions:
        yield format_prompt(t.current, t.action, t.task)
        yield target_text(t)


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    if not lengths:
        return {"n": 0}
    a = np.asarray(lengths)
    return {"n": len(a), "mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": int(a.max())}


def encode_examples(
    transitions: Sequence[Transition],
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_tokens: int,
    max_target_tokens: int,
) -> tuple[list[dict], dict]:
    """Trainer examples (`prompt_ids`, `target_ids` ending in eos, and the `current` / `next` states the rewards
    read), dropping those over the limits; and the length distribution before dropping."""
    prompts = encode_prompts(tokenizer, transitions)
    target_ids = tokenizer([target_text(t) for t in transitions], add_special_tokens=False)["input_ids"]
    targets = [ids + [tokenizer.eos_token_id] for ids in target_ids]
    examples, too_long = [], 0
    for t, p, y in zip(transitions, prompts, targets):
        if len(p) > max_prompt_tokens or len(y) > max_target_tokens:
            too_long += 1
            continue
        examples.append({"prompt_ids": p, "target_ids": y, "current": t.current, "next": t.next})
    stats = {
        "prompt_tokens": length_stats([len(p) for p in prompts]),
        "target_tokens": length_stats([len(y) for y in targets]),
        "max_prompt_tokens": max_prompt_tokens,
        "max_target_tokens": max_target_tokens,
        "dropped_too_long": too_long,
        "kept": len(examples),
        "kept_changed": sum(is_changed(e["current"], e["next"]) for e in examples),
    }
    return examples, stats


# ---------------------------------------------------------------------------------------------------- data


def default_train_data() -> str:
    return str(data_dir() / "train.jsonl.gz")


def default_valid_data() -> str:
    return str(data_dir() / "valid.jsonl.gz")


def textworld_file(directory: str | os.PathLike) -> Path:
    path = Path(directory) / TEXTWORLD_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{directory} holds no {TEXTWORLD_FILE}: write one with `rlvr-gym collect textworld --out {directory}`"
        )
    return path


def load_training_transitions(
    data: str, textworld: str, ratio: tuple[int, int] | None, seed: int, textworld_copies: int = 1
) -> list[Transition]:
    """The training file, plus `textworld_copies` copies of the TextWorld transitions of a collector directory,
    balanced changed:unchanged."""
    if textworld_copies < 1:
        raise ValueError(f"textworld_copies must be >= 1 (copies of each TextWorld transition), got {textworld_copies}")
    transitions = load_transitions(data)
    if textworld:
        extra = load_transitions(textworld_file(textworld))
        log.info("mixing %d x %d TextWorld transitions from %s into %d from %s", textworld_copies, len(extra), textworld,
                 len(transitions), data)
        transitions += extra * textworld_copies
    if ratio is not None:
        transitions = balance(transitions, *ratio, seed=seed)
    if not transitions:
        raise ValueError(f"no training transitions left from {data} after balancing {ratio}")
    return transitions


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
    model_dir = Path(config.model) if config.model else root / "init"
    if not config.model:
        if d.is_main and not (config.resume and (model_dir / "tokenizer.json").is_file()):
            tokenizer = train_tokenizer(transition_texts(train), config.vocab_size)
            torch.manual_seed(config.seed)
            model = build_llama(len(tokenizer), config.size, tokenizer)
            log.info("from-scratch Llama: %.2fM parameters, vocabulary %d", parameter_count(model) / 1e6,
                     len(tokenizer))
            model.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
        barrier(d)
    tokenizer = load_tokenizer(model_dir)
    examples, stats = encode_examples(train, tokenizer, config.max_prompt_tokens, config.max_target_tokens)
    report_data(root, stats, d.is_main)
    held_out, eval_fn = held_out_evaluation(
        config.eval_data, tokenizer, config, config.sft.eval_examples, config.max_target_tokens
    )
    sft = set_by_command(config.sft, "sft", run_dir=str(root), model=str(model_dir), resume=config.resume)
    return train_sft(sft, examples, held_out, eval_fn)


def held_out_evaluation(
    path: str,
    tokenizer: PreTrainedTokenizerBase,
    config: TextGameSFTConfig | TextGameRLVRConfig,
    loss_examples: int,
    max_new_tokens: int,
) -> tuple[list[dict], Callable[[torch.nn.Module], dict[str, float]] | None]:
    """Held-out examples for eval/loss and the greedy accuracy function for eval/, from a seeded sample of `path`."""
    if not path:
        return [], None
    transitions = subsample(load_transitions(path), max(loss_examples, config.eval_accuracy_examples), config.seed)
    held_out = []
    if loss_examples:
        held_out, _ = encode_examples(transitions[:loss_examples], tokenizer, config.max_prompt_tokens, max_new_tokens)
    decoded = transitions[: config.eval_accuracy_examples]
    if not decoded:
        return held_out, None

    def eval_fn(model: torch.nn.Module) -> dict[str, float]:
        return accuracy(model, tokenizer, decoded, config.eval_batch_size, max_new_tokens)

    return held_out, eval_fn


# ---------------------------------------------------------------------------------------------------- RLVR


REWARDS = {"binary": binary_reward, "task": task_reward}
DEFAULT_BALANCE = {"binary": (100, 40), "task": (100, 5)}


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
    max_prompt_tokens: int = 1024
    """Prompts longer than this are dropped; so are transitions whose gold target exceeds grpo.max_new_tokens."""
    eval_accuracy_examples: int = 64
    """Held-out transitions decoded greedily for eval/accuracy (0: none)."""
    eval_batch_size: int = 16
    """Prompts decoded together during evaluation."""
    seed: int = 0
    """Seed of the balancing sample and of the evaluation sample."""
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


def run_textgame_rlvr(config: TextGameRLVRConfig) -> Path:
    """Improve a text world model with GRPO on the binary or task reward; returns the final model's directory."""
    if config.reward not in REWARDS:
        raise ValueError(f"unknown reward {config.reward!r}: use binary or task")
    root = Path(config.run_dir)
    d = setup_processes(config.grpo.threads)
    check_run(root, config, d.is_main)
    tokenizer = load_tokenizer(config.model)
    ratio = config.balance or DEFAULT_BALANCE[config.reward]
    train = load_training_transitions(config.data, config.textworld, ratio, config.seed, config.textworld_copies)
    examples, stats = encode_examples(train, tokenizer, config.max_prompt_tokens, config.grpo.max_new_tokens)
    report_data(root, stats, d.is_main)
    # The trainer hands every column but prompt_ids to the reward: keep the two states it reads.
    examples = [{"prompt_ids": e["prompt_ids"], "current": e["current"], "next": e["next"]} for e in examples]
    _, eval_fn = held_out_evaluation(config.eval_data, tokenizer, config, 0, config.grpo.max_new_tokens)
    grpo = set_by_command(config.grpo, "grpo", run_dir=str(root), model=config.model, resume=config.resume)
    return train_grpo(grpo, REWARDS[config.reward], examples, eval_fn)


# ---------------------------------------------------------------------------------------------------- TextWorld


@dataclass
class TextWorldCollectConfig:
    out: str = "runs/textworld/train"
    """Output directory: transitions.jsonl.gz, manifest.json, and the compiled games under games/."""
    games: int = 20
    """Games to generate, with seeds seed, seed+1, ...; held-out games need a range of seeds no training set used."""
    seed: int = 0
    """First game seed (also seeds the policies)."""
    nb_rooms: int = 3
    """Rooms per game."""
    nb_objects: int = 5
    """Objects per game (rooms, doors and the player not counted)."""
    quest_length: int = 3
    """Commands in each game's winning walkthrough."""
    episodes: int = 2
    """Episodes per game of the noisy walkthrough and of the random policy each (the walkthrough is played once)."""
    noise: float = 0.3
    """Probability that the noisy walkthrough takes a random admissible command."""
    max_steps: int = 30
    """Steps per episode at most."""


def collect_textworld(
    games: int,
    seed: int,
    out: str | os.PathLike,
    nb_rooms: int = 3,
    nb_objects: int = 5,
    quest_length: int = 3,
    episodes: int = 2,
    noise: float = 0.3,
    max_steps: int = 30,
) -> Path:
    """Generate `games` TextWorld games (seeds seed ... seed+games-1), play each with the walkthrough, a noisy
    walkthrough and a random policy in the real engine, and write the distinct transitions as ByteSized32 records
    to OUT/transitions.jsonl.gz (what `load_transitions` reads), with OUT/manifest.json; returns the JSONL path.

    A game whose entities share a name cannot be converted to the object schema and is skipped (listed in the manifest).
    """
    from envs.textworld import game_name, make_game, noisy_walkthrough, play_episode, random_policy, walkthrough
    from textworld import Game

    if games < 1 or episodes < 0 or max_steps < 1:
        raise ValueError(
            "collect_textworld needs games >= 1, episodes >= 0 and max_steps >= 1, "
            f"got games={games}, episodes={episodes}, max_steps={max_steps}"
        )
    out = Path(out)
    game_dir = out / "games"
    records, skipped = [], []
    for game_seed in range(seed, seed + games):
        path = make_game(game_seed, game_dir, nb_rooms, nb_objects, quest_length)
        name = game_name(game_seed, nb_rooms, nb_objects, quest_length)
        task = Game.load(str(path.with_suffix(".json"))).objective
        plays = [walkthrough] + [noisy_walkthrough(noise)] * episodes + [random_policy] * episodes
        seen: set[str] = set()
        game_records = []
        try:
            for k, policy in enumerate(plays):
                previous = ""
                for t in play_episode(path, policy, game_seed * 10_000 + k, max_steps):
                    key = json.dumps([t.state, t.command], sort_keys=True)
                    if key not in seen:
                        seen.add(key)
                        game_records.append(textworld_record(name, len(game_records), task, previous, t))
                    previous = t.command
        except ValueError as error:
            log.warning("skipping TextWorld game %s: %s", name, error)
            skipped.append(game_seed)
            continue
        records += game_records
    out.mkdir(parents=True, exist_ok=True)
    target = out / TEXTWORLD_FILE
    tmp = out / f".{TEXTWORLD_FILE}.tmp"
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(tmp, target)
    manifest = {
        "seeds": [s for s in range(seed, seed + games) if s not in skipped],
        "skipped_seeds": skipped,
        "generation": {"nb_rooms": nb_rooms, "nb_objects": nb_objects, "quest_length": quest_length},
        "episodes": {"walkthrough": 1, "noisy_walkthrough": episodes, "random": episodes},
        "noise": noise,
        "max_steps": max_steps,
        "transitions": len(records),
    }
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2))
    log.info("wrote %d TextWorld transitions from %d games to %s", len(records), games - len(skipped), target)
    return target


def textworld_record(game: str, state_id: int, task: str, previous_command: str, t: TextWorldTransition) -> dict:
    """A ByteSized32 record of one TextWorld step (no world tick in TextWorld: action and tick states agree)."""

    def game_state(state: dict, last_action: str) -> dict:
        return {
            "observation": "", "look": "", "inventory": "", "taskDesc": task, "lastAction": last_action,
            "objects": state["objects"], "max_UUID": 1 + max((o["uuid"] for o in state["objects"]), default=-1),
        }

    def score_state(state: dict) -> dict:
        return {"score": state["score"], "gameOver": state["gameOver"], "gameWon": state["gameWon"]}

    after = game_state(t.next_state, t.command)
    return {
        "game": game,
        "state_id": state_id,
        "current_state": game_state(t.state, previous_command),
        "action_state": after,
        "tick_state": after,
        "current_score_state": score_state(t.state),
        "next_score_state": score_state(t.next_state),
    }


def run_collect_textworld(config: TextWorldCollectConfig) -> Path:
    """CLI entry of `collect_textworld`."""
    return collect_textworld(
        config.games, config.seed, config.out, config.nb_rooms, config.nb_objects, config.quest_length,
        config.episodes, config.noise, config.max_steps,
    )

"""Text-game datasets: ByteSized32 and TextWorld transitions, the tokenizer trained on them, and the prompts and
targets a text world model reads and writes; also the collector that plays real TextWorld games into the same format.

An example is one transition: prompt = `format_prompt(current state, action, task)` after the bos token, target =
`format_target(make_diff(current, next, contents))` and the eos token, `contents` the form the model writes
(`rlvr_gym.train.textgame.contents_form`). Prompts and targets are never truncated (a cut JSON
state or diff teaches nothing true): examples longer than the limits are dropped and counted.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlvr_gym.data.bytesized32 import Transition, data_dir, load_transitions
from rlvr_gym.domains.textgame import balance, format_prompt, format_target, is_changed, make_diff
from rlvr_gym.files import atomic_write_jsonl_gz, atomic_write_text

if TYPE_CHECKING:
    from envs.textworld import Transition as TextWorldTransition

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
TEXTWORLD_FILE = "transitions.jsonl.gz"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096,
                    pre_tokenizer: pre_tokenizers.PreTokenizer | None = None) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on the texts, with <pad>, <s> (bos) and </s> (eos); any text encodes, none is unknown.
    `pre_tokenizer` replaces GPT-2's byte-level split (it must end in a byte-level step)."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
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


def target_text(t: Transition, contents: str = "delta") -> str:
    """The gold diff of a transition, as a model that writes contents in form `contents` writes it."""
    return format_target(make_diff(t.current, t.next, contents))


def transition_texts(transitions: Sequence[Transition], contents: str = "delta") -> Iterable[str]:
    for t in transitions:
        yield format_prompt(t.current, t.action, t.task)
        yield target_text(t, contents)


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
    contents: str = "delta",
) -> tuple[list[dict], dict]:
    """Trainer examples (`prompt_ids`, `target_ids` ending in eos, and the `current` / `next` states the rewards
    read), dropping those over the limits; and the length distribution before dropping. `contents`: the form the
    targets write contents in."""
    prompts = encode_prompts(tokenizer, transitions)
    target_ids = tokenizer([target_text(t, contents) for t in transitions], add_special_tokens=False)["input_ids"]
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
    from textworld import Game

    from envs.textworld import game_name, make_game, noisy_walkthrough, play_episode, random_policy, walkthrough

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
    target = write_transitions(records, out)
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


def write_transitions(records: Sequence[dict], out: str | os.PathLike) -> Path:
    """ByteSized32 records to OUT/transitions.jsonl.gz (what `textworld_file` finds), written atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / TEXTWORLD_FILE
    atomic_write_jsonl_gz(target, records)
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


def encode_prompts(tokenizer: PreTrainedTokenizerBase, transitions: Sequence[Transition]) -> list[list[int]]:
    """Token ids of each transition's prompt (task, current state, action), after the bos token when there is one."""
    return encode_texts(tokenizer, [format_prompt(t.current, t.action, t.task) for t in transitions])


def encode_texts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of prompt texts (`format_prompt`), after the bos token when there is one."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [bos + ids for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def subsample(transitions: Sequence[Transition], limit: int, seed: int) -> list[Transition]:
    """A seeded random `limit` of the transitions in file order (all when limit is 0): files are sorted by game."""
    if limit <= 0 or limit >= len(transitions):
        return list(transitions)
    keep = sorted(random.Random(seed).sample(range(len(transitions)), limit))
    return [transitions[i] for i in keep]

"""Training data for TRL and verl: the prompts the in-house trainer uses, with what the rewards need.

- TRL: a Hugging Face dataset (`save_to_disk`) with a `prompt` text column and the reward's columns: `current` and
  `next` as JSON strings (text game), `tree_before`, `tree_after`, `reward`, `done` (web), or `checkpoint`,
  `context_frame`, `next_frame`, `before_frame`, `last_frame` (rt1, frames as PNG bytes; the last two are frames t-1
  and t, with `action` t, for a motion refiner) with `prompt_ids`, `next_ids`, `episode`, `t`. Load it
  with `datasets.load_from_disk` and score with `rlvr_gym.integrations.trl`.
- verl: one parquet file with verl's columns: `data_source` ("rlvr_gym/textgame", "rlvr_gym/web" or
  "rlvr_gym/rt1"), `prompt` as chat messages `[{"role": "user", "content": <prompt>}]`, `ability`, `reward_model`
  `{"style": "rule", "ground_truth": <JSON string>}` and `extra_info` `{"split", "index"}` (rt1: also `episode`,
  `t`); score with `rlvr_gym.integrations.verl.compute_score`.

The prompt text is the domain's `format_prompt`, exactly what `train textgame-rlvr` / `train web-rlvr` tokenize
(they prepend the tokenizer's bos token; TRL and verl add special tokens as the model's tokenizer does). The text
game's transitions are balanced changed:unchanged as `train textgame-rlvr` balances them. Prompts are not filtered
by token length here (the token count depends on the model): set the trainer's maximum prompt length instead.

rt1 prompts are `train rt1-rlvr --horizon 1`'s: the world model's token ids (context frames' codes, success flags,
action bins) written as token names (`verl.rt1_token_text`, e.g. `<bos><f17>...<running><a200>...`), which
`verl.rt1_tokenizer` maps back to the same ids; the completion is the next frame's 64 codes and its flag (`next_ids`
is the real one, encoded by the checkpoint's frame tokenizer). Multi-step rollouts splice real actions between
generated frames, which neither TRL nor verl can force during generation, so only single-step prompts are exported.

    rlvr-gym export --domain textgame --format verl --out runs/export/textgame-train.parquet
    rlvr-gym export --domain rt1 --format trl --data runs/rt1/train --checkpoint rt1-rlvr
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlvr_gym.data import video_tokens as V
from rlvr_gym.domains import textgame, web
from rlvr_gym.integrations.verl import RT1, TEXTGAME, WEB, encode_frame, rt1_token_text, rt1_world

MISSING_EXTRA = "export needs `datasets` and `pyarrow`: install the bench extra with  pip install -e '.[bench]'"
DEFAULT_DATA = {"web": "runs/web/train", "rt1": "runs/rt1/train"}  # the text game's: the ByteSized32 train split
ABILITY = {"textgame": "world_model/textgame", "web": "world_model/web", "rt1": "world_model/rt1"}


@dataclass
class ExportConfig:
    domain: Literal["textgame", "web", "rt1"] = "textgame"
    """Which world model's data: text game (ByteSized32 transitions), web (MiniWoB++ transitions) or rt1 (robot
    episodes, one prompt per step)."""
    format: Literal["trl", "verl"] = "trl"
    """trl: a Hugging Face dataset directory (save_to_disk); verl: a parquet file."""
    out: str = ""
    """Output path: a directory for trl, a .parquet file for verl; empty: runs/export/DOMAIN-FORMAT (.parquet for
    verl)."""
    data: str = ""
    """Transitions to export; empty: the domain's training data (text game: the shared ByteSized32 train split;
    web: runs/web/train, written by `collect web`; rt1: runs/rt1/train, written by `collect rt1`)."""
    limit: int = 0
    """Export at most this many transitions (0: all)."""
    reward: Literal["binary", "task"] = "binary"
    """Text game: the reward the verl ground truth names, and the one whose changed:unchanged ratio is used."""
    balance: bool = True
    """Text game: resample to the paper's changed:unchanged ratio for the reward (100:40 binary, 100:5 task), as
    `train textgame-rlvr` does; off for evaluation data."""
    split: str = "train"
    """The split written into verl's extra_info (verl reads train and val files separately)."""
    seed: int = 0
    """Seed of the balancing sample."""
    checkpoint: str = "rt1-rlvr"
    """rt1: the world model (shipped name or directory) whose frame tokenizer encodes the prompts and, named in
    every row, decodes the completions for the reward."""


def export(config: ExportConfig) -> Path:
    """Write the dataset config.format describes; returns its path."""
    if config.limit < 0:
        raise ValueError(f"limit must be >= 0 (0: all), got {config.limit}")
    if config.format not in ("trl", "verl"):
        raise ValueError(f"unknown format {config.format!r}: use trl or verl")
    out = Path(config.out or default_out(config))
    if config.format == "verl" and out.suffix != ".parquet":
        raise ValueError(f"verl reads parquet: give --out a .parquet path, got {out}")
    rows = {"textgame": textgame_rows, "web": web_rows, "rt1": rt1_rows}[config.domain](config)
    if config.limit:
        rows = rows[: config.limit]
    if not rows:
        raise ValueError(f"no transitions to export from {config.data or 'the default data'}")
    return write_trl(rows, out) if config.format == "trl" else write_verl(verl_rows(rows, config), out)


def default_out(config: ExportConfig) -> str:
    return f"runs/export/{config.domain}-{config.format}" + (".parquet" if config.format == "verl" else "")


def textgame_rows(config: ExportConfig) -> list[dict]:
    """One row per transition: `prompt`, and `current` / `next` as JSON strings."""
    from rlvr_gym.data.textgame import default_train_data, load_training_transitions
    from rlvr_gym.domains.textgame import DEFAULT_BALANCE

    ratio = DEFAULT_BALANCE[config.reward] if config.balance else None
    transitions = load_training_transitions(config.data or default_train_data(), "", ratio, config.seed)
    return [
        {"prompt": textgame.format_prompt(t.current, t.action, t.task), "current": json.dumps(t.current), "next": json.dumps(t.next)}
        for t in transitions
    ]


def web_rows(config: ExportConfig) -> list[dict]:
    """One row per transition: `prompt`, `tree_before`, `tree_after`, `reward`, `done`."""
    from rlvr_gym.data.web import load_web_data

    records, _ = load_web_data(config.data or DEFAULT_DATA["web"])
    return [
        {"prompt": web.format_prompt(r["utterance"], r["tree_before"], r["action"]), "tree_before": r["tree_before"],
         "tree_after": r["tree_after"], "reward": float(r["reward"]), "done": bool(r["done"])}
        for r in records
    ]  # fmt: skip


def rt1_rows(config: ExportConfig) -> list[dict]:
    """One row per step of every episode: the world model's prompt and the real next frame (see the module doc)."""
    from rlvr_gym.data.episodes import read_episodes
    from rlvr_gym.data.robot import episode_codes, frame_flags, rlvr_examples

    world = rt1_world(config.checkpoint)
    # A directory is written absolute, so the reward finds it from the trainer's working directory too.
    checkpoint = str(Path(config.checkpoint).resolve()) if Path(config.checkpoint).is_dir() else config.checkpoint
    rows = []
    for index, episode in enumerate(read_episodes(config.data or DEFAULT_DATA["rt1"])):
        codes, flags = episode_codes(world.frame_tokenizer, episode), frame_flags(episode)
        context = encode_frame(episode.frames[0])
        for example in rlvr_examples(world, [episode], horizon=1, codes_per_episode=[codes]):
            t = example["t"]
            rows.append({
                "prompt": rt1_token_text(example["prompt_ids"]), "prompt_ids": example["prompt_ids"],
                "next_ids": V.step_tokens(codes[t + 1], flags[t + 1]), "checkpoint": checkpoint,
                "context_frame": context, "next_frame": encode_frame(episode.frames[t + 1]), "episode": index, "t": t,
                # what a motion refiner reads: frames t - 1 (t at the start) and t, and action t
                "before_frame": encode_frame(episode.frames[max(t - 1, 0)]), "last_frame": encode_frame(episode.frames[t]),
                "action": [float(a) for a in episode.actions[t]],
            })  # fmt: skip
        if config.limit and len(rows) >= config.limit:
            break
    return rows


def write_trl(rows: list[dict], out: Path) -> Path:
    try:
        from datasets import Dataset
    except ImportError:
        raise ImportError(MISSING_EXTRA) from None
    Dataset.from_list(rows).save_to_disk(str(out))
    return out


def verl_rows(rows: list[dict], config: ExportConfig) -> list[dict]:
    """verl's RL dataset schema; the ground truth holds what `compute_score` needs."""
    source = {"textgame": TEXTGAME, "web": WEB, "rt1": RT1}[config.domain]
    out = []
    for i, row in enumerate(rows):
        extra = {"split": config.split, "index": i}
        if config.domain == "textgame":
            gold = {"current": json.loads(row["current"]), "next": json.loads(row["next"]), "metric": config.reward}
        elif config.domain == "web":
            gold = {k: row[k] for k in ("tree_before", "tree_after", "reward", "done")}
        else:
            gold = {"checkpoint": row["checkpoint"], "next_ids": row["next_ids"],
                    **{k: base64.b64encode(row[k]).decode() for k in ("context_frame", "next_frame", "before_frame",
                                                                      "last_frame")}, "action": row["action"]}  # fmt: skip
            extra |= {"episode": row["episode"], "t": row["t"]}
        out.append({
            "data_source": source,
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "ability": ABILITY[config.domain],
            "reward_model": {"style": "rule", "ground_truth": json.dumps(gold)},
            "extra_info": extra,
        })  # fmt: skip
    return out


def write_verl(rows: list[dict], out: Path) -> Path:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(MISSING_EXTRA) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out

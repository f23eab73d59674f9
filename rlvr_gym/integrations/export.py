"""Training data for TRL and verl: the prompts the in-house trainer uses, with what the rewards need.

- TRL: a Hugging Face dataset (`save_to_disk`) with a `prompt` text column and the reward's columns: `current` and
  `next` as JSON strings (text game), or `tree_before`, `tree_after`, `reward`, `done` (web). Load it with
  `datasets.load_from_disk` and score with `rlvr_gym.integrations.trl`.
- verl: one parquet file with verl's columns: `data_source` ("rlvr_gym/textgame" or "rlvr_gym/web"), `prompt` as
  chat messages `[{"role": "user", "content": <prompt>}]`, `ability`, `reward_model` `{"style": "rule",
  "ground_truth": <JSON string>}` and `extra_info` `{"split", "index"}`; score with
  `rlvr_gym.integrations.verl.compute_score`.

The prompt text is the domain's `format_prompt`, exactly what `train textgame-rlvr` / `train web-rlvr` tokenize
(they prepend the tokenizer's bos token; TRL and verl add special tokens as the model's tokenizer does). The text
game's transitions are balanced changed:unchanged as `train textgame-rlvr` balances them. Prompts are not filtered
by token length here (the token count depends on the model): set the trainer's maximum prompt length instead.

    rlvr-gym export --domain textgame --format verl --out runs/export/textgame-train.parquet
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlvr_gym.domains import textgame, web
from rlvr_gym.integrations.verl import TEXTGAME, WEB

MISSING_EXTRA = "export needs `datasets` and `pyarrow`: install the bench extra with  pip install -e '.[bench]'"
DEFAULT_DATA = {"web": "runs/web/train"}  # the text game's default is the shared ByteSized32 train split
ABILITY = {"textgame": "world_model/textgame", "web": "world_model/web"}


@dataclass
class ExportConfig:
    domain: Literal["textgame", "web"] = "textgame"
    """Which world model's data: text game (ByteSized32 transitions) or web (MiniWoB++ transitions)."""
    format: Literal["trl", "verl"] = "trl"
    """trl: a Hugging Face dataset directory (save_to_disk); verl: a parquet file."""
    out: str = ""
    """Output path: a directory for trl, a .parquet file for verl; empty: runs/export/DOMAIN-FORMAT (.parquet for
    verl)."""
    data: str = ""
    """Transitions to export; empty: the domain's training data (text game: the shared ByteSized32 train split;
    web: runs/web/train, written by `collect web`)."""
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


def export(config: ExportConfig) -> Path:
    """Write the dataset config.format describes; returns its path."""
    if config.limit < 0:
        raise ValueError(f"limit must be >= 0 (0: all), got {config.limit}")
    if config.format not in ("trl", "verl"):
        raise ValueError(f"unknown format {config.format!r}: use trl or verl")
    out = Path(config.out or default_out(config))
    if config.format == "verl" and out.suffix != ".parquet":
        raise ValueError(f"verl reads parquet: give --out a .parquet path, got {out}")
    rows = textgame_rows(config) if config.domain == "textgame" else web_rows(config)
    if config.limit:
        rows = rows[: config.limit]
    if not rows:
        raise ValueError(f"no transitions to export from {config.data or 'the default data'}")
    return write_trl(rows, out) if config.format == "trl" else write_verl(verl_rows(rows, config), out)


def default_out(config: ExportConfig) -> str:
    return f"runs/export/{config.domain}-{config.format}" + (".parquet" if config.format == "verl" else "")


def textgame_rows(config: ExportConfig) -> list[dict]:
    """One row per transition: `prompt`, and `current` / `next` as JSON strings."""
    from rlvr_gym.train.textgame import DEFAULT_BALANCE, default_train_data, load_training_transitions

    ratio = DEFAULT_BALANCE[config.reward] if config.balance else None
    transitions = load_training_transitions(config.data or default_train_data(), "", ratio, config.seed)
    return [
        {"prompt": textgame.format_prompt(t.current, t.action), "current": json.dumps(t.current), "next": json.dumps(t.next)}
        for t in transitions
    ]


def web_rows(config: ExportConfig) -> list[dict]:
    """One row per transition: `prompt`, `tree_before`, `tree_after`, `reward`, `done`."""
    from rlvr_gym.train.web import load_web_data

    records, _ = load_web_data(config.data or DEFAULT_DATA["web"])
    return [
        {"prompt": web.format_prompt(r["utterance"], r["tree_before"], r["action"]), "tree_before": r["tree_before"],
         "tree_after": r["tree_after"], "reward": float(r["reward"]), "done": bool(r["done"])}
        for r in records
    ]  # fmt: skip


def write_trl(rows: list[dict], out: Path) -> Path:
    try:
        from datasets import Dataset
    except ImportError:
        raise ImportError(MISSING_EXTRA) from None
    Dataset.from_list(rows).save_to_disk(str(out))
    return out


def verl_rows(rows: list[dict], config: ExportConfig) -> list[dict]:
    """verl's RL dataset schema; the ground truth holds what `compute_score` needs."""
    source = TEXTGAME if config.domain == "textgame" else WEB
    out = []
    for i, row in enumerate(rows):
        if config.domain == "textgame":
            gold = {"current": json.loads(row["current"]), "next": json.loads(row["next"]), "metric": config.reward}
        else:
            gold = {k: row[k] for k in ("tree_before", "tree_after", "reward", "done")}
        out.append({
            "data_source": source,
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "ability": ABILITY[config.domain],
            "reward_model": {"style": "rule", "ground_truth": json.dumps(gold)},
            "extra_info": {"split": config.split, "index": i},
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

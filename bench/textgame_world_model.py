"""Text-game world models: no-change baseline, SFT, SFT + best-of-N, RLVR, on ByteSized32 valid and held-out TextWorld.

    python -m bench.textgame_world_model                    # shipped textgame-sft and textgame-rlvr
    python -m bench.textgame_world_model --models sft=DIR rlvr-binary=DIR rlvr-task=DIR --limit 300

Writes runs/bench/textgame_world_model.{md,json,png}. Best-of-N (on a seeded subset, N = 1 being greedy there)
samples N completions (temperature 1) and keeps the one the verifier (task reward against the gold next state)
scores highest: the ceiling that sampling plus a perfect reward model reaches, which RLVR tries to move into the
greedy prediction. *Changed* accuracy is the number that
shows a world model: always predicting "no change" already scores ~70% overall on ByteSized32.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rlvr_gym.data.bytesized32 import data_dir
from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.evaluation.textgame import TextGameEvalConfig, run_textgame_eval
from rlvr_gym.models.lm import resolve_checkpoint

OUT = Path("runs/bench")
COLUMNS = ("accuracy", "accuracy_changed", "accuracy_unchanged", "parse_failure_rate", "win_recall", "win_precision", "n")


def datasets(textworld: str) -> dict[str, str]:
    found = {}
    valid = data_dir() / "valid.jsonl.gz"
    if valid.is_file():
        found["ByteSized32 valid"] = str(valid)
    if Path(textworld).is_file():
        found["TextWorld held-out games"] = textworld
    if not found:
        raise FileNotFoundError(
            f"neither {valid} nor {textworld} exists: install the ByteSized32 data (`rlvr-gym data "
            "bytesized32 --source DIR`, or set RLVR_GYM_BYTESIZED32) or collect held-out "
            "games with `rlvr-gym collect textworld --seed 1000000 --games 30 --out runs/textworld/heldout`"
        )
    return found


CACHE = OUT / "textgame_world_model.cache.json"
# gold diffs: ByteSized32 valid p99 ~83 tokens, TextWorld ~37; longer completions count as failures
MAX_NEW_TOKENS = 256


def evaluate(checkpoint: str, data: str, limit: int, best_of: int = 1, threads: int = 1) -> dict:
    """`eval textgame`'s line, reused from CACHE while the checkpoint's weights and the data file are unchanged
    (a full table takes an hour of CPU; rerunning with one new model should not redo the others)."""
    weights = resolve_checkpoint(checkpoint) / "model.safetensors"
    key = json.dumps([str(weights), weights.stat().st_mtime, data, Path(data).stat().st_mtime, limit, best_of])
    cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    if key not in cache:
        cache[key] = run_textgame_eval(TextGameEvalConfig(data=data, checkpoint=checkpoint, limit=limit,
                                                          best_of=best_of, threads=threads, batch_size=32,
                                                          max_new_tokens=MAX_NEW_TOKENS))
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps(cache))
    return cache[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sft=textgame-sft", "rlvr=textgame-rlvr"],
                        help="name=checkpoint pairs; the first is the SFT model that best-of-N samples from")
    parser.add_argument("--textworld", default="runs/textworld/heldout/transitions.jsonl.gz")
    parser.add_argument("--limit", type=int, default=0, help="transitions per dataset (0: all)")
    parser.add_argument("--best-of", type=int, nargs="*", default=[4, 8])
    parser.add_argument("--best-of-limit", type=int, default=200, help="transitions for best-of-N (it costs N times)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    models = dict(pair.split("=", 1) for pair in args.models)
    sft_name = next(iter(models))
    results: dict[str, dict[str, dict]] = {}
    for data_name, data in datasets(args.textworld).items():
        rows = results.setdefault(data_name, {})
        for name, checkpoint in models.items():
            line = evaluate(checkpoint, data, args.limit, threads=args.threads)
            rows.setdefault("no change", {k: line[f"no_change_{k}"] for k in COLUMNS[:3]} | {"parse_failure_rate": 0.0, "win_recall": 0.0, "n": line["n"]})
            rows[name] = line
            print(data_name, name, json.dumps({k: line.get(k) for k in COLUMNS}), flush=True)
        for n in [1, *args.best_of]:  # 1: greedy on the same subset, the curve's first point
            line = evaluate(models[sft_name], data, args.best_of_limit, best_of=n, threads=args.threads)
            rows[f"{sft_name} best-of-{n} ({line['n']} transitions)"] = line
            print(data_name, f"best-of-{n}", json.dumps({k: line.get(k) for k in COLUMNS}), flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "textgame_world_model.json").write_text(json.dumps({"models": models, "results": results}, indent=2))
    lines = ["# Text-game world models", "", f"Models: {models}. Best-of-N: N samples at temperature 1, the best by "
             "the task reward against gold (an oracle choice).", ""]
    for data_name, rows in results.items():
        table = [{"model": name, **{k: row.get(k) for k in COLUMNS}} for name, row in rows.items()]
        lines += [f"## {data_name}", "", markdown_table(table, ["model", *COLUMNS]), ""]
    (OUT / "textgame_world_model.md").write_text("\n".join(lines))
    plot(results, sft_name, args.best_of)
    print("\n".join(lines))


def plot(results: dict, sft_name: str, best_of: list[int]) -> None:
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8), squeeze=False)
    for ax, (data_name, rows) in zip(axes[0], results.items()):
        best = [(n, row["accuracy_changed"] or 0.0) for name, row in rows.items() for n in [1, *best_of]
                if f"best-of-{n} " in name]
        ax.plot(*zip(*best), "o-", label=f"{sft_name} best-of-N (oracle; N=1 greedy), subset")
        for k, (name, row) in enumerate((n, r) for n, r in rows.items() if "best-of" not in n):
            ax.axhline(row["accuracy_changed"] or 0.0, ls="--", color=f"C{k + 1}", label=f"{name} greedy, all")
        ax.set_xscale("log", base=2)
        ax.set(title=data_name, xlabel="N samples", ylabel="accuracy on changed transitions")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "textgame_world_model.png", dpi=120)


if __name__ == "__main__":
    main()

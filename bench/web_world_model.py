"""Web world models on fresh real MiniWoB++ transitions: no-change baseline, SFT, SFT + best-of-N, RLVR.

    python -m bench.web_world_model                          # shipped web-sft and web-rlvr
    python -m bench.web_world_model --models sft=DIR rlvr=DIR --episodes 20

Records one fresh set of real transitions (Chromium, seed 2: episodes no training or held-out set used; 20 episodes
per task: 1,110 transitions, 135 of them on the two held-out tasks) into runs/bench/web_eval_data (recorded again
when --episodes or --seed differ from the set there), scores every model on that same set, and writes
runs/bench/web_world_model.{md,json,png}.
F1 is over the New / Deleted / Updated items pooled, as RLVR-World; seen and held-out tasks are reported apart.
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

from envs.web import TASKS
from rlvr_gym.data.web_collect import WebCollectConfig, collect_web
from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.evaluation.web import WebEvalConfig, run_web_eval

OUT = Path("runs/bench")
DATA = OUT / "web_eval_data"
SPLITS = ("", "seen_", "heldout_")


def row(line: dict, prefix: str) -> list:
    return [line.get(f"{prefix}{k}") for k in ("f1", "precision", "recall", "reward_accuracy", "done_accuracy",
                                              "parse_failure_rate", "n")]


def baseline_row(line: dict, prefix: str) -> list:
    """The always-"no change" prediction (None where it has no value: precision and recall of an empty diff)."""
    get = lambda k: line.get(f"{prefix}nochange_{k}")  # noqa: E731
    return [get("f1"), None, None, get("reward_accuracy"), get("done_accuracy"), 0.0, line.get(f"{prefix}n")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sft=web-sft", "rlvr=web-rlvr"],
                        help="name=checkpoint pairs; the first is the SFT model that best-of-N samples from")
    parser.add_argument("--episodes", type=int, default=20, help="fresh real episodes per task")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--best-of", type=int, nargs="*", default=[4])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    models = dict(pair.split("=", 1) for pair in args.models)
    sft_name = next(iter(models))
    recorded = json.loads((DATA / "manifest.json").read_text())["config"] if (DATA / "manifest.json").is_file() else {}
    if (recorded.get("episodes"), recorded.get("seed")) != (args.episodes, args.seed):
        collect_web(WebCollectConfig(out=str(DATA), tasks=TASKS, episodes=args.episodes, seed=args.seed,
                                     overwrite=True))  # fmt: skip
    lines = {}
    for name, checkpoint in models.items():
        lines[name] = run_web_eval(WebEvalConfig(checkpoint=checkpoint, data=str(DATA), threads=args.threads))
        print(name, json.dumps(lines[name]), flush=True)
    for n in args.best_of:
        lines[f"{sft_name} best-of-{n}"] = run_web_eval(
            WebEvalConfig(checkpoint=models[sft_name], data=str(DATA), best_of=n, threads=args.threads))
        print(f"best-of-{n}", json.dumps(lines[f"{sft_name} best-of-{n}"]), flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "web_world_model.json").write_text(json.dumps({"models": models, "results": lines}, indent=2))
    header = ["model", "f1", "precision", "recall", "reward acc", "done acc", "parse failures", "n"]
    first = next(iter(lines.values()))
    report_note = (f"{first['over_context_rate']:.1%} of the transitions have pages longer than the models' context: "
                   "they count as parse failures (empty prediction), as the no-change baseline does not need a "
                   "context.")
    as_rows = lambda table: [dict(zip(header, r)) for r in table]  # noqa: E731
    report = ["# Web world models", "", f"Real transitions: {first['data']}. Seen tasks: {first['seen_tasks']}.", "",
              report_note, ""]
    for prefix, title in zip(SPLITS, ("All tasks", "Seen tasks", "Held-out tasks")):
        table = [["no change", *baseline_row(first, prefix)]] + [[name, *row(line, prefix)] for name, line in lines.items()]
        report += [f"## {title}", "", markdown_table(as_rows(table), header), ""]
    (OUT / "web_world_model.md").write_text("\n".join(report))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = ["no change", *lines]
    for k, (prefix, title) in enumerate(zip(SPLITS, ("all", "seen", "held-out"))):
        values = [first.get(f"{prefix}nochange_f1")] + [line.get(f"{prefix}f1") for line in lines.values()]
        ax.bar([i + 0.27 * k for i in range(len(names))], [v or 0.0 for v in values], width=0.27, label=title)
    ax.set_xticks([i + 0.27 for i in range(len(names))], names, rotation=15, fontsize=8)
    ax.set(ylabel="item F1", title="Web world model, fresh real transitions")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "web_world_model.png", dpi=120)
    print("\n".join(report))


if __name__ == "__main__":
    main()

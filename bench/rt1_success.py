"""Whether the learned tabletop calls success where the real one did: real episodes replayed open loop.

    python -m bench.rt1_success --checkpoints rt1-rlvr rt1-dynamics --data runs/rt1/heldout2
                                                                  # writes runs/bench/rt1_success.{md,json}

Each real episode's actions are replayed open loop in each world model's simulator from the episode's first frame
(greedy, `sim.robot.success_agreement`, under the checkpoint's own thresholds and hold: frames read by a state
reader or the success flag, or the task's test on the state its dynamics predict). Per task: the balanced accuracy
of the simulator's success against the real outcome, the share of real successes it pays, and the share of real
failures it pays. A `--data` directory that does not exist is collected first: 60 held-out episodes (seed 2, the
scripted skills and random actions, `rlvr-gym collect rt1 --out DIR --episodes 60 --seed 2 --split heldout`).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from rlvr_gym.data.episodes import CollectConfig, collect, load_episodes
from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.sim.robot import success_agreement


def main(checkpoints: tuple[str, ...] = ("rt1-rlvr", "rt1-dynamics"), data: str = "runs/rt1/heldout2",
         out_dir: str = "runs/bench") -> dict:
    torch.set_num_threads(1)
    if not Path(data).exists():
        collect(CollectConfig(out=data, episodes=60, seed=2, split="heldout"))
    episodes = load_episodes(data)
    results = {name: success_agreement(name, episodes) for name in checkpoints}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rt1_success.json").write_text(json.dumps({"data": data, "results": results}, indent=2))
    rows = [{"checkpoint": name, "task": task, **values} for name, tasks in results.items() for task, values in tasks.items()]
    (out / "rt1_success.md").write_text(
        f"# RT-1 success replayed open loop\n\n{len(episodes)} real episodes from `{data}`, each replayed from its first "
        "frame under its real actions (greedy) in each checkpoint's simulator; success as that simulator calls it.\n\n"
        + markdown_table(rows, digits=2) + "\n")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", nargs="+", default=["rt1-rlvr", "rt1-dynamics"])
    parser.add_argument("--data", default="runs/rt1/heldout2", help="real episodes (`rlvr-gym collect rt1`)")
    parser.add_argument("--out-dir", default="runs/bench")
    args = parser.parse_args()
    main(args.checkpoints, args.data, args.out_dir)

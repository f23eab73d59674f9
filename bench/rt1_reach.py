"""Can PPO learn a tabletop task in the real env at all, and what does it need? The reach term against the success
margin alone, for an agent on the true state and the co-training loop's agent on frames.

    python -m bench.rt1_reach                           # writes runs/bench/rt1_reach.{md,json,png}
    python -m bench.rt1_reach --observations state --seeds 0 --steps 16384    # a smoke run

Each arm is PPO (4 real envs, the real reward shaped as `agents.robot.VecShaped` shapes the learned simulator's:
`--shaping` x the change in the log-odds of the true success margin, plus `reach` x the decrease in the palm's
distance to where the task's work starts, `envs.robot.policies.reach_point`), on one of two observations:
- `state`: the true state and the target's centre (`agents.robot.StateObservation`), 16 numbers;
- `frame`: 32x32 frames through an MLP, the co-training loop's default agent.
Every `--every` steps the agent is scored greedily on `--episodes` held-out real starts (`real_start_states`). Each
(observation, reach, seed) curve is kept under runs/bench/rt1_reach/ and reused by a rerun with the same settings,
so seeds can run in parallel processes and a last run with all of them writes the report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from stable_baselines3 import PPO

from agents.robot import evaluate_in_real, make_real_env
from agents.train_sb3 import RealEvalCallback
from rlvr_gym.evaluation.report import markdown_table

OUT = Path("runs/bench")
REAL_ENVS = 4


def run_arm(observation: str, reach: float, seed: int, args: argparse.Namespace) -> list[dict]:
    key = {"observation": observation, "reach": reach, "seed": seed, "task": args.task, "steps": args.steps,
           "every": args.every, "episodes": args.episodes, "shaping": args.shaping, "horizon": args.horizon}
    path = OUT / "rt1_reach" / f"{args.task}-{observation}-reach{reach:g}-{seed}.json"
    if path.is_file() and json.loads(path.read_text())["key"] == key:
        return json.loads(path.read_text())["points"]
    venv = make_real_env(args.task, args.horizon, shaping=args.shaping, reach=reach, observation=observation,
                         num_envs=REAL_ENVS)
    model = PPO("MlpPolicy", venv, n_steps=256, batch_size=256, n_epochs=4, learning_rate=3e-4, seed=seed,
                device="cpu", verbose=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    scorings = RealEvalCallback(lambda m: evaluate_in_real(m, args.episodes, args.task, args.horizon), args.every,
                                path.with_suffix(".jsonl"))
    model.learn(args.steps, callback=scorings)
    venv.close()
    points = [{"steps": r["step"], "real_success": r["success_rate"]} for r in scorings.results]
    path.write_text(json.dumps({"key": key, "points": points}))
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="open_drawer")
    parser.add_argument("--observations", nargs="+", default=["state", "frame"], choices=("state", "frame"))
    parser.add_argument("--reaches", nargs="+", type=float, default=[0.0, 5.0],
                        help="weights per metre of the reach term; 0: the success margin alone")
    parser.add_argument("--shaping", type=float, default=0.2, help="weight of the success margin's log-odds")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=131072, help="real env steps per arm")
    parser.add_argument("--every", type=int, default=16384, help="score every this many steps")
    parser.add_argument("--episodes", type=int, default=32, help="held-out real starts per score")
    parser.add_argument("--horizon", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {f"{obs} reach {reach:g}": {seed: run_arm(obs, reach, seed, args) for seed in args.seeds}
               for obs in args.observations for reach in args.reaches}
    rows = []
    for name, curves in results.items():
        finals = [c[-1]["real_success"] for c in curves.values()]
        best = [max(p["real_success"] for p in c) for c in curves.values()]
        per_seed = ", ".join(f"{f:.2f}" for f in finals)
        rows.append({"arm": name, "final real success": f"{np.mean(finals):.2f} ({per_seed})",
                     "best scoring": f"{np.mean(best):.2f}", "real steps": args.steps})
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "rt1_reach.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    figure, axis = plt.subplots(figsize=(7, 4))
    for i, (name, curves) in enumerate(results.items()):
        for j, curve in enumerate(curves.values()):
            axis.plot([p["steps"] for p in curve], [p["real_success"] for p in curve], color=f"C{i}",
                      label=name if j == 0 else None, alpha=0.8)
    axis.set(xlabel="real env steps", ylabel="greedy real success", title=f"PPO in the real tabletop, {args.task}")
    axis.legend()
    figure.tight_layout()
    figure.savefig(OUT / "rt1_reach.png", dpi=120)
    report = [f"# PPO in the real tabletop: the reach term ({args.task}, seeds {args.seeds})", "",
              f"PPO, {REAL_ENVS} real envs, {args.steps} real steps per arm, reward shaped by {args.shaping:g} x the "
              f"change in the log-odds of the true success margin plus the reach term's weight x the decrease in the "
              f"palm's distance (m) to where the task's work starts; scored greedily every {args.every} steps on "
              f"{args.episodes} held-out real starts.", "", markdown_table(rows), "", "![curves](rt1_reach.png)", ""]
    (OUT / "rt1_reach.md").write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()

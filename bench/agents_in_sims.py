"""PPO trained inside the MLE and the RLVR RT-1 world models, each scored as it learns in the real MuJoCo tabletop.

    python -m bench.agents_in_sims --steps 4096 --eval-every 1024    # writes runs/bench/agents_in_sims.{md,json,png}

The two runs go side by side (one process each, `python -m agents.train_sb3`); the plot shows each agent's return
in its learned simulator (SB3's rollout/ep_rew_mean, i.e. the success head's verdicts) next to its success in the
real env from held-out start states: an agent can only learn what its simulator rewards.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rlvr_gym.evaluation.report import markdown_table

OUT = Path("runs/bench")


def sim_curve(run: Path) -> list[tuple[int, float]]:
    with (run / "progress.csv").open() as f:
        return [(int(float(r["time/total_timesteps"])), float(r["rollout/ep_rew_mean"]))
                for r in csv.DictReader(f) if r.get("rollout/ep_rew_mean") not in (None, "")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", nargs="+", default=["rt1-mle", "rt1-rlvr"])
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--eval-every", type=int, default=1024)
    parser.add_argument("--eval-episodes", type=int, default=8)
    parser.add_argument("--task", default="open_drawer")
    args = parser.parse_args()
    runs = {name: OUT / "agents_in_sims" / f"ppo-{name}" for name in args.checkpoints}
    procs = [subprocess.Popen([sys.executable, "-m", "agents.train_sb3", "--algo", "ppo", "--checkpoint", name,
                               "--steps", str(args.steps), "--eval-every", str(args.eval_every), "--eval-episodes",
                               str(args.eval_episodes), "--task", args.task, "--out", str(run)],
                              stdout=subprocess.PIPE, text=True) for name, run in runs.items()]
    finals = {}
    for (name, run), proc in zip(runs.items(), procs):
        stdout, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"PPO in {name} failed (exit {proc.returncode}); see {run}")
        finals[name] = json.loads(stdout.strip().splitlines()[-1])
    curves = {name: {"sim": sim_curve(run), "real": [json.loads(line) for line in (run / "eval.jsonl").open()]}
              for name, run in runs.items()}
    (OUT / "agents_in_sims.json").write_text(json.dumps({"args": vars(args), "final": finals, "curves": curves}, indent=2))
    rows = [{"world model": name, "sim steps/s": f["steps_per_s"], "sim return (last)": c["sim"][-1][1] if c["sim"] else None,
             "real success": f["real"]["success_rate"], "real episodes": f["real"]["episodes"]}
            for (name, f), c in zip(finals.items(), curves.values())]
    report = [f"# PPO inside the learned RT-1 simulators ({args.task}, {args.steps} steps)", "",
              markdown_table(rows), "", "![curves](agents_in_sims.png)", ""]
    (OUT / "agents_in_sims.md").write_text("\n".join(report))
    fig, (sim_ax, real_ax) = plt.subplots(1, 2, figsize=(9, 3.5))
    for k, (name, c) in enumerate(curves.items()):
        if c["sim"]:
            sim_ax.plot(*zip(*c["sim"]), color=f"C{k}", label=name)
        real_ax.plot([r["step"] for r in c["real"]], [r["success_rate"] for r in c["real"]], "o-", color=f"C{k}", label=name)
    sim_ax.set(title="return in the learned simulator", xlabel="steps")
    real_ax.set(title="success in the real env (held-out starts)", xlabel="steps", ylim=(-0.05, 1.05))
    real_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "agents_in_sims.png", dpi=120)
    print("\n".join(report))


if __name__ == "__main__":
    main()

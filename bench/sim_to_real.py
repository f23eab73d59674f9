"""Agents trained with the co-training loop against agents trained in the real env, at equal real-step budgets.

    rlvr-gym collect rt1 --out runs/rt1/replay --episodes 200 --seed 1 --workers 2   # the models' own training run
    python -m bench.sim_to_real --replay runs/rt1/replay  # writes runs/bench/sim_to_real.{md,json,png}
    python -m bench.sim_to_real --tasks open_drawer --seeds 0 --rounds 1 --real-steps 100 --sim-steps 512   # a smoke run

Arms, each from the same seeds, each point its real success from held-out start states against the real env steps
it has taken so far (data and scoring alike):
- `loop`: `agents.cotrain` (refits by MLE, then GRPO);  `loop-mle`: the same with MLE-only refits (`--grpo-steps 0`);
- `frozen`: PPO in the frozen starting simulator for as many simulated steps, real steps spent on scoring only;
- `real-1x` / `real-10x`: PPO in the real tabletop with the loop's real-step budget and ten times it.
Reported: final real success per arm with a 95% interval over seeds (t), the real steps at which each arm first
reaches the real-env baseline's final success (sample efficiency), and the loop's learned-vs-real success gap.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

from agents.cotrain import CoTrainConfig, learned_success, make_agent, run_cotrain
from agents.robot import VecFrames, evaluate_in_real
from envs.robot import RealRT1Env
from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.models.robot_world_model import RobotWorldModel

OUT = Path("runs/bench")
T_95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t interval (0 for one value)."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, 0.0
    return mean, T_95.get(len(values) - 1, 1.96) * float(np.std(values, ddof=1)) / math.sqrt(len(values))


class RealScoring(BaseCallback):
    """Scores a real-env PPO agent every `every` training steps; each point counts training and scoring steps."""

    def __init__(self, every: int, config: CoTrainConfig):
        super().__init__()
        self.every, self.config, self.next, self.scoring_steps, self.points = every, config, every, 0, []

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next:
            self.next += self.every
            real = evaluate_in_real(self.model, self.config.eval_episodes, self.config.task, self.config.horizon)
            self.scoring_steps += int(round(real["mean_length"] * real["episodes"]))
            self.points.append({"real_steps_total": self.num_timesteps + self.scoring_steps,
                                "real_success": real["success_rate"]})
        return True


def real_arm(config: CoTrainConfig, budget: int, points: int) -> list[dict]:
    """PPO in the real tabletop until `budget` real steps (training plus scoring), scored `points` times."""
    env = VecFrames(VecMonitor(DummyVecEnv([lambda: RealRT1Env(task=config.task, horizon=config.horizon)])),
                    config.frame_size)
    agent = PPO("MlpPolicy", env, n_steps=256, n_epochs=4, batch_size=64, learning_rate=config.learning_rate,
                seed=config.seed, device="cpu", policy_kwargs={"net_arch": [64, 64]}, verbose=0)
    scoring = config.eval_episodes * config.horizon  # an upper bound of each scoring's steps
    every = max((budget - points * scoring) // points, 256)
    callback = RealScoring(every, config)
    agent.learn(every * points, callback=callback)
    env.close()
    return callback.points


def frozen_arm(config: CoTrainConfig) -> list[dict]:
    """PPO in the frozen starting simulator, scored after each round's worth of simulated steps."""
    agent, env = make_agent(config, config.checkpoint)
    points, real_steps = [], 0
    for _ in range(config.rounds):
        agent.learn(config.sim_steps, reset_num_timesteps=False)
        real = evaluate_in_real(agent, config.eval_episodes, config.task, config.horizon)
        real_steps += int(round(real["mean_length"] * real["episodes"]))
        points.append({"real_steps_total": real_steps, "real_success": real["success_rate"],
                       "learned_success": learned_success(agent, str(RobotWorldModel.resolve(config.checkpoint)),
                                                          config, config.eval_episodes)})
    env.close()
    return points


def first_reaching(points: list[dict], target: float) -> int | None:
    return next((p["real_steps_total"] for p in points if p["real_success"] >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="rt1-rlvr")
    parser.add_argument("--tasks", nargs="+", default=["open_drawer", "close_drawer"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--real-steps", type=int, default=400)
    parser.add_argument("--sim-steps", type=int, default=4096)
    parser.add_argument("--eval-episodes", type=int, default=8)
    parser.add_argument("--grpo-steps", type=int, default=10)
    parser.add_argument("--replay", default="", help="episodes mixed into every MLE refit (`rlvr-gym collect rt1`)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs: dict = {}
    for task in args.tasks:
        for seed in args.seeds:
            base = CoTrainConfig(out=str(OUT / "sim_to_real" / task / f"loop-{seed}"), checkpoint=args.checkpoint,
                                 task=task, rounds=args.rounds, real_steps=args.real_steps, sim_steps=args.sim_steps,
                                 eval_episodes=args.eval_episodes, grpo_steps=args.grpo_steps, replay=args.replay,
                                 seed=seed)
            arms = {"loop": base, "loop-mle": replace(base, out=base.out.replace("loop-", "loop-mle-"), grpo_steps=0)}
            curves = {}
            for name, config in arms.items():
                run_cotrain(config)
                curves[name] = [json.loads(line) for line in (Path(config.out) / "rounds.jsonl").read_text().splitlines()]
            curves["frozen"] = frozen_arm(base)
            budget = curves["loop"][-1]["real_steps_total"]
            curves["real-1x"] = real_arm(base, budget, args.rounds)
            curves["real-10x"] = real_arm(base, 10 * budget, args.rounds)
            runs.setdefault(task, {})[seed] = curves
            (OUT / "sim_to_real.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    write_report(args, runs)


def write_report(args: argparse.Namespace, runs: dict) -> None:
    arms = ["loop", "loop-mle", "frozen", "real-1x", "real-10x"]
    rows, lines = [], []
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.5), squeeze=False)
    for ax, (task, by_seed) in zip(axes[0], runs.items()):
        for k, arm in enumerate(arms):
            finals = [curves[arm][-1]["real_success"] for curves in by_seed.values()]
            steps = [curves[arm][-1]["real_steps_total"] for curves in by_seed.values()]
            mean, half = interval(finals)
            row = {"task": task, "arm": arm, "final real success": f"{mean:.2f} ± {half:.2f}",
                   "real steps": int(np.mean(steps))}
            if arm in ("loop", "loop-mle", "frozen"):
                gaps = [curves[arm][-1]["learned_success"] - curves[arm][-1]["real_success"] for curves in by_seed.values()]
                row["learned - real"] = f"{np.mean(gaps):+.2f}"
            target = interval([c["real-1x"][-1]["real_success"] for c in by_seed.values()])[0]
            reached = [first_reaching(curves[arm], target) for curves in by_seed.values()]
            row["steps to real-1x's final"] = "never" if None in reached or target == 0 else int(np.mean(reached))
            rows.append(row)
            for seed, curves in by_seed.items():
                xs = [p["real_steps_total"] for p in curves[arm]]
                ys = [p["real_success"] for p in curves[arm]]
                ax.plot(xs, ys, marker="o", color=f"C{k}", alpha=0.7, label=arm if seed == next(iter(by_seed)) else None)
        ax.set(title=task, xlabel="real env steps (data and scoring)", ylabel="real success", ylim=(-0.05, 1.05))
        ax.set_xscale("log")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "sim_to_real.png", dpi=110)
    plt.close(fig)
    for task, by_seed in runs.items():
        loop = interval([c["loop"][-1]["real_success"] for c in by_seed.values()])[0]
        mle = interval([c["loop-mle"][-1]["real_success"] for c in by_seed.values()])[0]
        real1 = interval([c["real-1x"][-1]["real_success"] for c in by_seed.values()])[0]
        lines.append(f"- {task}: the loop ends at {loop:.2f} real success against {real1:.2f} for PPO in the real env "
                     f"with the same real steps ({'ahead' if loop > real1 else 'not ahead'}); RLVR refits "
                     f"{'beat' if loop > mle else 'do not beat'} MLE-only refits ({loop:.2f} against {mle:.2f}).")
    report = [f"# Sim-to-real: the co-training loop against real-env PPO ({', '.join(runs)}; seeds {args.seeds})", "",
              f"World model {args.checkpoint}; {args.rounds} rounds of {args.real_steps} real data steps and "
              f"{args.sim_steps} simulated agent steps, {args.eval_episodes} held-out real episodes per score. "
              "Intervals: 95% t over seeds.", "", markdown_table(rows), "", *lines, "", "![curves](sim_to_real.png)", ""]
    (OUT / "sim_to_real.md").write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()

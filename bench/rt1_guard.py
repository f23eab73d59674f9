"""Does the learned tabletop's uncertainty (`info["uncertainty"]`) tell its false successes from its true ones?

    python -m bench.rt1_guard --checkpoint rt1-rlvr --starts 2     # writes runs/bench/rt1_guard.{md,json,png}

From the checkpoint's first `starts` initial states per task, the scripted expert and a half-skilled policy (their
real action sequences, replayed open loop) and the exploit probe's policies (`rlvr_gym.evaluation.probe`) run in
RLVRWorld-RT1-v0 and in the real tabletop. Recorded per step: the transformer's mean negative log-likelihood of the
codes it generated (nats per code). The report compares its distribution where the learned env calls a success the
real env also gives against where it calls one the real env never gives, and then the guard on and off: MOReL's halt
at a threshold (the scripted episodes' 99th percentile), counting the false successes it removes and the true ones
it costs.
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
from gymnasium.vector import AutoresetMode

from envs.robot import RealRT1Env, make_scripted_policy
from rlvr_gym.data.robot import load_initial_states
from rlvr_gym.evaluation.policies import real_rollout, scripted_seed, select_rows
from rlvr_gym.evaluation.probe import rt1_probe_actions
from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.models.robot_world_model import RobotWorldModel
from rlvr_gym.sim.robot import DEFAULT_HORIZON, RT1WorldVectorEnv

OUT = Path("runs/bench")


def episodes(checkpoint: str, starts: int, horizon: int) -> list[dict]:
    """Action sequences (scripted and probe policies) with their real outcome, from the checkpoint's start states."""
    states = load_initial_states(RobotWorldModel.resolve(checkpoint))
    envs = {}
    jobs = []
    for row in select_rows(states, None, starts):
        task, seed = str(states.tasks[row]), int(states.seeds[row])
        env = envs.setdefault(task, RealRT1Env(task=task, horizon=horizon))
        for skill in (1.0, 0.5):
            real = real_rollout(env, seed, make_scripted_policy(task, skill, scripted_seed(0, seed)), to_horizon=True)
            jobs.append({"policy": f"scripted-{skill}", "row": int(row), "actions": real.actions, "real": real.success})
        for name, actions in rt1_probe_actions(horizon, np.random.default_rng([0, seed])).items():
            steps = iter(actions)
            real = real_rollout(env, seed, lambda _frame, _info: next(steps))
            jobs.append({"policy": name, "row": int(row), "actions": actions, "real": real.success})
    for env in envs.values():
        env.close()
    return jobs


def learned(checkpoint: str, jobs: list[dict], horizon: int) -> None:
    """Step every job in one vector env; record each step's uncertainty and the step the learned env calls success."""
    venv = RT1WorldVectorEnv(num_envs=len(jobs), checkpoint=checkpoint, horizon=horizon,
                             autoreset_mode=AutoresetMode.DISABLED)
    venv.reset(seed=0, options={"index": [j["row"] for j in jobs]})
    alive = np.ones(len(jobs), bool)
    for job in jobs:
        job["uncertainty"], job["success_step"] = [], None
    for t in range(horizon):
        _, _, terminated, truncated, info = venv.step(np.stack([j["actions"][t] for j in jobs]).astype(np.float32))
        for i in np.flatnonzero(alive):
            jobs[i]["uncertainty"].append(float(info["uncertainty"][i]))
            if terminated[i]:
                jobs[i]["success_step"] = t
        alive &= ~(terminated | truncated)
        if not alive.any():
            break
        if (terminated | truncated).any():
            venv.reset(options={"reset_mask": terminated | truncated})
    venv.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="rt1-rlvr")
    parser.add_argument("--starts", type=int, default=2, help="initial states per task")
    parser.add_argument("--horizon", type=int, default=DEFAULT_HORIZON)
    args = parser.parse_args()
    torch.set_num_threads(1)
    jobs = episodes(args.checkpoint, args.starts, args.horizon)
    learned(args.checkpoint, jobs, args.horizon)
    scripted = [u for j in jobs if j["policy"].startswith("scripted") for u in j["uncertainty"]]
    threshold = float(np.percentile(scripted, 99))
    paid = [j for j in jobs if j["success_step"] is not None]
    true = [j["uncertainty"][j["success_step"]] for j in paid if j["real"]]
    false = [j["uncertainty"][j["success_step"]] for j in paid if not j["real"]]
    # With MOReL's halt on, an episode ends unpaid at its first step above the threshold.
    survives = lambda j: max(j["uncertainty"][: j["success_step"] + 1]) <= threshold  # noqa: E731
    rows = [{"learned success": kind, "episodes": len(values),
             "uncertainty at the success step, median": float(np.median(values)) if values else None,
             "kept with the halt on": sum(survives(j) for j in paid if j["real"] == (kind == "true"))}
            for kind, values in (("true", true), ("false", false))]
    result = {"args": vars(args), "threshold": threshold, "rows": rows, "episodes": len(jobs),
              "scripted_uncertainty_percentiles": {p: float(np.percentile(scripted, p)) for p in (50, 90, 99)}}
    (OUT / "rt1_guard.json").write_text(json.dumps(result, indent=1))
    fig, ax = plt.subplots(figsize=(6, 4))
    bins = np.linspace(0, max(scripted + true + false + [threshold]) * 1.05, 30)
    ax.hist(true, bins, alpha=0.6, label="success the real env also gives")
    ax.hist(false, bins, alpha=0.6, label="success the real env never gives")
    ax.axvline(threshold, color="k", ls="--", label="halt threshold (scripted p99)")
    ax.set(xlabel="uncertainty at the step success is called (nats per code)", ylabel="episodes",
           title=f"{args.checkpoint}: uncertainty of learned successes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "rt1_guard.png", dpi=110)
    plt.close(fig)
    report = [f"# Uncertainty guard: {args.checkpoint}, {args.starts} start states per task", "",
              f"{len(jobs)} episodes (scripted expert and half-skilled, and the exploit probe's 16 policies). "
              f"Halt threshold {threshold:.3f} nats per code, the 99th percentile over the scripted episodes' steps.", "",
              markdown_table(rows), "", "![uncertainty](rt1_guard.png)", ""]
    (OUT / "rt1_guard.md").write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()

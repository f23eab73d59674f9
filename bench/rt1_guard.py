"""Two guards of the learned tabletop against false success, measured on and off: the uncertainty halt and the hold.

    python -m bench.rt1_guard --checkpoint rt1-rlvr --starts 6     # writes runs/bench/rt1_guard.{md,json,png}

From the checkpoint's first `starts` initial states per task, the scripted expert and two lesser skills (their
real action sequences, replayed open loop) and the exploit probe's policies (`rlvr_gym.evaluation.probe`) run in
RLVRWorld-RT1-v0 and in the real tabletop. The learned episodes run to the horizon with success never ending them,
recording per step the success probability and the uncertainty (the transformer's mean negative log-likelihood of
the codes it generated, nats per code); each guard's outcome is then read off the same traces:
- the hold (`success_hold`, 1 = off): success once the probability has exceeded the checkpoint's threshold for
  that many consecutive frames. Reported per hold: the probe policies' mean and largest false success (learned
  minus real success, floored at 0) and the scripted policies' learned success against their real success;
- MOReL's halt at a threshold (the scripted episodes' 99th percentile), at the checkpoint's own hold: the false
  successes it removes and the true ones it costs, and where the uncertainty lies at each.
Until its success, a traced episode is the env's own: frames fed back unflagged are what the env feeds back.
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

from envs.robot import TASKS, RealRT1Env, make_scripted_policy
from rlvr_gym.data.robot import load_initial_states
from rlvr_gym.evaluation.policies import real_rollout, scripted_seed, select_rows
from rlvr_gym.evaluation.probe import real_probe_episodes
from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.models.robot_world_model import RobotWorldModel
from rlvr_gym.sim.robot import DEFAULT_HORIZON, RT1WorldVectorEnv, first_held_step

OUT = Path("runs/bench")


def episodes(checkpoint: str, starts: int, horizon: int) -> list[dict]:
    """Action sequences (scripted skills and the probe's policies) with their real outcome, from the checkpoint's
    start states."""
    states = load_initial_states(RobotWorldModel.resolve(checkpoint))
    envs = {}
    jobs = []
    for row in select_rows(states, None, starts):
        task, seed = str(states.tasks[row]), int(states.seeds[row])
        env = envs.setdefault(task, RealRT1Env(task=task, horizon=horizon))
        for skill in (1.0, 0.7, 0.4):
            real = real_rollout(env, seed, make_scripted_policy(task, skill, scripted_seed(0, seed)), to_horizon=True)
            jobs.append({"policy": f"scripted-{skill}", "task": task, "row": int(row), "actions": real.actions,
                         "real": real.success})
    for env in envs.values():
        env.close()
    return jobs + real_probe_episodes(checkpoint, starts, horizon, seed=0)


def learned(checkpoint: str, jobs: list[dict], horizon: int) -> None:
    """Step every job to the horizon in one vector env, success never ending it; record each step's success
    probability and uncertainty, and the task's threshold."""
    venv = RT1WorldVectorEnv(num_envs=len(jobs), checkpoint=checkpoint, horizon=horizon,
                             autoreset_mode=AutoresetMode.DISABLED)
    settings = venv.sim.world.settings
    for job in jobs:
        job["threshold"] = settings.success_threshold(job["task"])
        job["probs"], job["uncertainty"] = [], []
    settings.success_thresholds = {task: 2.0 for task in TASKS}  # above any probability: nothing ends an episode
    venv.reset(seed=0, options={"index": [j["row"] for j in jobs]})
    for t in range(horizon):
        _, _, _, _, info = venv.step(np.stack([j["actions"][t] for j in jobs]).astype(np.float32))
        for i, job in enumerate(jobs):
            job["probs"].append(float(info["success_prob"][i]))
            job["uncertainty"].append(float(info["uncertainty"][i]))
    venv.close()


def success_step(job: dict, hold: int) -> int | None:
    """The step at which the learned env calls success with this hold (None: never)."""
    return first_held_step(job["probs"], job["threshold"], hold)


def hold_rows(jobs: list[dict], holds: list[int]) -> list[dict]:
    rows = []
    for hold in holds:
        by_policy: dict[str, list[tuple[bool, bool]]] = {}
        for job in jobs:
            by_policy.setdefault(job["policy"], []).append((success_step(job, hold) is not None, job["real"]))
        rates = {name: np.mean(pairs, axis=0) for name, pairs in by_policy.items()}
        false = [max(0.0, paid - given) for name, (paid, given) in rates.items() if not name.startswith("scripted")]
        row = {"hold": hold, "probe false success, mean": float(np.mean(false)), "largest": float(np.max(false))}
        for name in sorted(n for n in rates if n.startswith("scripted")):
            row[f"{name} learned / real"] = f"{rates[name][0]:.2f} / {rates[name][1]:.2f}"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="rt1-rlvr")
    parser.add_argument("--starts", type=int, default=2, help="initial states per task")
    parser.add_argument("--horizon", type=int, default=DEFAULT_HORIZON)
    args = parser.parse_args()
    torch.set_num_threads(1)
    jobs = episodes(args.checkpoint, args.starts, args.horizon)
    learned(args.checkpoint, jobs, args.horizon)
    hold = RobotWorldModel.load(args.checkpoint).settings.success_hold
    holds = hold_rows(jobs, [1, 2, 3])
    scripted = [u for j in jobs if j["policy"].startswith("scripted") for u in j["uncertainty"]]
    threshold = float(np.percentile(scripted, 99))
    for job in jobs:
        job["success_step"] = success_step(job, hold)
    paid = [j for j in jobs if j["success_step"] is not None]
    true = [j["uncertainty"][j["success_step"]] for j in paid if j["real"]]
    false = [j["uncertainty"][j["success_step"]] for j in paid if not j["real"]]
    # With MOReL's halt on, an episode ends unpaid at its first step above the threshold.
    survives = lambda j: max(j["uncertainty"][: j["success_step"] + 1]) <= threshold  # noqa: E731
    rows = [{"learned success": kind, "episodes": len(values),
             "uncertainty at the success step, median": float(np.median(values)) if values else None,
             "kept with the halt on": sum(survives(j) for j in paid if j["real"] == (kind == "true"))}
            for kind, values in (("true", true), ("false", false))]
    result = {"args": vars(args), "hold": hold, "holds": holds, "threshold": threshold, "rows": rows,
              "episodes": len(jobs),
              "scripted_uncertainty_percentiles": {p: float(np.percentile(scripted, p)) for p in (50, 90, 99)}}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "rt1_guard.json").write_text(json.dumps(result, indent=1))
    fig, ax = plt.subplots(figsize=(6, 4))
    bins = np.linspace(0, max(scripted + true + false + [threshold]) * 1.05, 30)
    ax.hist(true, bins, alpha=0.6, label="success the real env also gives")
    ax.hist(false, bins, alpha=0.6, label="success the real env never gives")
    ax.axvline(threshold, color="k", ls="--", label="halt threshold (scripted p99)")
    ax.set(xlabel="uncertainty at the step success is called (nats per code)", ylabel="episodes",
           title=f"{args.checkpoint}: uncertainty of learned successes (hold {hold})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "rt1_guard.png", dpi=110)
    plt.close(fig)
    report = [f"# Guards against false success: {args.checkpoint}, {args.starts} start states per task", "",
              f"{len(jobs)} episodes (scripted skills 1.0, 0.7 and 0.4, and the exploit probe's 16 policies), traced "
              "to the horizon.", "",
              "## Hold: consecutive frames above the threshold before success is called", "", markdown_table(holds), "",
              f"## Uncertainty halt (at the checkpoint's hold, {hold})", "",
              f"Halt threshold {threshold:.3f} nats per code, the 99th percentile over the scripted episodes' steps.",
              "", markdown_table(rows), "", "![uncertainty](rt1_guard.png)", ""]
    (OUT / "rt1_guard.md").write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()

"""Does the learned simulator rank policies the way the real environment does? (real2sim policy evaluation)

    rlvr-gym evaluate-policies rt1 --checkpoint rt1-rlvr --episodes 4
    rlvr-gym evaluate-policies rt1 --sb3 ppo:runs/agents/rt1-ppo/model.zip

A ladder of policies (scripted at several skill levels, SB3 checkpoints) runs in the real MuJoCo tabletop and in the
learned RLVRWorld-RT1-v0 from the same initial states: the checkpoint's `initial_states.npz` holds real first frames
with the task and env seed they were collected with, and `RealRT1Env(task).reset(seed)` reproduces each frame (checked).
Success in the learned env is the world model's own (`info["is_success"]`: the task's test on the state its state
reader reads off the frame shown, or without a reader its success flag; the probability above the checkpoint's
per-task threshold from `rlvr-gym calibrate rt1`), never the real env's.

Scripted policies act on the true state, which the learned env does not have. They therefore run in the real env for
the full horizon (scored at their first success, as the real env's termination would; they keep acting afterwards only
to supply actions), and the learned env replays that action sequence open loop from the same frame, ending at its own
predicted success or the horizon. A difference between the two is then the world model's alone. SB3 policies act
closed loop on frames in both envs.

Metrics follow SIMPLER (Li et al. 2024, "Evaluating Real-World Robot Manipulation Policies in Simulation"),
simpler-env `simpler_env/utils/metrics.py`: every function takes (sim, real) in that order, one success rate per policy.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from tqdm import tqdm

from rlvr_gym.data.episodes import info_state
from rlvr_gym.data.robot import InitialStates, load_initial_states
from rlvr_gym.models.lm import CheckpointError
from rlvr_gym.models.robot_world_model import RobotWorldModel
from rlvr_gym.sim.robot import DEFAULT_HORIZON, STATE_OBSERVATION_NAMES, RT1WorldVectorEnv, state_observation

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

SB3_ALGOS = ("ppo", "sac")
FRAME_MATCH_TOLERANCE = 2.0
"""Largest mean |difference| (0-255) between a shipped initial frame and the real env's reset frame: other GL backends
render a few pixels differently; another layout differs by far more."""


# ---------------------------------------------------------------------------------------------------- metrics


def _paired(sim: Sequence[float], real: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    s, r = np.asarray(sim, dtype=np.float64), np.asarray(real, dtype=np.float64)
    if s.shape != r.shape or s.ndim != 1 or len(s) == 0:
        raise ValueError(f"sim and real must be non-empty 1-D sequences of equal length, one score per policy; "
                         f"got shapes {s.shape} and {r.shape}")
    return s, r


def pearson(sim: Sequence[float], real: Sequence[float]) -> float:
    """Pearson correlation between sim and real per-policy scores, as SIMPLER's `pearson_correlation(perf_sim,
    perf_real)`: 1.0 when the centred vectors are identical (including both constant), 0.0 when only one is constant."""
    s, r = _paired(sim, real)
    s, r = s - s.mean(), r - r.mean()
    if np.all(s == r):
        return 1.0
    return float(np.sum(s * r) / (np.sqrt(np.sum(s**2) * np.sum(r**2)) + 1e-8))


def mmrv(sim: Sequence[float], real: Sequence[float]) -> float:
    """Mean Maximum Rank Violation, as SIMPLER's `mean_maximum_rank_violation(perf_sim, perf_real)`.

    For each policy i: the largest real gap |real_i - real_j| over the policies j where `sim_i > sim_j` disagrees with
    `real_i > real_j`; then the mean over i. Comparisons are strict, so a tie in the simulator against a strict real
    order is a violation (costing the real gap), while a real tie costs nothing. Lower is better; 0 is a perfect ranking.
    """
    s, r = _paired(sim, real)
    wrong = (s[:, None] > s[None, :]) != (r[:, None] > r[None, :])
    gaps = np.where(wrong, np.abs(r[:, None] - r[None, :]), 0.0)
    return float(gaps.max(axis=1).mean())


def mae(sim: Sequence[float], real: Sequence[float]) -> float:
    """Mean absolute difference between sim and real per-policy scores."""
    s, r = _paired(sim, real)
    return float(np.abs(s - r).mean())


# ---------------------------------------------------------------------------------------------------- policies

Actor = Callable[[np.ndarray], np.ndarray]
"""A batch of what the learned env shows, 64x64 frames (N, 64, 64, 3) uint8 or with `observation="state"` state
observations (N, len(STATE_OBSERVATION_NAMES)) -> actions (N, 7)."""
RealActor = Callable[[np.ndarray, dict], np.ndarray]
"""(real frame, real info) -> action (7,): one step of a policy in the real tabletop."""


def policy_frames(frames: np.ndarray, size: int) -> np.ndarray:
    """uint8 frames (..., 64, 64, 3) -> (..., size, size, 3) by block means; `size` must divide 64."""
    height = frames.shape[-3]
    if size < 1 or height % size:
        raise ValueError(f"frame size {size} must divide the frames' {height} pixels (e.g. 16, 32 or 64)")
    k = height // size
    if k == 1:
        return frames
    blocks = frames.reshape(*frames.shape[:-3], size, k, size, k, frames.shape[-1]).astype(np.float32)
    return np.rint(blocks.mean(axis=(-4, -2))).astype(np.uint8)


def sb3_frame_size(model: BaseAlgorithm) -> int:
    """The frame size an SB3 model was trained on: its observation space is (s, s, 3), or (3, s, s) once SB3 has
    transposed the images for torch."""
    shape = model.observation_space.shape
    if len(shape) != 3 or 3 not in (shape[0], shape[-1]) or shape[1] not in (shape[0], shape[-1]):
        raise ValueError(f"the SB3 model's observations have shape {shape}; it must act on RGB frames (s, s, 3)")
    return int(shape[1])


def acts_on_state(model: BaseAlgorithm) -> bool:
    """Whether an SB3 model observes the tabletop's state (STATE_OBSERVATION_NAMES) rather than frames."""
    return tuple(model.observation_space.shape) == (len(STATE_OBSERVATION_NAMES),)


def sb3_actor(model: BaseAlgorithm) -> Actor:
    """Deterministic actions of an SB3 model on a batch of 64x64 frames, downsampled to the size it was trained on;
    a model on the state takes the learned env's state observations as they are."""
    if acts_on_state(model):
        return lambda obs: np.asarray(model.predict(obs, deterministic=True)[0], np.float32).reshape(len(obs), -1)
    size = sb3_frame_size(model)

    def act(frames: np.ndarray) -> np.ndarray:
        actions, _ = model.predict(policy_frames(frames, size), deterministic=True)
        return np.asarray(actions, dtype=np.float32).reshape(len(frames), -1)

    return act


def sb3_real_actor(model: BaseAlgorithm) -> RealActor:
    """One deterministic action of an SB3 model in the real tabletop: on the frame, or for a model on the state on
    the true state and target the real env's info holds (what `agents.robot.StateObservation` shows it)."""
    if acts_on_state(model):
        def act(_frame: np.ndarray, info: dict) -> np.ndarray:
            observation = state_observation(info_state(info), info["target_pos"])
            return np.asarray(model.predict(observation, deterministic=True)[0], np.float32).reshape(-1)

        return act
    batch_act = sb3_actor(model)
    return lambda frame, _info: batch_act(frame[None])[0]


def load_sb3(spec: str) -> BaseAlgorithm:
    """Load "ALGO:PATH" (ALGO in ppo, sac) as an SB3 model on the CPU."""
    algo, _, path = spec.partition(":")
    if algo not in SB3_ALGOS or not path:
        raise ValueError(f"SB3 policy {spec!r} must be 'ALGO:PATH' with ALGO in {SB3_ALGOS}, e.g. ppo:runs/agents/rt1-ppo/model.zip")
    if not Path(path).is_file():
        raise FileNotFoundError(f"SB3 checkpoint {path} does not exist; train one with `python -m agents.train_sb3`")
    from stable_baselines3 import PPO, SAC

    return {"ppo": PPO, "sac": SAC}[algo].load(path, device="cpu")


def scripted_seed(seed: int, env_seed: int) -> int:
    """The scripted policy's own seed for an episode: one stream per (evaluation seed, initial state), the same at
    every skill level, so the ladder's rungs differ by skill rather than by luck."""
    return int(np.random.SeedSequence([seed, env_seed]).generate_state(1)[0])


# ---------------------------------------------------------------------------------------------------- rollouts


@dataclass
class RealRollout:
    success: bool
    """Whether the task was solved within the horizon (the real env's termination)."""
    steps: int
    """Steps to the first success, or the horizon."""
    actions: np.ndarray
    """(T, 7) actions taken: up to the first success, or to the horizon when run with `to_horizon`."""


def real_rollout(env, seed: int, act: Callable[[np.ndarray, dict], np.ndarray], to_horizon: bool = False,
                 expected_frame: np.ndarray | None = None) -> RealRollout:
    """One episode of a RealRT1Env (unwrapped) from `reset(seed)`; `act(frame, info)` gives each action.

    With `to_horizon` the policy keeps acting after success until the horizon (success is still the first one).
    `expected_frame`: the reset frame must match it, or CheckpointError says the initial state cannot be reproduced.
    """
    frame, info = env.reset(seed=seed)
    if expected_frame is not None:
        gap = float(np.abs(frame.astype(np.float32) - expected_frame).mean())
        if gap > FRAME_MATCH_TOLERANCE:
            raise CheckpointError(
                f"the real env reset with task {info['task']!r} and seed {seed} gives a frame {gap:.1f} levels away from "
                "the checkpoint's initial state: envs/robot changed since the checkpoint was made; write its initial "
                "states again with rlvr_gym.sim.robot.save_initial_states from episodes of the current env"
            )
    actions, first_success = [], None
    for step in range(1, env.horizon + 1):
        actions.append(np.asarray(act(frame, info), dtype=np.float32))
        frame, _, terminated, _, info = env.step(actions[-1])
        if terminated and first_success is None:
            first_success = step
            if not to_horizon:
                break
    return RealRollout(first_success is not None, first_success or env.horizon, np.stack(actions))


@dataclass
class Job:
    """One learned-env episode: an initial-state row and either actions to replay or an SB3 policy to act."""

    row: int
    actions: np.ndarray | None = None
    actor: Actor | None = None


def learned_rollouts(venv: RT1WorldVectorEnv, jobs: Sequence[Job], seed: int = 0) -> list[tuple[bool, int, float]]:
    """Run every job in the learned vector env (autoreset DISABLED) as a work queue: a sub-env whose episode ends
    starts the next job. Returns (success from the success head, steps, highest success probability) per job."""
    n = venv.num_envs
    queue = deque(range(len(jobs)))
    slots: list[int | None] = [queue.popleft() if queue else None for _ in range(n)]
    rows = [jobs[j].row if j is not None else 0 for j in slots]
    obs, _ = venv.reset(seed=seed, options={"index": rows})
    steps = np.zeros(n, dtype=int)
    best = np.zeros(n)
    results: list[tuple[bool, int, float] | None] = [None] * len(jobs)
    bar = tqdm(total=len(jobs), desc="learned env", unit="episode", leave=False)
    while any(j is not None for j in slots):
        actions = np.zeros((n, 7), dtype=np.float32)
        by_actor: dict[int, tuple[Actor, list[int]]] = {}
        for i, j in enumerate(slots):
            if j is None:
                continue
            if jobs[j].actions is not None:
                actions[i] = jobs[j].actions[steps[i]]
            else:
                by_actor.setdefault(id(jobs[j].actor), (jobs[j].actor, []))[1].append(i)
        for actor, batch in by_actor.values():
            actions[batch] = actor(obs[batch])
        obs, _, terminated, truncated, infos = venv.step(actions)
        steps += 1
        best = np.maximum(best, infos["success_prob"])
        ended = terminated | truncated
        if ended.any():
            index: list[int | None] = [None] * n
            for i in np.flatnonzero(ended):
                if slots[i] is not None:
                    results[slots[i]] = (bool(terminated[i]), int(steps[i]), float(best[i]))
                    bar.update()
                # Idle sub-envs (queue empty) still step with the batch; they restart at row 0 and are ignored.
                slots[i] = queue.popleft() if queue else None
                index[i] = jobs[slots[i]].row if slots[i] is not None else 0
                steps[i], best[i] = 0, 0.0
            obs, _ = venv.reset(options={"reset_mask": ended, "index": index})
    bar.close()
    return results


# ---------------------------------------------------------------------------------------------------- the ladder


@dataclass
class RT1PolicyEvalConfig:
    checkpoint: str = "rt1-rlvr"
    """World model: a shipped name (rt1-mle, rt1-rlvr) or a directory with initial_states.npz."""
    episodes: int = 4
    """Initial states per task: the first N of each task in the checkpoint's initial_states.npz (16 shipped)."""
    seed: int = 0
    """Seeds the scripted policies' noise (with each initial state's env seed) and the learned env."""
    task: str | None = None
    """Evaluate on this task only (open_drawer, close_drawer, move_near, push_to_target); default: every task."""
    skills: tuple[float, ...] = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)
    """Skill levels of the scripted policies (1 = expert, 0 = noisiest, most delays, most often the wrong target)."""
    sb3: tuple[str, ...] = ()
    """SB3 checkpoints as ALGO:PATH (ppo or sac), e.g. ppo:runs/agents/rt1-ppo/model.zip; they act on frames."""
    horizon: int = DEFAULT_HORIZON
    """Steps per episode in both envs."""
    num_envs: int = 32
    """Sub-envs of the learned vector env (one batched world-model step each)."""
    temperature: float = 0.0
    """Sampling temperature of the learned env's frames (0: greedy)."""
    out: str = ""
    """Directory for results.json, table.md and scatter.png; default runs/policy_eval/<checkpoint name>."""


def select_rows(states: InitialStates, task: str | None, episodes: int) -> np.ndarray:
    """Rows of the first `episodes` initial states of each task (or of `task`), checked to be reproducible."""
    tasks = sorted(set(states.tasks.tolist())) if task is None else [task]
    rows = []
    for name in tasks:
        found = np.flatnonzero(states.tasks == name)
        if len(found) < episodes:
            raise ValueError(f"the checkpoint has {len(found)} initial states for task {name!r}, fewer than --episodes "
                             f"{episodes}; lower --episodes (tasks available: {sorted(set(states.tasks.tolist()))})")
        rows.extend(found[:episodes].tolist())
    rows = np.array(rows)
    if (states.seeds[rows] < 0).any():
        raise ValueError("some initial states come from imported episodes (seed -1), which the real env cannot "
                         "reproduce; evaluate a checkpoint whose initial states were collected with `rlvr-gym collect rt1`")
    return rows


def run_rt1_policy_eval(config: RT1PolicyEvalConfig) -> dict:
    # MuJoCo loads only where real episodes run: the metrics above import without it.
    from envs.robot import TASKS, RealRT1Env, make_scripted_policy

    if config.episodes < 1 or config.horizon < 1 or config.num_envs < 1:
        raise ValueError("episodes, horizon and num_envs must be >= 1")
    if config.task is not None and config.task not in TASKS:
        raise ValueError(f"unknown task {config.task!r}: use one of {TASKS}")
    if len(set(config.skills)) != len(config.skills) or not all(0.0 <= s <= 1.0 for s in config.skills):
        raise ValueError(f"skills must be distinct values in [0, 1], got {config.skills}")
    torch.set_num_threads(1)
    states = load_initial_states(RobotWorldModel.resolve(config.checkpoint))
    rows = select_rows(states, config.task, config.episodes)
    names = [f"scripted-{s:.1f}" for s in config.skills] + list(config.sb3)
    if len(names) < 2:
        raise ValueError("a ladder needs at least two policies: give more --skills or --sb3 checkpoints")
    models = {spec: load_sb3(spec) for spec in config.sb3}
    on_state = [spec for spec, model in models.items() if acts_on_state(model)]
    if on_state:
        raise ValueError(f"{on_state} act on the tabletop's state; this evaluation's learned env shows frames "
                         "(score them with agents.robot.evaluate_in_real and in RLVRWorld-RT1-v0(observation='state'))")
    actors = {spec: sb3_actor(model) for spec, model in models.items()}

    real_envs = {name: RealRT1Env(task=name, horizon=config.horizon) for name in sorted(set(states.tasks[rows].tolist()))}
    records, jobs = [], []
    for row in tqdm(rows, desc="real env", unit="state", leave=False):
        task, env_seed = str(states.tasks[row]), int(states.seeds[row])
        env = real_envs[task]
        for skill, name in zip(config.skills, names):
            policy = make_scripted_policy(task, skill, scripted_seed(config.seed, env_seed))
            real = real_rollout(env, env_seed, policy, to_horizon=True, expected_frame=states.frames[row])
            records.append({"policy": name, "task": task, "row": int(row), "env_seed": env_seed,
                            "real_success": real.success, "real_steps": real.steps})
            jobs.append(Job(int(row), actions=real.actions))
        for spec, actor in actors.items():
            real = real_rollout(env, env_seed, lambda frame, _info: actor(frame[None])[0], expected_frame=states.frames[row])
            records.append({"policy": spec, "task": task, "row": int(row), "env_seed": env_seed,
                            "real_success": real.success, "real_steps": real.steps})
            jobs.append(Job(int(row), actor=actor))
    for env in real_envs.values():
        env.close()

    venv = RT1WorldVectorEnv(num_envs=min(config.num_envs, len(jobs)), checkpoint=config.checkpoint, horizon=config.horizon,
                             temperature=config.temperature, autoreset_mode=AutoresetMode.DISABLED)
    for record, (success, steps, prob) in zip(records, learned_rollouts(venv, jobs, config.seed)):
        record.update(learned_success=success, learned_steps=steps, learned_max_success_prob=prob)
    venv.close()

    result = summarize(records, names)
    out = Path(config.out or Path("runs/policy_eval") / Path(config.checkpoint).name)
    out.mkdir(parents=True, exist_ok=True)
    full = {"config": {**vars(config), "skills": list(config.skills), "sb3": list(config.sb3)}, **result, "episodes": records}
    (out / "results.json").write_text(json.dumps(full, indent=2))
    (out / "table.md").write_text(markdown_report(result, config.checkpoint))
    scatter_plot(result, out / "scatter.png", title=f"{Path(config.checkpoint).name}: learned vs real success")
    return {"checkpoint": config.checkpoint, "episodes_per_task": config.episodes, **result, "out": str(out)}


def summarize(records: list[dict], names: Sequence[str]) -> dict:
    """Per-policy success (overall and per task) in both envs, and pearson / mmrv / mae over the policies."""
    tasks = sorted({r["task"] for r in records})

    def rate(policy: str, key: str, task: str | None = None) -> float:
        hits = [r[key] for r in records if r["policy"] == policy and (task is None or r["task"] == task)]
        return float(np.mean(hits))

    policies = {name: {"real": rate(name, "real_success"), "learned": rate(name, "learned_success"),
                       "per_task": {t: {"real": rate(name, "real_success", t), "learned": rate(name, "learned_success", t)}
                                    for t in tasks}}
                for name in names}

    def metrics(task: str | None) -> dict[str, float]:
        cells = [p if task is None else p["per_task"][task] for p in policies.values()]
        sim, real = [c["learned"] for c in cells], [c["real"] for c in cells]
        return {"pearson": pearson(sim, real), "mmrv": mmrv(sim, real), "mae": mae(sim, real)}

    return {"policies": policies, **metrics(None), "per_task": {t: metrics(t) for t in tasks}}


def markdown_report(result: dict, checkpoint: str) -> str:
    tasks = list(result["per_task"])
    lines = [f"# Policy evaluation: {Path(checkpoint).name} (learned) vs the MuJoCo tabletop (real)", "",
             "Success rate per policy; `real / learned` per task.", "",
             "| policy | real | learned | " + " | ".join(tasks) + " |", "|" + "---|" * (3 + len(tasks))]
    for name, p in result["policies"].items():
        cells = [f"{p['per_task'][t]['real']:.2f} / {p['per_task'][t]['learned']:.2f}" for t in tasks]
        lines.append(f"| {name} | {p['real']:.3f} | {p['learned']:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "| scope | pearson | mmrv | mae |", "|---|---|---|---|",
              f"| all tasks | {result['pearson']:.3f} | {result['mmrv']:.3f} | {result['mae']:.3f} |"]
    lines += [f"| {t} | {m['pearson']:.3f} | {m['mmrv']:.3f} | {m['mae']:.3f} |" for t, m in result["per_task"].items()]
    return "\n".join(lines) + "\n"


def scatter_plot(result: dict, path: str | Path, title: str = "") -> Path:
    """Learned vs real success: one point per (policy, task), coloured by task; black stars for all tasks together."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], "--", color="grey", lw=1)
    for k, task in enumerate(result["per_task"]):
        cells = [p["per_task"][task] for p in result["policies"].values()]
        ax.scatter([c["real"] for c in cells], [c["learned"] for c in cells], color=f"C{k}", alpha=0.6, label=task)
    points: dict[tuple[float, float], list[str]] = {}
    for name, p in result["policies"].items():
        points.setdefault((p["real"], p["learned"]), []).append(name)
    for (real, learned), names in points.items():  # policies on the same spot share one label
        ax.scatter(real, learned, marker="*", s=120, color="black")
        short = [re.sub(r"^(\w+):.*?([^/]+?)(/model)?\.zip$", r"\1:\2", n) for n in names]  # ppo:DIR/model.zip -> ppo:DIR
        ax.annotate(", ".join(short), (real, learned), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set(xlim=(-0.05, 1.05), ylim=(-0.05, 1.05), xlabel="real success", ylabel="learned-sim success (success head)")
    ax.set_title(f"{title}\npearson {result['pearson']:.2f}  mmrv {result['mmrv']:.2f}  mae {result['mae']:.2f}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

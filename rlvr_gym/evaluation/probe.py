"""Does a learned simulator pay out success that the real env never gives? (the exploit probe)

    rlvr-gym probe rt1 --checkpoint rt1-rlvr
    rlvr-gym probe textgame --checkpoint textgame-rlvr
    rlvr-gym probe web --checkpoint web-rlvr

A fixed set of trivial and adversarial policies runs in the learned and in the real env from the same start states:
doing nothing, uniform random actions, and for the tabletop one constant full-scale action per axis and sign; for
text games the same command repeated and always the candidate list's first entry; for web pages
`envs.web.solvers.TRIVIAL_POLICIES` (the last button, Submit with nothing filled, the first candidate action, a
uniform random candidate). None of them does the task on purpose, so success the learned env pays
them and the real env does not is success an optimising agent would learn to collect. Per policy: learned success,
real success, and false success = max(0, learned - real). The RT-1 policies are open loop, so both envs get the
same actions; the text and web policies read each env's own state. For web pages the probe also reports each
policy's outcome match: the share of episodes where the learned env's outcome, success and termination, is the real
one's (a failure the real env ends with -1 must end in the learned env too, not run on unpaid).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.files import path_label


@dataclass
class ProbeConfig:
    checkpoint: str = ""
    """World model with its start states: a shipped name or a directory; empty: the domain's default env checkpoint."""
    starts: int = 6
    """Start states per task (RT-1, web) or in all (text)."""
    steps: int = 0
    """Steps per episode in both envs; 0: the domain's default (50 tabletop, 30 text, 5 web)."""
    seed: int = 0
    """Seeds the random policy and the learned env."""
    out: str = ""
    """Directory for probe.json and probe.md; empty: runs/probe/<domain>-<checkpoint path, "/" as "_">."""


def summarize(domain: str, checkpoint: str, learned: dict[str, list[bool]], real: dict[str, list[bool]],
              matched: dict[str, list[bool]] | None = None) -> dict:
    """Per policy: episodes, learned and real success rates, false success, and the 95% interval of learned minus real
    over the paired episodes (normal approximation: a few dozen episodes leave a gap of several points unresolved);
    then the false successes' mean and maximum. `matched` (web) adds each policy's share of episodes whose outcome,
    success and termination, the learned env got right."""
    rows = []
    for name in learned:
        l, r = float(np.mean(learned[name])), float(np.mean(real[name]))
        gap = np.asarray(learned[name], float) - np.asarray(real[name], float)
        half = 1.96 * float(gap.std(ddof=1)) / np.sqrt(len(gap)) if len(gap) > 1 else None
        interval = None if half is None else [l - r - half, l - r + half]
        rows.append({"policy": name, "episodes": len(learned[name]), "learned_success": l, "real_success": r,
                     "false_success": max(0.0, l - r), "gap_95ci": interval})
        if matched is not None:
            rows[-1]["outcome_match"] = float(np.mean(matched[name]))
    false = [row["false_success"] for row in rows]
    return {"domain": domain, "checkpoint": str(checkpoint), "policies": rows,
            "mean_false_success": float(np.mean(false)), "max_false_success": float(np.max(false))}


def write_report(result: dict, config: ProbeConfig) -> dict:
    out = Path(config.out or Path("runs/probe") / f"{result['domain']}-{path_label(result['checkpoint'])}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps({"config": vars(config), **result}, indent=2))
    title = f"# Exploit probe: {result['domain']}, {result['checkpoint']}\n\n"
    summary = (f"Mean false success {result['mean_false_success']:.3f}, "
               f"largest {result['max_false_success']:.3f} (learned success the real env did not give).\n\n")
    rows = [{**row, "gap_95ci": "{:+.3f} to {:+.3f}".format(*row["gap_95ci"]) if row["gap_95ci"] else "-"}
            for row in result["policies"]]
    text = title + summary + markdown_table(rows, digits=3) + "\n"
    if "false_success_per_task" in result:
        text += ("\nPer task, over every policy's episodes (most_false: the policy with the most false success):\n\n"
                 + markdown_table(result["false_success_per_task"], digits=3) + "\n")
    if "outcome_match_per_task" in result:
        text += ("\nOutcome match per task (share of start pages where the learned success and termination are the "
                 "real ones):\n\n" + markdown_table(result["outcome_match_per_task"], digits=3) + "\n")
    (out / "probe.md").write_text(text)
    # Per-episode records stay in probe.json: the command prints the summary as one line.
    return {**{k: v for k, v in result.items() if k != "episodes"}, "out": str(out)}


# ---------------------------------------------------------------------------------------------------- RT-1


def rt1_probe_actions(horizon: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The open-loop policies as (horizon, 7) action sequences: no-op, uniform random, and +-1 on each axis alone
    (`envs.robot.policies.TRIVIAL_POLICIES`)."""
    from envs.robot.policies import TRIVIAL_POLICIES, trivial_action

    actions = {name: np.tile(trivial_action(name), (horizon, 1)) for name in TRIVIAL_POLICIES}
    random = rng.uniform(-1, 1, (horizon, 7)).astype(np.float32)
    return {"no-op": actions.pop("no-op"), "uniform-random": random, **actions}


def real_probe_episodes(checkpoint: str, starts: int, horizon: int, seed: int) -> list[dict]:
    """Every probe policy from the checkpoint's first `starts` initial states per task in the real tabletop:
    {"row", "task", "policy", "actions" (horizon, 7), "real" (success)} per episode."""
    from envs.robot import RealRT1Env
    from rlvr_gym.data.robot import load_initial_states
    from rlvr_gym.evaluation.policies import real_rollout, select_rows
    from rlvr_gym.models.robot_world_model import RobotWorldModel

    states = load_initial_states(RobotWorldModel.resolve(checkpoint))
    rows = select_rows(states, None, starts)
    envs = {task: RealRT1Env(task=task, horizon=horizon) for task in sorted(set(states.tasks[rows].tolist()))}
    episodes = []
    try:
        for row in tqdm(rows, desc="real env", unit="state", leave=False):
            task, env_seed = str(states.tasks[row]), int(states.seeds[row])
            for name, actions in rt1_probe_actions(horizon, np.random.default_rng([seed, env_seed])).items():
                steps = iter(actions)
                outcome = real_rollout(envs[task], env_seed, lambda _frame, _info: next(steps),
                                       expected_frame=states.frames[row])
                episodes.append({"row": int(row), "task": task, "policy": name, "actions": actions,
                                 "real": outcome.success})
    finally:
        for env in envs.values():
            env.close()
    return episodes


def probe_rt1(config: ProbeConfig) -> dict:
    """The probe in the MuJoCo tabletop and RLVRWorld-RT1-v0 from the checkpoint's initial states."""
    from gymnasium.vector import AutoresetMode

    from rlvr_gym.evaluation.policies import Job, learned_rollouts
    from rlvr_gym.sim.robot import DEFAULT_CHECKPOINT, DEFAULT_HORIZON, RT1WorldVectorEnv

    torch.set_num_threads(1)
    checkpoint = config.checkpoint or DEFAULT_CHECKPOINT
    horizon = config.steps or DEFAULT_HORIZON
    episodes = real_probe_episodes(checkpoint, config.starts, horizon, config.seed)
    jobs = [Job(e["row"], actions=e["actions"]) for e in episodes]
    venv = RT1WorldVectorEnv(num_envs=min(32, len(jobs)), checkpoint=checkpoint, horizon=horizon,
                             autoreset_mode=AutoresetMode.DISABLED)
    learned_all = [success for success, _, _ in learned_rollouts(venv, jobs, config.seed)]
    venv.close()
    learned: dict[str, list[bool]] = {}
    real: dict[str, list[bool]] = {}
    for episode, success in zip(episodes, learned_all):
        learned.setdefault(episode["policy"], []).append(success)
        real.setdefault(episode["policy"], []).append(episode["real"])
    tasks, names = [e["task"] for e in episodes], [e["policy"] for e in episodes]
    return write_report({**summarize("rt1", checkpoint, learned, real),
                         "false_success_per_task": per_task_false_success(tasks, names, learned_all,
                                                                          [e["real"] for e in episodes])}, config)


def per_task_false_success(tasks: list[str], names: list[str], learned: list[bool], real: list[bool]) -> list[dict]:
    """Per task, `summarize` of its episodes: learned and real success over every policy, the mean of the policies'
    false success, and the policy with the most."""
    rows = []
    for task in dict.fromkeys(tasks):
        learned_here: dict[str, list[bool]] = {}
        real_here: dict[str, list[bool]] = {}
        for t, name, l, r in zip(tasks, names, learned, real):
            if t == task:
                learned_here.setdefault(name, []).append(l)
                real_here.setdefault(name, []).append(r)
        summary = summarize("rt1", "", learned_here, real_here)
        worst = max(summary["policies"], key=lambda row: row["false_success"])
        rows.append({"task": task,
                     "learned_success": float(np.mean([x for v in learned_here.values() for x in v])),
                     "real_success": float(np.mean([x for v in real_here.values() for x in v])),
                     "false_success": summary["mean_false_success"],
                     "most_false": f"{worst['policy']} ({worst['false_success']:.2f})"})
    return rows


# ---------------------------------------------------------------------------------------------------- text game


def _default_game_dir() -> str:
    from envs.textworld import DEFAULT_GAME_DIR

    return str(DEFAULT_GAME_DIR)


@dataclass
class TextProbeConfig(ProbeConfig):
    game_dir: str = field(default_factory=_default_game_dir)
    """Where the real games are regenerated (a cache)."""
    halt_uncertainty: float | None = None
    """The learned env's guard (`RLVRWorld-TextGame-v0`'s `halt_uncertainty`); None: off."""
    win_check: str = ""
    """The learned env's second world model (`RLVRWorld-TextGame-v0`'s `win_check`); empty: off."""


class RepeatFirst:
    """The same command every step: the first candidate of the state it first sees."""

    def __init__(self):
        self.command: str | None = None

    def __call__(self, candidates: list[str]) -> str:
        from rlvr_gym.sim.textgame import NOOP_COMMAND

        if self.command is None:
            self.command = candidates[0] if candidates else NOOP_COMMAND
        return self.command


def text_probe_policies(seed: int, episode: int) -> dict[str, Callable[[list[str]], str]]:
    from rlvr_gym.sim.textgame import NOOP_COMMAND

    rng = np.random.default_rng([seed, episode])
    return {
        "no-op": lambda _candidates: NOOP_COMMAND,
        "uniform-random": lambda candidates: candidates[rng.integers(len(candidates))] if candidates else NOOP_COMMAND,
        "repeat-first-command": RepeatFirst(),
        "first-candidate": lambda candidates: candidates[0] if candidates else NOOP_COMMAND,
    }


def probe_textgame(config: TextProbeConfig) -> dict:
    """The probe in real TextWorld and RLVRWorld-TextGame-v0 from the checkpoint's start states."""
    from rlvr_gym.evaluation.textgame_policies import play_learned, play_real
    from rlvr_gym.sim.textgame import DEFAULT_CHECKPOINT, DEFAULT_MAX_STEPS, TextGameSimulator

    torch.set_num_threads(1)
    checkpoint = config.checkpoint or DEFAULT_CHECKPOINT
    max_steps = config.steps or DEFAULT_MAX_STEPS
    sim = TextGameSimulator(checkpoint, 0.0, halt_uncertainty=config.halt_uncertainty, win_check=config.win_check)
    indices = [e % len(sim.starts) for e in range(config.starts)]
    names = list(text_probe_policies(0, 0))
    runs = [(name, e) for name in names for e in range(config.starts)]
    # Each env gets its own policy objects: a policy that remembers (RepeatFirst) must not carry one env's
    # memory into the other.
    real_won, _ = play_real(sim.starts, [indices[e] for _, e in runs],
                             [text_probe_policies(config.seed, e)[n] for n, e in runs], max_steps, config.game_dir)
    learned_won, _, _ = play_learned(sim, [indices[e] for _, e in runs],
                                      [text_probe_policies(config.seed, e)[n] for n, e in runs], max_steps, config.seed)
    learned = {n: [bool(w) for (m, _), w in zip(runs, learned_won) if m == n] for n in names}
    real = {n: [bool(w) for (m, _), w in zip(runs, real_won) if m == n] for n in names}
    if not config.out and (config.halt_uncertainty is not None or config.win_check):  # a guarded probe: its own report
        guard = f"-halt{config.halt_uncertainty:g}" if config.halt_uncertainty is not None else ""
        guard += f"-check-{path_label(config.win_check)}" if config.win_check else ""
        config = replace(config, out=str(Path("runs/probe") / f"textgame-{path_label(checkpoint)}{guard}"))
    return write_report(summarize("textgame", checkpoint, learned, real), config)


# ---------------------------------------------------------------------------------------------------- web


def play_web(step: Callable[[str], tuple[str, float, bool, bool]], utterance: str, tree: str,
             policy: Callable[[str, str], str | None], max_steps: int) -> tuple[bool, bool]:
    """One episode from `tree`; `step(action) -> (tree, reward, terminated, truncated)`. Returns (success: the
    return says the task was done, `envs.web.task_done`; terminated)."""
    from envs.web import task_done

    total, terminated = 0.0, False
    for _ in range(max_steps):
        action = policy(utterance, tree)
        if action is None:
            break
        tree, reward, terminated, truncated = step(action)
        total += reward
        if terminated or truncated:
            break
    return task_done(total), terminated


@dataclass
class WebProbeConfig(ProbeConfig):
    tasks: tuple[str, ...] = ()
    """Tasks whose start pages are probed; empty: every task the checkpoint has start pages of."""
    random_draws: int = 1
    """uniform-random episodes per start page, each with its own draws (the other policies are deterministic):
    a checkpoint keeps 8 start pages per task, too few episodes to resolve a gap of a few points."""


def probe_web(config: WebProbeConfig) -> dict:
    """The probe in real MiniWoB++ (Chromium) and RLVRWorld-Web-v0 from the checkpoint's start pages."""
    from envs.web import WebTaskEnv
    from envs.web.solvers import TRIVIAL_POLICIES, trivial_policy
    from rlvr_gym.sim.web import DEFAULT_CHECKPOINT, WebWorldEnv, load_start_pages

    torch.set_num_threads(1)
    checkpoint = config.checkpoint or DEFAULT_CHECKPOINT
    max_steps = config.steps or 5
    pages = load_start_pages(checkpoint)
    tasks = list(config.tasks) or list(dict.fromkeys(p.task for p in pages))
    unknown = sorted(set(tasks) - {p.task for p in pages})
    if unknown:
        raise ValueError(f"{checkpoint} has no start pages of {unknown}; it has {sorted({p.task for p in pages})}")
    chosen = [i for task in tasks for i in [j for j, p in enumerate(pages) if p.task == task][: config.starts]]
    sim = WebWorldEnv(checkpoint, max_steps=max_steps)

    def sim_step(action: str) -> tuple[str, float, bool, bool]:
        _, reward, terminated, truncated, info = sim.step(action)
        return info["tree"], reward, terminated, truncated

    learned: dict[str, list[bool]] = {}
    real: dict[str, list[bool]] = {}
    matched: dict[str, list[bool]] = {}
    matched_per_task: dict[str, dict[str, list[bool]]] = {}
    episodes = []
    env = None
    try:
        for e, index in enumerate(tqdm(chosen, desc="start pages", unit="page", leave=False)):
            page = pages[index]
            if env is None:
                env = WebTaskEnv(page.task, max_steps=max_steps)
            elif env.task != page.task:
                env.load_task(page.task)
            for name, draw in [(n, d) for n in TRIVIAL_POLICIES
                               for d in range(config.random_draws if n == "uniform-random" else 1)]:
                # Each env gets its own copy of the policy, so uniform-random starts from the same draws in both.
                policy_seed = config.seed * 1_000_003 + e + draw * 7_919
                real_actions, learned_actions = [], []
                utterance, tree, _ = env.reset(seed=page.seed)
                real_outcome = play_web(lambda a: env.step(a)[:4], utterance, tree,
                                        recorded(trivial_policy(name, policy_seed), real_actions), max_steps)
                sim.reset(seed=config.seed, options={"index": index})
                learned_outcome = play_web(sim_step, page.utterance, sim.tree,
                                           recorded(trivial_policy(name, policy_seed), learned_actions), max_steps)
                episodes.append({"task": page.task, "start": index, "policy": name, "draw": draw,
                                 "real": list(real_outcome), "learned": list(learned_outcome),
                                 "real_actions": real_actions, "learned_actions": learned_actions})
                real.setdefault(name, []).append(real_outcome[0])
                learned.setdefault(name, []).append(learned_outcome[0])
                matched.setdefault(name, []).append(learned_outcome == real_outcome)
                matched_per_task.setdefault(page.task, {}).setdefault(name, []).append(learned_outcome == real_outcome)
    finally:
        if env is not None:
            env.close()
    per_task = [{"task": task, **{name: float(np.mean(m)) for name, m in by_policy.items()}}
                for task, by_policy in matched_per_task.items()]
    return write_report({**summarize("web", checkpoint, learned, real, matched), "outcome_match_per_task": per_task,
                         "episodes": episodes}, config)


def recorded(policy: Callable[[str, str], str | None], actions: list[str]) -> Callable[[str, str], str | None]:
    """`policy`, appending each action it takes to `actions` (the probe's per-episode record)."""

    def act(utterance: str, tree: str) -> str | None:
        action = policy(utterance, tree)
        if action is not None:
            actions.append(action)
        return action

    return act

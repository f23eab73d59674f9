"""The web lookahead agent: acting in the REAL MiniWoB++ env, it asks a web world model what each candidate action
would do and takes the one with the best predicted outcome. Compared over the same real episodes with a random
agent and a model-free baseline.

    python -m agents.web_lookahead --checkpoints web-sft web-rlvr web-refit --episodes 110 --seed 2 --out runs/web/lookahead.json

Agents, all choosing among `envs.web.solvers.candidate_actions` of the current real page:
- `random`: a uniformly random candidate.
- `no-lookahead`: the candidate whose element name (and typed text) shares the most words with the utterance,
  among those not taken yet in the episode (nor typing into a filled field, or a text a field already holds); the
  first such in tree order.
- `lookahead:<checkpoint>`: every candidate's next page is predicted in one batched call; candidates are ranked by
  (prediction parses, predicted reward, not a predicted end without reward, the no-lookahead preference, gain in
  utterance words visible on the page, number of changed lines). The model's outcome (reward, a failed end)
  overrides the baseline's choice; its predicted page only breaks the baseline's ties. An earlier order put the
  page's predicted changes before the preference, and the models' invented changes outranked the baseline's
  choice everywhere (seed 1: 42-45% against the baseline's 69%; this order, seed 2: 54-56% against 68%).

Episode i plays task `tasks[i % len(tasks)]` with MiniWoB seed `seed * 1_000_000 + i // len(tasks)`, the same
pages for every agent; a checkpoint trained on any of them is refused. Success is the task done at the end
(`envs.web.task_done`: raw reward 1; click-checkboxes' partial credit is not success). MiniWoB pages end an
episode after 10-30 s of wall time: the world model's thinking is not charged to it (the page's episode timer is
paused while an agent chooses), so every agent gets the same page time per action.

A browser that dies mid-episode is restarted (the env replays the episode); when that fails, the episode counts
as failed with its error and the next one starts in a fresh browser. WebDriver commands time out (envs.web), the
model's output is bounded by `max_new_tokens`, and an episode that runs past `episode_timeout_s` is stopped and
counts as failed.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from envs.web import TASKS, BrowserError, WebTaskEnv, parse, parse_action, task_done
from envs.web.env import BROWSER_ERRORS
from envs.web.solvers import candidate_actions
from rlvr_gym.logs import configure_logging
from rlvr_gym.models.lm import resolve_checkpoint
from rlvr_gym.models.web_outcome import check_not_trained_on
from rlvr_gym.sim.web import Prediction, WebWorldModel, visible_words, words

log = logging.getLogger(__name__)

SEEDS_PER_RUN = 1_000_000
# MiniWoB's episode timer (core.js): stopped while an agent thinks, restarted with the time that was left.
_PAUSE_JS = """
if (typeof core === 'undefined' || core.EP_TIMER === null) return false;
clearTimeout(core.EP_TIMER);
core.EP_TIMER = null;
window.rlvrPausedAt = Date.now();
return true;
"""
_RESUME_JS = """
if (typeof core === 'undefined' || !window.rlvrPausedAt) return false;
core.ept0 += Date.now() - window.rlvrPausedAt;
window.rlvrPausedAt = null;
const left = core.EPISODE_MAX_TIME - (Date.now() - core.ept0);
core.EP_TIMER = setTimeout(function() { core.endEpisode(-1, false, 'timed out'); }, Math.max(0, left));
return true;
"""

Policy = Callable[[str, str, list[str], list[str]], str]
"""(utterance, tree, candidates, actions taken so far in the episode) -> the action to take."""
PolicyMaker = Callable[[int], Policy]
"""A fresh policy for the episode on a MiniWoB seed."""


@dataclass
class LookaheadConfig:
    checkpoints: tuple[str, ...] = ("web-sft", "web-rlvr", "web-refit")
    """World models to look ahead with (shipped names or directories); each one is an agent."""
    episodes: int = 100
    """Real episodes per agent, spread over the tasks in turn."""
    seed: int = 1
    """Episode i plays MiniWoB seed seed * 1_000_000 + i // len(tasks) (held-out pages: training used seed 0)."""
    tasks: tuple[str, ...] = TASKS
    """MiniWoB tasks to play (those the models never saw included)."""
    seen_tasks: tuple[str, ...] = ()
    """Tasks that count as seen; empty: the tasks in the checkpoints' web_training.json."""
    max_steps: int = 10
    """Actions per episode at most."""
    temperature: float = 0.0
    """World-model sampling temperature (0: greedy)."""
    max_new_tokens: int = 768
    """Completion limit of a prediction; a longer one does not parse."""
    batch_size: int = 32
    """Candidates decoded together."""
    episode_timeout_s: float = 300.0
    """Wall time after which an episode is stopped and counts as failed."""
    out: str = ""
    """JSON file for the summary and every episode (empty: print only)."""
    threads: int = 1
    """torch threads."""


# ---------------------------------------------------------------------------------------------------- policies


def random_policy(seed: int) -> Policy:
    """A uniformly random candidate."""
    rng = random.Random(seed)
    return lambda utterance, tree, candidates, taken: rng.choice(candidates)


def utterance_match(
    utterance: str, tree: str, candidates: Sequence[str], taken: Sequence[str]
) -> list[tuple[int, int]]:
    """The no-lookahead preference of each candidate (higher is better): (fresh, words of the element's name and
    typed text that are in the utterance). Fresh: not taken yet in the episode, and for typing, into an empty field
    a text that no field holds yet."""
    wanted = words(utterance)
    nodes = {node.id: node for node in parse(tree)}
    values = {node.props.get("value", "") for node in nodes.values()}
    scores = []
    for action in candidates:
        _, node_id, text = parse_action(action)
        node = nodes.get(node_id)
        name = node.name if node else ""
        fresh = action not in taken and (text is None or (node is not None and not node.props.get("value")
                                                          and text not in values))  # fmt: skip
        scores.append((int(fresh), len((words(name) | words(text or "")) & wanted)))
    return scores


def no_lookahead_policy(utterance: str, tree: str, candidates: list[str], taken: list[str]) -> str:
    """The first candidate with the best `utterance_match`."""
    scores = utterance_match(utterance, tree, candidates, taken)
    return candidates[max(range(len(candidates)), key=lambda i: (scores[i], -i))]


def rank_predictions(
    utterance: str, tree: str, predictions: Sequence[Prediction], taken: Sequence[str] = ()
) -> list[int]:
    """Indices of the predictions, best predicted outcome first (the order is in the module docstring); ties keep
    the candidates' order."""
    wanted = words(utterance)
    before = len(visible_words(tree) & wanted)
    preference = utterance_match(utterance, tree, [p.action for p in predictions], taken)

    def key(i: int) -> tuple:
        p = predictions[i]
        if p.error is not None:
            return (0, 0.0, 0, preference[i], 0, 0)
        gain = len(visible_words(p.tree) & wanted) - before
        return (1, p.reward, int(not (p.done and p.reward <= 0)), preference[i], gain, p.changed)

    return sorted(range(len(predictions)), key=key, reverse=True)


def lookahead_policy(world: WebWorldModel, seed: int = 0) -> Policy:
    """Predict every candidate's outcome with one batched model call and take the best by `rank_predictions`."""
    calls = [0]

    def act(utterance: str, tree: str, candidates: list[str], taken: list[str]) -> str:
        predictions = world.predict(utterance, tree, candidates, seed=seed + calls[0], earlier=taken)
        calls[0] += 1
        return candidates[rank_predictions(utterance, tree, predictions, taken)[0]]

    return act


# ---------------------------------------------------------------------------------------------------- episodes


def episode_plan(tasks: Sequence[str], episodes: int, seed: int) -> list[tuple[str, int]]:
    """(task, MiniWoB seed) of each episode: tasks in turn, seeds counting up per task from seed * 1_000_000."""
    return [(tasks[i % len(tasks)], seed * SEEDS_PER_RUN + i // len(tasks)) for i in range(episodes)]


def play_episode(env: WebTaskEnv, policy: Policy, seed: int, max_steps: int, timeout_s: float) -> dict:
    """One real episode of `env.task` under `policy`: task, seed, success, reward, steps, actions, error, seconds
    (think_seconds of them choosing actions)."""
    started = time.monotonic()
    utterance, tree, _ = env.reset(seed=seed)
    reward, terminated, error, taken, thinking = 0.0, False, None, [], 0.0
    while len(taken) < max_steps and not terminated:
        candidates = candidate_actions(utterance, tree)
        if not candidates:
            error = "no candidate action on the page"
            break
        paused = env.driver.execute_script(_PAUSE_JS)
        choosing = time.monotonic()
        action = policy(utterance, tree, candidates, taken)
        thinking += time.monotonic() - choosing
        if paused:
            env.driver.execute_script(_RESUME_JS)
        tree, reward, terminated, truncated, _ = env.step(action)
        taken.append(action)
        if truncated:
            break
        if time.monotonic() - started > timeout_s:
            error = f"stopped after {timeout_s:g} s"
            break
    return {
        "task": env.task,
        "seed": seed,
        "success": bool(terminated and task_done(reward)),
        "reward": reward,
        "steps": len(taken),
        "actions": taken,
        "error": error,
        "seconds": round(time.monotonic() - started, 2),
        "think_seconds": round(thinking, 3),
    }


def play_agents(
    agents: dict[str, PolicyMaker],
    plan: Sequence[tuple[str, int]],
    max_steps: int,
    timeout_s: float,
    env: WebTaskEnv | None = None,
) -> dict[str, list[dict]]:
    """Each agent's episodes on the planned (task, seed) pages, in plan order. Pass `env` to play in a browser you
    already have (left open, unless it fails and is replaced)."""
    results: dict[str, list[dict | None]] = {name: [None] * len(plan) for name in agents}
    by_task: dict[str, list[int]] = {}
    for i, (task, _) in enumerate(plan):
        by_task.setdefault(task, []).append(i)
    own_env = env is None
    try:
        for task, rows in by_task.items():
            for name, make_policy in agents.items():
                for i in rows:
                    seed = plan[i][1]
                    try:
                        if env is None:
                            env = WebTaskEnv(task, max_steps=max_steps)
                        elif env.task != task:
                            env.load_task(task)
                        results[name][i] = play_episode(env, make_policy(seed), seed, max_steps, timeout_s)
                    except (BrowserError, RuntimeError, *BROWSER_ERRORS) as e:
                        error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"  # no stack trace
                        log.warning("%s on %s seed %d failed (%s); going on in a fresh browser", name, task, seed, error)
                        results[name][i] = {"task": task, "seed": seed, "success": False, "reward": 0.0, "steps": 0,
                                            "actions": [], "error": error, "seconds": 0.0, "think_seconds": 0.0}  # fmt: skip
                        if env is not None:
                            env.close()
                        env = WebTaskEnv(task, max_steps=max_steps)
                        own_env = True
    finally:
        if own_env and env is not None:
            env.close()
    return results  # type: ignore[return-value]


def summarise(episodes: Sequence[dict], seen_tasks: Sequence[str]) -> dict:
    """Success rates overall, on seen and held-out tasks, and per task; errors, mean steps and seconds."""

    def rate(rows: Sequence[dict]) -> float | None:
        return round(sum(r["success"] for r in rows) / len(rows), 4) if rows else None

    seen = set(seen_tasks)
    tasks = dict.fromkeys(r["task"] for r in episodes)
    return {
        "success_rate": rate(episodes),
        "seen_success_rate": rate([r for r in episodes if r["task"] in seen]),
        "heldout_success_rate": rate([r for r in episodes if r["task"] not in seen]),
        "per_task": {t: rate([r for r in episodes if r["task"] == t]) for t in tasks},
        "errors": sum(r["error"] is not None for r in episodes),
        "mean_steps": round(sum(r["steps"] for r in episodes) / max(len(episodes), 1), 2),
        "seconds": round(sum(r["seconds"] for r in episodes), 1),
    }


def run_lookahead(config: LookaheadConfig, env: WebTaskEnv | None = None) -> dict:
    """Play every agent on the same real episodes; returns the summary (and writes it with the episodes to `out`)."""
    if config.episodes < 1 or config.max_steps < 1 or not config.tasks:
        raise ValueError("episodes and max_steps must be >= 1 and tasks not empty")
    unknown = [t for t in config.tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown tasks {unknown}: choose from {', '.join(TASKS)}")
    torch.set_num_threads(config.threads)
    plan = episode_plan(config.tasks, config.episodes, config.seed)
    episodes: dict[str, list[int]] = {}
    for task, seed in plan:
        episodes.setdefault(task, []).append(seed)
    seen_tasks = set(config.seen_tasks)
    for checkpoint in config.checkpoints:
        record = check_not_trained_on(resolve_checkpoint(checkpoint), episodes,
                                      f"the lookahead episodes (seed {config.seed})", checkpoint)  # fmt: skip
        if record is not None:
            if not config.seen_tasks:
                seen_tasks |= set(record["tasks"])
        elif not config.seen_tasks:
            raise ValueError(
                f"{checkpoint} has no web_training.json saying which tasks it was trained on: pass --seen-tasks"
            )
    agents: dict[str, PolicyMaker] = {"random": random_policy, "no-lookahead": lambda seed: no_lookahead_policy}
    for checkpoint in config.checkpoints:
        world = WebWorldModel(checkpoint, config.temperature, config.max_new_tokens, config.batch_size)
        agents[f"lookahead:{checkpoint}"] = lambda seed, world=world: lookahead_policy(world, seed)
    results = play_agents(agents, plan, config.max_steps, config.episode_timeout_s, env)
    summary = {
        "agents": {name: summarise(rows, sorted(seen_tasks)) for name, rows in results.items()},
        "episodes": config.episodes,
        "seed": config.seed,
        "tasks": list(config.tasks),
        "seen_tasks": sorted(seen_tasks),
    }
    if config.out:
        out = Path(config.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps({**summary, "config": vars(config), "results": results}, indent=1))
        os.replace(tmp, out)
    return summary


if __name__ == "__main__":
    import tyro

    configure_logging()
    print(json.dumps(run_lookahead(tyro.cli(LookaheadConfig))))

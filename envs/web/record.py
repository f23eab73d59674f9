"""Recording (tree, action, next tree) transitions from scripted or trivial policies in the real MiniWoB++ env."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from envs.web.env import BrowserError, WebTaskEnv
from envs.web.solvers import ScriptedPolicy, trivial_policy

log = logging.getLogger(__name__)


def record_transitions(
    tasks: Sequence[str],
    episodes: int,
    seed: int = 0,
    skill_mix: Sequence[float | str] = (1.0, 0.7, 0.4),
    max_steps: int = 20,
    env: WebTaskEnv | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield one dict per step: utterance, tree_before, action, tree_after, reward, done, task, seed (+ step,
    skill, policy, truncated).

    Each task runs `episodes` episodes with MiniWoB seeds `seed, seed + 1, ...`; episode k's policy is
    `skill_mix[k % len(skill_mix)]`: a skill in [0, 1] for the scripted policy (`policy` "scripted:<skill>"), or the
    name of a trivial policy (`envs.web.solvers.TRIVIAL_POLICIES`; `skill` None), whose episode stops unrecorded when it
    has nothing to do. One browser serves all tasks, one after another. A transition is yielded
    as soon as it is captured; an episode the browser cannot recover (`BrowserError`) is cut short there and
    recording goes on with the next one. Pass `env` to record in a browser you already have (it is left open,
    and its own `max_steps` applies).
    """
    if not tasks or episodes < 1 or not skill_mix:
        raise ValueError(f"need at least one task, episode and skill, got {len(tasks)}, {episodes}, {len(skill_mix)}")
    own_env = env is None
    if env is None:
        env = WebTaskEnv(tasks[0], seed=seed, max_steps=max_steps)
    try:
        for t, task in enumerate(tasks):
            if task != env.task:
                env.load_task(task)
            for episode in range(episodes):
                spec = skill_mix[episode % len(skill_mix)]
                policy_seed = (seed * 1000 + t) * 100_000 + episode
                if isinstance(spec, str):
                    act, skill, name = trivial_policy(spec, policy_seed), None, spec
                else:
                    act, skill, name = ScriptedPolicy(task, spec, policy_seed).act, spec, f"scripted:{spec:g}"
                utterance, tree_before, _ = env.reset(seed=seed + episode)
                done = False
                while not done:
                    action = act(utterance, tree_before)
                    if action is None:
                        break
                    try:
                        tree_after, reward, terminated, truncated, info = env.step(action)
                    except BrowserError as e:
                        log.warning("%s; skipping the rest of this episode", e)
                        break
                    done = terminated or truncated
                    yield {
                        "utterance": utterance,
                        "tree_before": tree_before,
                        "action": action,
                        "tree_after": tree_after,
                        "reward": reward,
                        "done": terminated,
                        "task": task,
                        "seed": env.seed,
                        "step": info["step"],
                        "skill": skill,
                        "policy": name,
                        "truncated": truncated,
                    }
                    tree_before = tree_after
    finally:
        if own_env:
            env.close()

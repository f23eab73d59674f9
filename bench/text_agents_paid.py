"""What text simulators pay trained agents against what the real games give them.

    python -m bench.text_agents_paid --checkpoints textgame-rlvr DIR   # runs/bench/text_agents_paid.{md,json}
    python -m bench.text_agents_paid --agents runs/cotrain/text-dqn/round_*/agent.zip --episodes 8

`rlvr-gym evaluate-policies textgame` ranks a ladder of scripted policies; an agent trained in the real games plays
other states, and a simulator that pays it less than the real games teaches the next agent less. Each saved DQN
agent plays the same games (`agents.textgame.scored_games`, greedy) in the real games and in each simulator; per
simulator: mean learned minus real success, its mean absolute value and the Pearson r over agents. By default the
agents are those `python -m bench.sim_to_real --tasks text` kept: each real-env arm's scored agents and each loop's
final one. Results are cached per (agent, simulator, episodes) under runs/bench/text_agents_paid/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
from stable_baselines3 import DQN

from agents.cotrain import TEXT_ENV, CoTrainConfig, learned_success, score_in_real, world_dir
from bench.sim_to_real import cached
from rlvr_gym.evaluation.policies import pearson
from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.files import content_fingerprint

OUT = Path("runs/bench")
SIM_TO_REAL = OUT / "sim_to_real"


def default_agents() -> list[Path]:
    """The text agents bench.sim_to_real kept: every scored agent of the real-env arms, every loop's last one."""
    real = sorted(SIM_TO_REAL.glob("text*/real-*.agents/point*.zip"))
    loops = [sorted(loop.glob("round_*/agent.zip"))[-1] for loop in sorted(SIM_TO_REAL.glob("text*/loop*-*"))
             if list(loop.glob("round_*/agent.zip"))]
    return real + loops


def paid(agents: list[Path], checkpoints: list[str], episodes: int, seed: int, cache: Path) -> dict:
    """Real success and each simulator's success per agent, from the same games."""
    # Every game in one batch: batched generation is the cost.
    config = CoTrainConfig(env=TEXT_ENV, algo="dqn", eval_episodes=episodes, seed=seed, num_envs=episodes)
    worlds = {name: world_dir(config, name) for name in checkpoints}
    prints = {name: content_fingerprint(Path(world)) for name, world in worlds.items()}
    # The real games are the simulators' start states; the first simulator's copy of them is played.
    first = worlds[checkpoints[0]]
    games = content_fingerprint(Path(first) / "textworld_start_states.json")
    rows = []
    for agent_path in agents:
        agent = DQN.load(agent_path, device="cpu")
        tag = hashlib.sha256(str(agent_path.resolve()).encode()).hexdigest()[:12]
        base = {"agent": str(agent_path), "agent_print": content_fingerprint(agent_path), "episodes": episodes,
                "seed": seed}
        row = {"agent": str(agent_path), "real": cached(cache / f"{tag}-real.json", {**base, "games": games},
                                                        lambda: score_in_real(agent, config, first)[0])}
        for name, world in worlds.items():
            key = {**base, "world": str(world), "world_print": prints[name]}
            world_tag = hashlib.sha256(str(world).encode()).hexdigest()[:8]
            row[name] = cached(cache / f"{tag}-{world_tag}.json", key,
                               lambda world=world: learned_success(agent, world, config, episodes))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"episodes": episodes, "seed": seed, "rows": rows, "summary": summary(rows, checkpoints)}


def summary(rows: list[dict], checkpoints: list[str]) -> list[dict]:
    real = np.array([r["real"] for r in rows])
    out = []
    for name in checkpoints:
        learned = np.array([r[name] for r in rows])
        gap = learned - real
        out.append({"simulator": name, "agents": len(rows), "mean real": float(real.mean()),
                    "mean learned": float(learned.mean()), "learned - real": float(gap.mean()),
                    "mean |learned - real|": float(np.abs(gap).mean()),
                    "within 10 points": f"{int((np.abs(gap) <= 0.1).sum())} of {len(rows)}",
                    "pearson": pearson(learned.tolist(), real.tolist()) if len(rows) > 1 else None})
    return out


def short(agent: str) -> str:
    """An agent's path below bench.sim_to_real's directory, where the default agents are."""
    path = Path(agent)
    return str(path.relative_to(SIM_TO_REAL)) if path.is_relative_to(SIM_TO_REAL) else agent


def write_report(result: dict, checkpoints: list[str], out: Path) -> None:
    (out / "text_agents_paid.json").write_text(json.dumps(result, indent=1))
    lines = [f"# What text simulators pay trained agents ({len(result['rows'])} agents, {result['episodes']} games "
             f"each, greedy, the same games in the real env and in each simulator)", "",
             markdown_table(result["summary"]), "",
             markdown_table([{"agent": short(r["agent"]), "real": r["real"], **{name: r[name] for name in checkpoints}}
                             for r in result["rows"]]), ""]
    (out / "text_agents_paid.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", nargs="+", default=["textgame-rlvr"],
                        help="text world models: shipped names or directories")
    parser.add_argument("--agents", nargs="+", type=Path, default=None,
                        help="saved DQN text agents (.zip); default: those bench.sim_to_real --tasks text kept")
    parser.add_argument("--episodes", type=int, default=32, help="games per agent (32: each game once)")
    parser.add_argument("--seed", type=int, default=0, help="the games' order")
    args = parser.parse_args()
    agents = args.agents if args.agents is not None else default_agents()
    if not agents:
        raise SystemExit("no text agents: give --agents, or run python -m bench.sim_to_real --tasks text first")
    missing = [str(a) for a in agents if not a.is_file()]
    if missing:
        raise SystemExit(f"no saved agent at {missing}")
    result = paid(agents, args.checkpoints, args.episodes, args.seed, OUT / "text_agents_paid")
    OUT.mkdir(parents=True, exist_ok=True)
    write_report(result, args.checkpoints, OUT)
    print(markdown_table(result["summary"]))


if __name__ == "__main__":
    main()

"""Agents trained with the co-training loop against agents trained in the real env, at equal real-step budgets.

    rlvr-gym collect rt1 --out runs/rt1/replay --episodes 200 --seed 1 --workers 2   # the models' own training run
    python -m bench.sim_to_real --replay runs/rt1/replay  # writes runs/bench/sim_to_real.{md,json,png}
    python -m bench.sim_to_real --tasks text --seeds 0 1 2 --rounds 3 --real-steps 200 --text-sim-steps 1024   # the text games
    python -m bench.sim_to_real --tasks open_drawer --seeds 0 --rounds 1 --real-steps 100 --sim-steps 512   # a smoke run

Every arm of every (task, seed) is kept under runs/bench/sim_to_real/ (the arms that train in a sim shaped by
`--shaping W` under TASK+shapingW/, with `--reach R` as well under TASK+shapingW+reachR/, agents on the state
(`--observation state`) under TASK+...+state/, with `--agent-share F` and `--uncertainty-penalty P` under
TASK+...+agentF+penaltyP/ (and `--dynamics-steps N` other than 200 under ...+dynamicsN/), a loop with
`--real-updates` under TASK+real-updates/, text refits with `--win-share F` under text+winF/, with `--surprise-on
outcome` under text+surprise-outcome/, with `--text-replay` under text+replay/, with `--score-data` under
TASK+score-data/; each loop in a directory of its own settings, loop-SEED-DIGEST) and reused by a rerun with the
same settings, so seeds can run in parallel processes (`--seeds 0`, `--seeds 1`) and a last run with all seeds
writes the report.

"Tasks" are tabletop tasks (PPO in RLVRWorld-RT1-v0) and `text` (DQN, or PPO with `--text-algo ppo`, in
RLVRWorld-TextGame-v0 on its 32 games).
Arms, each from the same seeds, each point its real success against the real env steps it has taken so far (data
and scoring alike):
- `loop`: `agents.cotrain` (refits by MLE, then GRPO);  `loop-mle`: the same with MLE-only refits (`--grpo-steps 0`);
- `frozen`: the agent in the frozen starting simulator for as many simulated steps (the loop's pretraining
  included), real steps spent on scoring only;
- `real-1x` / `real-10x`: the same SB3 algorithm in the real env with the loop's real-step budget and ten times it
  (with `--shaping W` on the tabletop their reward is shaped as the loop's, from the real env's true state; with
  `--score-data` the text DQN, as the loop, also learns from its scoring episodes); `real-1x-sparse`: `real-1x`
  without the shaping (the real env's own reward), beside a shaped loop.
Reported: final real success per arm with a 95% interval over seeds (t), the real steps at which the seeds' mean
curve of each arm first reaches the real-env baseline's final success (sample efficiency), the loop against the
real-env agent at equal real steps, and the loop's learned-vs-real success gap (with `--check-episodes N`, also
measured again on N episodes: `final_check`); a plot of every curve and the means.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

from agents.cotrain import (
    AGENT_TRANSITIONS,
    DEFAULT_CHECKPOINTS,
    PRETRAIN,
    RESUMABLE_CHANGES,
    RT1_ENV,
    TEXT_ENV,
    CoTrainConfig,
    learn_from_real,
    learned_success,
    load_state,
    make_agent,
    new_agent,
    ppo_policy,
    recorded_config,
    resolve_world,
    run_cotrain,
    score_in_real,
    score_text,
    silent,
)
from rlvr_gym.evaluation.report import markdown_table
from rlvr_gym.files import content_fingerprint, path_label

OUT = Path("runs/bench")
ARMS = ["loop", "loop-mle", "frozen", "real-1x", "real-10x", "real-1x-sparse"]
CHECK_FIRST = 500_000
"""A tabletop final check's first held-out start: past every scoring's, which a `--score-data` loop learns from."""
T_95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t interval (0 for one value)."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, 0.0
    return mean, T_95.get(len(values) - 1, 1.96) * float(np.std(values, ddof=1)) / math.sqrt(len(values))


class RealScoring(BaseCallback):
    """Scores an agent training in the real env every `every` training steps; each point counts training and
    scoring steps. With `score_data` the text DQN also learns from its scoring episodes (PPO, on-policy, does
    not). The agent of each point is saved to agents/pointK.zip."""

    def __init__(self, every: int, config: CoTrainConfig, agents: Path):
        super().__init__()
        self.every, self.config, self.next, self.scoring_steps, self.points = every, config, every, 0, []
        self.agents = agents
        agents.mkdir(parents=True, exist_ok=True)

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next:
            self.next += self.every
            world = resolve_world(self.config)
            self.model.save(self.agents / f"point{len(self.points)}.zip")  # the agent scored, before it learns from it
            # Text DQN learns from its scorings as the loop does, a gradient step per real step; PPO, on-policy, cannot.
            if self.config.score_data and self.config.algo == "dqn":  # DQN serves the text games only
                with tempfile.TemporaryDirectory() as scored:
                    success, steps = score_text(self.model, self.config, world, Path(scored))
                    learn_from_real(self.model, Path(scored) / AGENT_TRANSITIONS)
            else:
                success, steps = score_in_real(self.model, self.config, world)
            self.scoring_steps += steps
            self.points.append({"real_steps_total": self.num_timesteps + self.scoring_steps, "real_success": success})
        return True


def real_env(config: CoTrainConfig):
    """The real env as the agent sees it in the learned one (frames block-averaged, the reward shaped alike on the
    true state: `agents.robot.make_real_env`; the text games' discrete spaces)."""
    if config.env == RT1_ENV:
        from agents.robot import make_real_env

        return make_real_env(config.task, config.steps_per_episode, config.frame_size, config.shaping, config.reach,
                             config.observation)
    from agents.textgame import RealTextWorldDiscreteEnv

    world = resolve_world(config)
    return VecMonitor(DummyVecEnv([lambda: RealTextWorldDiscreteEnv(world, config.steps_per_episode)]))


def real_arm(config: CoTrainConfig, budget: int, points: int, agents: Path) -> list[dict]:
    """The loop's SB3 algorithm in the real env until `budget` real steps (training plus scoring), scored `points`
    times; the agent of each point saved in `agents`."""
    env = real_env(config)
    if config.algo == "dqn":
        agent = new_agent(config, env)
    else:  # one real env, so a longer rollout than the loop's 32 steps x 16 sub-envs
        agent = PPO(ppo_policy(config.env), env, n_steps=256, n_epochs=4, batch_size=64,
                    learning_rate=config.agent_learning_rate, seed=config.seed, device="cpu",
                    policy_kwargs={"net_arch": [64, 64]}, verbose=0)
        silent(agent)
    scoring = config.eval_episodes * config.steps_per_episode  # an upper bound of each scoring's steps
    every = max((budget - points * scoring) // points, 256)
    callback = RealScoring(every, config, agents)
    agent.learn(every * points, callback=callback)
    env.close()
    return callback.points


def frozen_arm(config: CoTrainConfig) -> list[dict]:
    """The agent in the frozen starting simulator, scored after each round's worth of simulated steps (first after
    the loop's `pretrain_steps`, when it has them, as the loop is scored before round 0)."""
    world = resolve_world(config)
    agent, env = make_agent(config, world)
    points, real_steps = [], 0
    for sim_steps in [config.pretrain_steps] * bool(config.pretrain_steps) + [config.sim_steps] * config.rounds:
        agent.learn(sim_steps, reset_num_timesteps=False)
        success, steps = score_in_real(agent, config, world)
        real_steps += steps
        points.append({"real_steps_total": real_steps, "real_success": success,
                       "learned_success": learned_success(agent, world, config, config.eval_episodes)})
    env.close()
    return points


def final_check(config: CoTrainConfig, agents: list[tuple[int, Path]], world: str, path: Path, episodes: int,
                final_world: str = "") -> dict:
    """An arm's curve scored again: the agent of each point ((real steps, saved agent)) on `episodes` real episodes
    (tabletop: held-out starts from CHECK_FIRST on; text: the games in the same seeded order, so 32 plays each game
    once: the 16 a text loop never collected on too), and the final agent also in the simulator `world` from the
    same starts (a loop's last refit, which it trained in; the starting one for an agent trained in the real env),
    and in `final_world` if given (a loop's final refit, `CoTrainConfig.final_dynamics_steps`). Like any final
    scoring it is not counted in the real-step budget. Kept in `path`, and computed again when the agents (a loop
    that has run more rounds, a real arm trained again) or the worlds differ."""

    def check() -> dict:
        load = DQN.load if config.algo == "dqn" else PPO.load
        checked = replace(config, eval_episodes=episodes)
        scored = [(steps, load(agent, device="cpu")) for steps, agent in agents]
        points = [{"real_steps_total": steps, "real_success": score_in_real(agent, checked, world, CHECK_FIRST)[0]}
                  for steps, agent in scored]
        result = {"episodes": episodes, "points": points, "real_success": points[-1]["real_success"],
                  "learned_success": learned_success(scored[-1][1], world, checked, episodes, CHECK_FIRST)}
        if final_world:
            result["final_world_success"] = learned_success(scored[-1][1], final_world, checked, episodes, CHECK_FIRST)
        return result

    # A tabletop check's starts moved past the scorings (a `--score-data` loop learns from those): older checks redo.
    key = {"episodes": episodes, "world": str(world), **({"first": CHECK_FIRST} if config.env == RT1_ENV else {}),
           "agents": [[steps, str(agent), agent.stat().st_mtime_ns] for steps, agent in agents],
           **({"final_world": final_world} if final_world else {})}  # checks without one keep their keys
    return cached(path, key, check)


def loop_agents(out: Path, curve: list[dict]) -> list[tuple[int, Path]]:
    """(real steps, saved agent) of each point of a loop's curve whose agent was kept: the pretrained agent scored
    before round 0 (`score_data`), then each round's."""
    saved = [(p["real_steps_total"], out / PRETRAIN / "agent.zip" if p["round"] == -1
              else out / f"round_{p['round']:02d}" / "agent.zip") for p in curve]
    return [(steps, agent) for steps, agent in saved if agent.is_file()]


REAL_ARM_FIELDS = ("env", "algo", "task", "seed", "rounds", "eval_episodes", "horizon", "frame_size", "learning_rate")
LATER_SETTINGS = ("precision", "reach", "uncertainty_penalty", "observation")
"""Settings added after curves were cached: in a key only away from their defaults, so older curves keep their keys."""


def away_from_default(config: CoTrainConfig, names: tuple[str, ...]) -> dict:
    """The settings among `names` whose value is not CoTrainConfig's default."""
    default = CoTrainConfig()
    return {name: getattr(config, name) for name in names if getattr(config, name) != getattr(default, name)}


def arm_key(config: CoTrainConfig, arm: str, **extra) -> dict:
    """What an arm's curve depends on: a tabletop real-env arm on the agent and the scoring alone; a text real-env
    arm and the frozen arm on every setting (the text DQN's learning start follows `sim_steps`) and the world model's
    own (the text games are its start states)."""
    if arm.startswith("real") and config.env == RT1_ENV:
        # The agent's reward and observation, too; unshaped curves keep their old keys.
        key = {**{name: getattr(config, name) for name in REAL_ARM_FIELDS},
               **away_from_default(config, ("shaping", "reach", "observation"))}
    else:
        # Where the loop runs, whether it learns from its real steps, how its refits weight their data and whether its
        # agent pretrains do not change the other arms. Whether scorings are data changes the real-env arms too.
        loop_only = ("out", "real_updates", "win_share", "agent_share", "final_dynamics_steps", "surprise_on",
                     "pretrain_steps", "pretrain_checkpoint", *LATER_SETTINGS,
                     *(() if arm.startswith("real") else ("score_data",)))
        key = {**{k: v for k, v in asdict(config).items() if k not in loop_only},
               "world": world_fingerprint(config), **away_from_default(config, LATER_SETTINGS)}
        if arm == "frozen" and config.pretrain_steps:  # its first point; curves without one keep their old keys
            key["pretrain_steps"] = config.pretrain_steps
    return {**key, **extra}


def world_fingerprint(config: CoTrainConfig) -> str:
    """A hash of every file of the starting world model (weights, settings, start states), so that a changed
    checkpoint (new weights, a new success threshold or hold) is not read from an old curve."""
    return content_fingerprint(resolve_world(config))


def cached(path: Path, key: dict, compute, older: Path | None = None, beside: Path | None = None):
    """An arm's curve (or its final check), computed once for its settings: a rerun, or the run that gathers seeds
    other processes ran, reuses it (the loop arms resume from their own run directories). `older`: where an earlier
    version of this script kept the same curve, read if its settings match. `beside`: a file the computation also
    writes (the final agent), computed again if it is missing."""
    candidates = (path, older) if beside is None or beside.is_file() else ()
    for candidate in candidates:
        if candidate is not None and candidate.is_file():
            saved = json.loads(candidate.read_text())
            if saved["key"] == key:
                return saved["points"]
    points = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "points": points}))
    return points


def arm_label(task: str, args: argparse.Namespace) -> str:
    """The directory of a task's simulator arms: arms that train in a shaped sim or another tabletop world model keep
    their own; the real-env arms are shared."""
    env, checkpoint = (TEXT_ENV, args.text_checkpoint) if task == "text" else (RT1_ENV, args.checkpoint)
    label = f"{task}+shaping{args.shaping:g}" if args.shaping and env == RT1_ENV else task  # the text sim takes none
    label = f"{label}+reach{args.reach:g}" if args.reach and env == RT1_ENV else label
    label = f"{label}+state" if args.observation == "state" and env == RT1_ENV else label
    label = f"{label}+agent{args.agent_share:g}" if args.agent_share and env == RT1_ENV else label
    label = f"{label}+penalty{args.uncertainty_penalty:g}" if args.uncertainty_penalty and env == RT1_ENV else label
    label = (f"{label}+dynamics{args.dynamics_steps}"
             if args.dynamics_steps != CoTrainConfig.dynamics_steps and env == RT1_ENV else label)
    label = f"{label}+real-updates" if args.real_updates else label
    label = f"{label}+ppo" if args.text_algo == "ppo" and env == TEXT_ENV else label
    label = f"{label}+win{args.win_share:g}" if args.win_share and env == TEXT_ENV else label
    label = f"{label}+surprise-outcome" if args.surprise_on == "outcome" and env == TEXT_ENV else label
    label = f"{label}+replay" if args.text_replay and env == TEXT_ENV else label
    label = f"{label}+pretrain{args.pretrain_steps}" if args.pretrain_steps else label
    label = f"{label}-in-{path_label(args.pretrain_checkpoint)}" if args.pretrain_checkpoint else label
    label = f"{label}+score-data" if args.score_data else label
    return label if checkpoint == DEFAULT_CHECKPOINTS[env] else f"{label}+{path_label(checkpoint)}"


def loop_dir(directory: Path, arm: str, config: CoTrainConfig) -> Path:
    """A loop arm's run directory, one per settings (all but its seed, the directory itself, and what a run may be
    resumed with other values of: its rounds, which may grow, and its final refit), so that loops with other sizes or
    refit settings neither resume nor block each other: ARM-SEED-DIGEST, or the existing ARM-SEED[-DIGEST] that ran
    the same settings (an earlier version of this script, or one from before a setting existed, whose digest
    differs)."""
    settings = {k: v for k, v in asdict(config).items() if k not in ("out", "seed", *RESUMABLE_CHANGES)}
    for older in [directory / f"{arm}-{config.seed}", *sorted(directory.glob(f"{arm}-{config.seed}-*"))]:
        if (older / "config.json").is_file():
            recorded = recorded_config(older)
            if all(recorded[k] == v for k, v in settings.items()):
                return older
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return directory / f"{arm}-{config.seed}-{digest}"


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """The seeds' curves averaged point by point (round by round), as far as every seed goes."""
    return [{"real_steps_total": round(np.mean([c[i]["real_steps_total"] for c in curves])),
             "real_success": float(np.mean([c[i]["real_success"] for c in curves]))}
            for i in range(min(len(c) for c in curves))]


def success_at(points: list[dict], steps: int) -> float:
    """A curve's real success at `steps` real steps, linear between its points (its first or last value outside)."""
    return float(np.interp(steps, [p["real_steps_total"] for p in points], [p["real_success"] for p in points]))


def first_reaching(points: list[dict], target: float) -> int | None:
    return next((p["real_steps_total"] for p in points if p["real_success"] >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="rt1-rlvr", help="the tabletop world model")
    parser.add_argument("--text-checkpoint", default="textgame-rlvr", help="the text world model")
    parser.add_argument("--text-algo", default="dqn", choices=("dqn", "ppo"),
                        help="the text agent: DQN (SlotDQNPolicy) or PPO (SlotActorCriticPolicy), in every text arm")
    parser.add_argument("--tasks", nargs="+", default=["open_drawer", "close_drawer", "text"],
                        help="tabletop tasks, and `text` for the text games")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--real-steps", type=int, default=400)
    parser.add_argument("--sim-steps", type=int, default=4096, help="simulated agent steps per round (tabletop)")
    parser.add_argument("--text-sim-steps", type=int, default=0,
                        help="simulated agent steps per round for the text games (one env); 0: --sim-steps")
    parser.add_argument("--eval-episodes", type=int, default=8)
    parser.add_argument("--mle-steps", type=int, default=60)
    parser.add_argument("--grpo-steps", type=int, default=10)
    parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                        help="tabletop: the learned simulators' weight products (`CoTrainConfig.precision`)")
    parser.add_argument("--shaping", type=float, default=0.0,
                        help="tabletop: weight of the shaped reward in the learned sim (`CoTrainConfig.shaping`)")
    parser.add_argument("--observation", choices=("frame", "state"), default="frame",
                        help="tabletop: what the agents see (`CoTrainConfig.observation`)")
    parser.add_argument("--uncertainty-penalty", type=float, default=0.0,
                        help="tabletop: MOPO penalty on the agent's reward in the learned sims "
                             "(`CoTrainConfig.uncertainty_penalty`)")
    parser.add_argument("--dynamics-steps", type=int, default=CoTrainConfig.dynamics_steps,
                        help="tabletop: steps of each state-dynamics refit (`CoTrainConfig.dynamics_steps`)")
    parser.add_argument("--final-dynamics-steps", type=int, default=0,
                        help="tabletop: steps of the loop's final state-dynamics refit after its last scoring, the "
                             "simulator its final agent is also checked in (`CoTrainConfig.final_dynamics_steps`)")
    parser.add_argument("--agent-share", type=float, default=0.0,
                        help="tabletop: least share of the agent's transitions in each dynamics refit "
                             "(`CoTrainConfig.agent_share`)")
    parser.add_argument("--reach", type=float, default=0.0,
                        help="tabletop: weight per metre of the shaped reward's reach term (`CoTrainConfig.reach`)")
    parser.add_argument("--replay", default="", help="episodes mixed into every tabletop refit (`rlvr-gym collect rt1`)")
    parser.add_argument("--real-updates", action="store_true",
                        help="the loop's agent also learns from its real data steps (Dyna; `CoTrainConfig.real_updates`)")
    parser.add_argument("--win-share", type=float, default=0.0,
                        help="text: least share of winning transitions in each refit (`CoTrainConfig.win_share`)")
    parser.add_argument("--surprise-on", choices=("state", "outcome"), default="state",
                        help="text: what makes a step surprising for GRPO's prompts (`CoTrainConfig.surprise_on`)")
    parser.add_argument("--text-replay", default="", help="ByteSized32-format transitions mixed into every text refit")
    parser.add_argument("--pretrain-steps", type=int, default=0,
                        help="agent steps in the starting simulator before the first real step "
                             "(`CoTrainConfig.pretrain_steps`)")
    parser.add_argument("--pretrain-checkpoint", default="",
                        help="the world model the pretraining runs in; empty: the starting one "
                             "(`CoTrainConfig.pretrain_checkpoint`)")
    parser.add_argument("--score-data", action="store_true",
                        help="the loop's scorings are data too, and it scores before round 0 "
                             "(`CoTrainConfig.score_data`)")
    parser.add_argument("--check-episodes", type=int, default=0,
                        help="score every point's agent of each arm again on this many real episodes, and the final "
                             "one in its simulator (`final_check`); 0: off")
    parser.add_argument("--arms", nargs="+", default=ARMS[:5], choices=ARMS,
                        help="arms to run and report; the real-env arms take the loop's real steps as their budget")
    args = parser.parse_args()
    if "loop" not in args.arms:
        parser.error("--arms must include loop: the other arms' budgets are its real steps")
    torch.set_num_threads(1)
    runs: dict = {}
    for task in args.tasks:
        for seed in args.seeds:
            domain = {"env": TEXT_ENV, "algo": args.text_algo, "checkpoint": args.text_checkpoint,
                      "replay": args.text_replay,
                      "real_updates": args.real_updates, "win_share": args.win_share,
                      "surprise_on": args.surprise_on, "score_data": args.score_data} \
                if task == "text" else {"env": RT1_ENV, "algo": "ppo", "checkpoint": args.checkpoint, "task": task,
                                        "replay": args.replay, "shaping": args.shaping, "reach": args.reach,
                                        "observation": args.observation, "agent_share": args.agent_share,
                                        "uncertainty_penalty": args.uncertainty_penalty,
                                        "dynamics_steps": args.dynamics_steps,
                                        "final_dynamics_steps": args.final_dynamics_steps,
                                        "precision": args.precision,
                                        "real_updates": args.real_updates, "score_data": args.score_data}
            sim_steps = (args.text_sim_steps or args.sim_steps) if task == "text" else args.sim_steps
            label = arm_label(task, args)
            base = CoTrainConfig(rounds=args.rounds, real_steps=args.real_steps, sim_steps=sim_steps,
                                 eval_episodes=args.eval_episodes, mle_steps=args.mle_steps, grpo_steps=args.grpo_steps,
                                 pretrain_steps=args.pretrain_steps, pretrain_checkpoint=args.pretrain_checkpoint,
                                 seed=seed, **domain)
            base = replace(base, out=str(loop_dir(OUT / "sim_to_real" / label, "loop", base)))
            mle_only = replace(base, grpo_steps=0)
            arms = {"loop": base,
                    "loop-mle": replace(mle_only, out=str(loop_dir(OUT / "sim_to_real" / label, "loop-mle", mle_only)))}
            curves = {}
            for name, config in arms.items():
                if name not in args.arms:
                    continue
                run_cotrain(config)
                curves[name] = [json.loads(line) for line in (Path(config.out) / "rounds.jsonl").read_text().splitlines()]
                if args.check_episodes:
                    out = Path(config.out)
                    # Without the flag, a final refit an earlier run made is not checked.
                    final_world = load_state(config, out).final_world if config.final_dynamics_steps else ""
                    curves[f"{name} check"] = final_check(config, loop_agents(out, curves[name]), curves[name][-1]["world"],
                                                          out / f"check-{args.check_episodes}.json",
                                                          args.check_episodes, final_world)
            directory = OUT / "sim_to_real" / task
            if "frozen" in args.arms:
                curves["frozen"] = cached(OUT / "sim_to_real" / label / f"frozen-{seed}.json",
                                          arm_key(base, "frozen"), lambda: frozen_arm(base))
            budget = curves["loop"][-1]["real_steps_total"]
            real_arms = (("real-1x", "real-1x", 1, base), ("real-10x", "real-10x", 10, base),
                         ("real-1x-sparse", "real-1x", 1, replace(base, shaping=0.0, reach=0.0)))
            for name, kind, scale, config in real_arms:
                if name not in args.arms:
                    continue
                # One file per budget: loops run with other settings take other real steps, and each keeps its baseline.
                # PPO's real arms do not learn from their scorings: their files have no score-data mark.
                scored = "-score-data" if config.score_data and config.algo == "dqn" else ""
                shaped = f"-shaping{config.shaping:g}" if config.shaping and config.env == RT1_ENV else ""
                shaped += f"-reach{config.reach:g}" if config.reach and config.env == RT1_ENV else ""
                shaped += "-state" if config.observation == "state" else ""
                shaped += "-ppo" if config.algo == "ppo" and config.env == TEXT_ENV else ""
                curve = directory / f"{kind}-{seed}-{scale * budget}steps{scored}{shaped}.json"
                agents = curve.with_suffix(".agents")
                curves[name] = cached(curve, arm_key(config, kind, budget=scale * budget),
                                      lambda scale=scale, config=config: real_arm(config, scale * budget, args.rounds,
                                                                                  agents),
                                      older=directory / f"{kind}-{seed}.json",
                                      beside=agents / f"point{args.rounds - 1}.zip")
                if args.check_episodes:
                    kept = [(p["real_steps_total"], agents / f"point{k}.zip") for k, p in enumerate(curves[name])]
                    curves[f"{name} check"] = final_check(config, kept, resolve_world(config),
                                                          curve.with_suffix(f".check-{args.check_episodes}.json"),
                                                          args.check_episodes)
            runs.setdefault(label, {})[seed] = curves
            (OUT / "sim_to_real.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    write_report(args, runs)


def comparison(by_seed: dict, arms: list[str]) -> str:
    """The loop's final real success against the other arms' (each seed's curves by arm): at the end, at equal real
    steps, the real steps its mean curve takes to the real-env agent's final success, and RLVR against MLE-only."""
    final = {arm: interval([c[arm][-1]["real_success"] for c in by_seed.values()]) for arm in arms}
    (loop, loop_half), parts = final["loop"], []
    # "Ahead" or "beats" only when the intervals over seeds do not overlap.
    if "real-1x" in final:
        real1, real1_half = final["real-1x"]
        real_steps = np.mean([c["real-1x"][-1]["real_steps_total"] for c in by_seed.values()])
        # Its scorings (and at least 256 training steps per point) may take it past the loop's budget.
        parts.append(f"against {real1:.2f} ± {real1_half:.2f} for the agent in the real env trained on the loop's "
                     f"real-step budget ({real_steps:.0f} real steps with its scorings; "
                     f"{'ahead' if loop - loop_half > real1 + real1_half else 'not ahead'})")
        level = interval([c["loop"][-1]["real_success"] - success_at(c["real-1x"], c["loop"][-1]["real_steps_total"])
                          for c in by_seed.values()])
        parts.append(f"at equal real steps (each seed's real-env curve read at the loop's final steps) the loop is "
                     f"{level[0]:+.2f} ± {level[1]:.2f} ahead (the interval "
                     f"{'excludes' if level[0] - level[1] > 0 else 'includes'} zero)")
        at = first_reaching(mean_curve([c["loop"] for c in by_seed.values()]), real1)
        parts.append("its mean curve never reaches that" if at is None or real1 == 0 else
                     f"its mean curve reaches it at {at} real steps, {real_steps / at:.1f}x fewer than the real "
                     f"env's {real_steps:.0f} (target >= 3x)")
    if "real-10x" in final:  # with a baseline that ends at 0, sample efficiency is read against this one
        real10 = final["real-10x"][0]
        real_steps = np.mean([c["real-10x"][-1]["real_steps_total"] for c in by_seed.values()])
        at = first_reaching(mean_curve([c["loop"] for c in by_seed.values()]), real10)
        parts.append(f"the real-env agent with 10x the steps ends at {real10:.2f} after {real_steps:.0f}: "
                     + ("the loop's mean curve never reaches that" if at is None or real10 == 0 else
                        f"the loop's mean curve reaches that at {at} real steps, {real_steps / at:.1f}x fewer"))
    if "loop-mle" in final:
        mle, mle_half = final["loop-mle"]
        parts.append(f"RLVR refits end at {loop:.2f} against {mle:.2f} ± {mle_half:.2f} for MLE-only refits "
                     f"({'RLVR ahead' if loop - loop_half > mle + mle_half else 'no difference beyond the intervals'}"
                     f"{', MLE ahead' if mle - mle_half > loop + loop_half else ''})")
    return f"the loop ends at {loop:.2f} ± {loop_half:.2f} real success" + (" " + "; ".join(parts) if parts else "")


def gaps_per_seed(checks: list[dict], learned: str) -> str:
    """The final checks' learned (the `learned` entry) minus real success: their mean, then each seed's."""
    gaps = [c[learned] - c["real_success"] for c in checks]
    return f"{np.mean(gaps):+.2f} ({', '.join(f'{g:+.2f}' for g in gaps)})"


def write_report(args: argparse.Namespace, runs: dict) -> None:
    arms = args.arms
    rows, lines = [], []
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.5), squeeze=False)
    for ax, (task, by_seed) in zip(axes[0], runs.items()):
        first = next(iter(by_seed.values()))
        for k, arm in enumerate(arms):
            checks = [curves[f"{arm} check"] for curves in by_seed.values()] if f"{arm} check" in first else []
            finals = [curves[arm][-1]["real_success"] for curves in by_seed.values()]
            steps = [curves[arm][-1]["real_steps_total"] for curves in by_seed.values()]
            mean, half = interval(finals)
            row = {"task": task, "arm": arm, "final real success": f"{mean:.2f} ± {half:.2f}",
                   "real steps": round(np.mean(steps))}
            if arm in ("loop", "loop-mle", "frozen"):
                gaps = [curves[arm][-1]["learned_success"] - curves[arm][-1]["real_success"] for curves in by_seed.values()]
                row["learned - real"] = f"{np.mean(gaps):+.2f}"
                paid = [curves[arm][-1].get("replayed_failures_paid") for curves in by_seed.values()]
                if None not in paid:  # a tabletop loop with --score-data records it (`agents.cotrain.replayed_calls`)
                    failed = [p for p in paid if not np.isnan(p)]
                    row["real failures paid, replayed"] = f"{np.mean(failed):.2f}" if failed else "none failed"
            if checks:
                mean, half = interval([c["real_success"] for c in checks])
                row[f"final check on {checks[0]['episodes']} episodes: real success"] = f"{mean:.2f} ± {half:.2f}"
                row["learned - real (per seed)"] = gaps_per_seed(checks, "learned_success")
                if all("final_world_success" in c for c in checks):
                    row["final refit's learned - real (per seed)"] = gaps_per_seed(checks, "final_world_success")
            if "real-1x" in arms:
                target = interval([c["real-1x"][-1]["real_success"] for c in by_seed.values()])[0]
                reached = [first_reaching(curves[arm], target) for curves in by_seed.values()]
                row["seeds reaching real-1x's final"] = f"{len(reached) - reached.count(None)} of {len(reached)}"
                at = first_reaching(mean_curve([curves[arm] for curves in by_seed.values()]), target)
                row["steps to real-1x's final (mean curve)"] = "never" if at is None or target == 0 else at
            rows.append(row)
            for curves in by_seed.values():
                xs = [p["real_steps_total"] for p in curves[arm]]
                ys = [p["real_success"] for p in curves[arm]]
                ax.plot(xs, ys, marker=".", color=f"C{k}", alpha=0.35, linewidth=1)
            mean = mean_curve([curves[arm] for curves in by_seed.values()])
            ax.plot([p["real_steps_total"] for p in mean], [p["real_success"] for p in mean], marker="o", color=f"C{k}",
                    linewidth=2.5, label=f"{arm} (mean of {len(by_seed)} seeds)")
            if checks:
                mean = mean_curve([c["points"] for c in checks])
                ax.plot([p["real_steps_total"] for p in mean], [p["real_success"] for p in mean], marker="s",
                        color=f"C{k}", linewidth=1.5, linestyle="--",
                        label=f"{arm}, final check on {checks[0]['episodes']} episodes (mean)")
        ax.set(title=task, xlabel="real env steps (data and scoring)", ylabel="real success", ylim=(-0.05, 1.05))
        ax.set_xscale("log")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "sim_to_real.png", dpi=110)
    plt.close(fig)
    for task, by_seed in runs.items():
        lines.append(f"- {task}: {comparison(by_seed, arms)}.")
        first = next(iter(by_seed.values()))
        if "loop check" in first:
            episodes = first["loop check"]["episodes"]
            checked = [arm for arm in arms if f"{arm} check" in first]
            lines.append(f"- {task}, every point scored again on {episodes} episodes (final check): "
                         + comparison({seed: {arm: curves[f"{arm} check"]["points"] for arm in checked}
                                       for seed, curves in by_seed.items()}, checked) + ".")
    report = [f"# Sim-to-real: the co-training loop against the same agent in the real env ({', '.join(runs)}; "
              f"seeds {args.seeds})", "",
              f"World models {args.checkpoint} (tabletop, PPO) and {args.text_checkpoint} (text, "
              f"{args.text_algo.upper()}); {args.rounds} "
              f"rounds of {args.real_steps} real data steps, {args.mle_steps} MLE and {args.grpo_steps} GRPO steps of "
              f"refit and {args.sim_steps} simulated agent steps (text: {args.text_sim_steps or args.sim_steps}); "
              + (f"the loop's agent first learns {args.pretrain_steps} steps in the starting simulator; "
                 if args.pretrain_steps else "")
              + ("it is scored before round 0 too and every scoring's episodes are data of its next refit (text: "
                 "and agent phase; tabletop: each scoring from held-out starts of its own); "
                 if args.score_data else "")
              + (f"tabletop agents' reward shaped with weight {args.shaping:g}, in the learned sims from the "
                 "predicted state, in the real env from the true one; " if args.shaping else "")
              + (f"with a reach term of weight {args.reach:g} per metre; " if args.reach else "")
              + ("tabletop agents observe the state (predicted in the learned sims, true in the real env), not frames; "
                 if args.observation == "state" else "")
              + f"{args.eval_episodes} real episodes per score (tabletop: held-out starts; text: the same games each "
              "time), and as many in the simulator from the same starts (learned success). Intervals: 95% t over "
              "seeds."
              + (" Real failures paid, replayed: the share of the last scoring's real failures that the simulator the "
                 "agent trained in pays when they are replayed open loop under their real actions (mean over the "
                 "seeds with a failure)." if any("real failures paid, replayed" in row for row in rows) else "")
              + (f" Final check: every point's agent of each arm (but `frozen`) on {args.check_episodes} real "
                 "episodes (tabletop: held-out starts no scoring took; text: the games in the same seeded order, so 32 "
                 "plays each game once), and the final one in a simulator from the same starts: a loop's last refit, "
                 "the starting one for an agent trained in the real env."
                 if args.check_episodes else "")
              + (f" Final refit: the loop's last world with its state dynamics fit {args.final_dynamics_steps} steps "
                 "further on every real episode of the agent, its last scoring too; the final agent never trained in "
                 "it." if any("final refit's learned - real (per seed)" in row for row in rows) else ""),
              "", markdown_table(rows), "", *lines, "",
              "![curves](sim_to_real.png)", ""]
    (OUT / "sim_to_real.md").write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()

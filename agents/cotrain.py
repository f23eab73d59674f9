"""Co-training: an agent trained inside a learned simulator that the agent's own real experience keeps refitting.
(Longer than 500 lines: one loop, and each domain's collect, refit and scoring beside it, so that the two stay one
contract.)

    rlvr-gym train agent --env RLVRWorld-RT1-v0 --algo ppo --task open_drawer --rounds 4 --out runs/cotrain/rt1-ppo
    rlvr-gym train agent --env RLVRWorld-TextGame-v0 --algo dqn --rounds 4 --out runs/cotrain/text-dqn

An agent trained in a frozen learned simulator learns to trigger the simulator's success signal from states the
world model never saw (`rlvr-gym probe`). Each round here closes that loop, as DIAMOND, MBPO and iVideoGPT's MBRL
setup do, with RLVR in it (with `pretrain_steps`, the agent first learns in the starting simulator, no real step
taken):
  (a) collect: the current agent acts in the real env for `real_steps` steps (with exploration: Gaussian action
      noise on the tabletop, a random candidate command with probability `exploration` in the text games); the
      episodes are written in the world model's own data format (`rlvr_gym.data.episodes` shards, ByteSized32
      transition records); with `real_updates` the agent learns from these steps too, as Dyna's direct RL does (PPO
      collects them as a rollout of its own policy and updates on it; DQN learns from them at the start of (c));
  (b) refit: the world model is fine-tuned by MLE on every agent episode so far (mixed with `replay`, its original
      training data, when given; text: the winning steps repeated to at least `win_share` of them), then by GRPO
      with the domain's verifiable reward (video: -(L1 + LPIPS); text: exact match of the next state) on prompts from
      this round's episodes, weighted toward the steps where the simulator was most wrong about the real next frame,
      state or success (`surprise_on`; `grpo_steps` 0 is the MLE-only ablation);
      the tabletop simulator then resets from its own real start states and those the agent has seen, and sets its
      success threshold afresh on replays of real episodes (the text simulator's start states are already the real
      games the agent plays);
  (c) agent: the SB3 agent goes on learning inside the refitted simulator for `sim_steps` steps (batched sub-envs);
  (d) score: the agent in the real env from held-out start states (tabletop) or a fixed set of the games (text),
      and in the learned env from the same starts. With `score_data` a scoring is data as well: the agent is also
      scored before round 0, and each scoring's episodes join the next round's (a) data.
After the last round, with `final_dynamics_steps`, a final refit of the state dynamics on every real episode gives
the simulator to judge the final agent in: one it never trained in.
Every real step, for data or scoring, counts towards `real_steps_total`. Each phase writes its outputs before
`state.json` records it finished, so a killed run resumes at the phase it was in with nothing lost. Scalars go to
TensorBoard and `rounds.jsonl`; each phase has a progress bar.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gymnasium.vector import AutoresetMode  # noqa: E402
from stable_baselines3 import DQN, PPO  # noqa: E402
from stable_baselines3.common.base_class import BaseAlgorithm  # noqa: E402
from stable_baselines3.common.logger import Logger  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402
from tqdm import tqdm  # noqa: E402

from agents.robot import DEFAULT_FRAME_SIZE  # noqa: E402
from rlvr_gym.files import atomic_write_text  # noqa: E402
from rlvr_gym.logs import configure_logging  # noqa: E402
from rlvr_gym.sim.robot import DEFAULT_HORIZON  # noqa: E402
from rlvr_gym.sim.textgame import DEFAULT_MAX_STEPS  # noqa: E402
from rlvr_gym.train.grpo import GRPOConfig  # noqa: E402
from rlvr_gym.train.sft import SFTConfig, train_sft  # noqa: E402

log = logging.getLogger(__name__)

RT1_ENV = "RLVRWorld-RT1-v0"
TEXT_ENV = "RLVRWorld-TextGame-v0"
ALGOS = {RT1_ENV: ("ppo",), TEXT_ENV: ("dqn", "ppo")}
DEFAULT_CHECKPOINTS = {RT1_ENV: "rt1-rlvr", TEXT_ENV: "textgame-rlvr"}
DEFAULT_HORIZONS = {RT1_ENV: DEFAULT_HORIZON, TEXT_ENV: DEFAULT_MAX_STEPS}
PHASES = ("collect", "refit", "agent", "score")
PRETRAIN = "pretrain"
"""Round 0's phase before collect, with `CoTrainConfig.pretrain_steps`."""
START_SCORE = "start"
"""The phase, and its directory, that scores the agent before round 0 (`CoTrainConfig.score_data`)."""
SCORE_DATA = "score"
"""A scoring's recorded real episodes, in a round's directory (`CoTrainConfig.score_data`)."""
RESUMABLE_CHANGES = ("rounds", "final_dynamics_steps")
"""Settings a run may be resumed with other values of: more rounds, another final refit."""
COLLECT_SEED_RUN = 8
"""Tabletop start states the agent collects data from: env seeds 8_000_000 + i (the scoring run is agents.robot's 9)."""


@dataclass
class CoTrainConfig:
    out: str = "runs/cotrain/rt1-ppo"
    """Run directory: state.json, rounds.jsonl, TensorBoard events, and round_NN/ with each phase's outputs."""
    env: Literal["RLVRWorld-RT1-v0", "RLVRWorld-TextGame-v0"] = RT1_ENV
    """The learned simulator the agent trains in; its real env gives the data and the scores."""
    algo: Literal["ppo", "dqn"] = "ppo"
    """SB3 algorithm: ppo for the tabletop; dqn or ppo for the text games."""
    checkpoint: str = ""
    """The world model the loop starts from: a shipped name or a directory; empty: rt1-rlvr / textgame-rlvr."""
    task: str = "open_drawer"
    """RT-1: the tabletop task the agent learns."""
    rounds: int = 4
    """Rounds of collect, refit, agent, score."""
    real_steps: int = 400
    """Real env steps the agent takes per round for data (whole episodes: the last one may end past it)."""
    exploration: float = 0.3
    """While collecting: std of Gaussian noise on the actions (RT-1, clipped to [-1, 1]); probability of a uniformly
    random candidate command instead of the agent's (text)."""
    eval_episodes: int = 8
    """Real episodes per round that score the agent (they count as real steps)."""
    sim_steps: int = 4096
    """Agent steps inside the learned simulator per round (summed over sub-envs)."""
    num_envs: int = 16
    """Sub-envs of the batched learned simulator."""
    horizon: int = 0
    """Steps per episode, real and learned; 0: the env's default (50 tabletop, 30 text)."""
    frame_size: int = DEFAULT_FRAME_SIZE
    """RT-1: side of the block-averaged frames the agent sees."""
    observation: str = "frame"
    """RT-1: what the agent sees, "frame" or "state" (in the learned sim the state its state dynamics predict, no
    frame drawn; in the real env the true state, `agents.robot.StateObservation`). With "state" the agent's training
    depends on the refitted state dynamics alone, not on the video model the MLE and GRPO refits train."""
    precision: str = "float32"
    """RT-1: the learned simulator the agent trains and is checked in runs its weight products in float32 or bfloat16
    (`RLVRWorld-RT1-v0`'s `precision`; `python -m bench.rt1_sim` measures both). Refits train in float32."""
    replay: str = ""
    """The world model's own training data, mixed into every MLE refit: an episode directory (RT-1) or a
    ByteSized32-format JSONL(.gz) of transitions (text); empty: agent data only."""
    mle_steps: int = 60
    """MLE steps of the world model per refit."""
    mle_lr: float = 2e-4
    """MLE learning rate of the refit."""
    grpo_steps: int = 10
    """GRPO steps per refit after the MLE ones (0: MLE-only refits, the ablation)."""
    dynamics_steps: int = 200
    """RT-1 world models with state dynamics: steps of refitting them on the agent's real transitions and the
    replay's in each refit (their success is the task's own test on the predicted state: no recalibration)."""
    uncertainty_penalty: float = 0.0
    """RT-1: the agent's reward in the learned sim less this times the simulator's uncertainty each step (MOPO:
    `RLVRWorld-RT1-v0`'s `uncertainty_penalty`; with `observation="state"` the state dynamics' disagreement)."""
    agent_share: float = 0.0
    """RT-1 state dynamics refits: least share of the agent's own real transitions in the refit's data, its episodes
    repeated until they make it (0: as they come). The agent's few episodes among the replay's thousands otherwise
    barely move the dynamics where the agent goes."""
    final_dynamics_steps: int = 0
    """RT-1 world models with state dynamics: after the last round's scoring, fit the last round's world's state
    dynamics this many steps further on every real episode of the agent (that scoring too) and the replay's, as a
    round's refit weights them (0: no final refit). The result, `State.final_world`, is the simulator to evaluate
    the final agent in: one it never trained in, so it is not the world the agent converged on exploiting. It may
    be added to a finished run (`--rounds` and this may change on resume)."""
    recalibrate: bool = True
    """RT-1: after each refit, set the task's success threshold afresh from open-loop replays of real episodes (every
    agent episode so far, and up to `calibration_replay` of the replay's for the task; `sim.robot.recalibrate_task`):
    a refit shifts the success probabilities of the frames it draws, and a threshold calibrated on the shipped model
    then pays, or withholds, success the real env does not."""
    calibration_replay: int = 32
    """RT-1: replay episodes of the task in each recalibration (when `replay` is given). Without real successes and
    failures among the episodes the threshold stays as it is."""
    surprise_prompts: float = 0.5
    """Fraction of the GRPO prompts from the steps where the refitted simulator was most wrong about the real next
    frame, state or success (`RT1RLVRConfig.surprise_prompts`, `TextGameRLVRConfig.surprise_prompts`)."""
    surprise_on: Literal["state", "outcome"] = "state"
    """Text: what makes a step surprising for the GRPO prompts, any error in the predicted next state or, first, an
    error in its outcome (score, gameOver, gameWon: a false or a missed win; `TextGameRLVRConfig.surprise_on`)."""
    win_share: float = 0.0
    """Text: the least share of the agent's transitions in each MLE refit that win the game (the winning ones are
    repeated until they make it; 0: as they come). Wins are a few percent of the agent's steps and the one outcome
    that pays: a refit that sees them as rarely as they come learns to predict few of them, and the simulator then
    withholds the success the real game gives."""
    real_updates: bool = False
    """Dyna: the agent also learns from its own real data steps, as the agent trained in the real env does. DQN: the
    round's real transitions (collected with `exploration`, as without) join its replay buffer, one gradient step
    each, before it learns in the learned sim. PPO: the data steps are one rollout of its own stochastic policy,
    which explores in place of `exploration`, and one PPO update on it. Off: the real steps only refit the world
    model."""
    shaping: float = 0.0
    """RT-1: weight of the dense reward the agent gets in the learned sim on top of its success, the change in the
    log-odds of success the simulator reports each step (`agents.robot.VecShaped`: read off the imagined frame, or
    with state dynamics the task's success margin on the predicted state); 0: success alone. The real env scores
    success alone either way."""
    reach: float = 0.0
    """RT-1: weight per metre of the reach term added to that dense reward (`agents.robot.VecShaped`: the decrease in
    the palm's distance to the drawer handle or behind the object to push, on the predicted state; needs a simulator
    with state dynamics); 0: none."""
    learning_rate: float = 0.0
    """Agent learning rate; 0: 3e-4 for PPO, 1e-4 for DQN."""
    n_steps: int = 32
    """PPO rollout length per sub-env."""
    pretrain_steps: int = 0
    """Agent steps inside the starting simulator before the first real step (they take no real steps): the first
    collect then follows a policy that has learned the simulator's games, and visits the states near success that
    the refit needs, instead of a random policy's."""
    pretrain_checkpoint: str = ""
    """The simulator the pretraining runs in (a shipped name or a directory); empty: the starting world model. A
    model that ranks policies as the real env does can teach the first policy, while the refits start from one that
    predicts single steps better."""
    score_data: bool = False
    """Every scoring is data too. The agent is also scored before round 0 (after any pretraining; its record is round
    -1), and each scoring's real episodes (greedy) join the next refit's data, GRPO prompts included (text: the games
    `score_in_real` plays, and with `real_updates` DQN learns from them as from the collect phase's; tabletop: each
    scoring from held-out start states of its own, since the refit adds a scoring's starts to the simulator's).
    Real steps are counted the same either way; off, a scoring only measures. With it `real_steps` may be 0: the
    loop's real steps are then its scorings alone, its own greedy policy."""
    seed: int = 0
    """Seeds the agent, its exploration and the real start states' order."""

    @property
    def world_checkpoint(self) -> str:
        return self.checkpoint or DEFAULT_CHECKPOINTS[self.env]

    @property
    def steps_per_episode(self) -> int:
        return self.horizon or DEFAULT_HORIZONS[self.env]

    @property
    def agent_learning_rate(self) -> float:
        return self.learning_rate or (1e-4 if self.algo == "dqn" else 3e-4)


@dataclass
class State:
    round: int = 0
    phase: str = PHASES[0]
    """The next phase to run in `round`."""
    real_steps_total: int = 0
    world: str = ""
    """The world model the agent trains in now."""
    collect_seed: int = 0
    """The next real start state's index in the collection run (tabletop) or the list of games (text)."""
    history: list = field(default_factory=list)
    final_world: str = ""
    """The final refit's world model (`CoTrainConfig.final_dynamics_steps`), once made."""


def resolve_world(config: CoTrainConfig) -> str:
    return world_dir(config, config.world_checkpoint)


def world_dir(config: CoTrainConfig, name: str) -> str:
    """The directory of a world model of the loop's env: a shipped name or a directory."""
    if config.env == RT1_ENV:
        from rlvr_gym.models.robot_world_model import RobotWorldModel

        return str(RobotWorldModel.resolve(name))
    from rlvr_gym.models.lm import resolve_checkpoint as resolve_lm

    return str(resolve_lm(name))


def load_state(config: CoTrainConfig, out: Path) -> State:
    path = out / "state.json"
    if not path.is_file():
        return State(world=resolve_world(config), phase=first_phase(config))
    saved = json.loads(path.read_text())
    recorded = recorded_config(out)
    changed = {k for k, v in asdict(config).items() if recorded[k] != v and k not in RESUMABLE_CHANGES}
    if changed:
        raise ValueError(f"{out} holds a run with other settings ({sorted(changed)}); resume it with the same "
                         "flags (only --rounds may grow, and --final-dynamics-steps change) or pick another --out")
    return State(**saved)


def first_phase(config: CoTrainConfig) -> str:
    if config.pretrain_steps:
        return PRETRAIN
    return START_SCORE if config.score_data else PHASES[0]


def recorded_config(out: Path) -> dict:
    """The settings a run in `out` was started with; a setting added since counts as its default, so that a run
    survives an upgrade."""
    return {**asdict(CoTrainConfig()), **json.loads((out / "config.json").read_text())}


def save_state(state: State, out: Path) -> None:
    atomic_write_text(out / "state.json", json.dumps(asdict(state), indent=1))


# ---------------------------------------------------------------------------------------------------- phases
# Each phase takes the config and the state; the domain's own part follows below.


def collect(agent: BaseAlgorithm, config: CoTrainConfig, state: State, out: Path) -> None:
    """(a) The agent, with exploration, in the real env until `real_steps` steps; written to out/real."""
    steps = (collect_rt1 if config.env == RT1_ENV else collect_text)(agent, config, state, out)
    state.real_steps_total += steps


def refit(config: CoTrainConfig, state: State, out: Path, run_dir: Path) -> str:
    """(b) MLE on every agent episode so far (plus replay), then GRPO on this round's; returns the new world dir."""
    return (refit_rt1 if config.env == RT1_ENV else refit_text)(config, state, out, run_dir)


def make_agent(config: CoTrainConfig, world: str) -> tuple[BaseAlgorithm, object]:
    """A fresh agent on the learned simulator of `world`, and that env."""
    env = make_sim_env(config, world)
    return new_agent(config, env), env


def new_agent(config: CoTrainConfig, env) -> BaseAlgorithm:
    """The loop's SB3 agent, untrained, on `env` (a learned or a real one)."""
    common = {"learning_rate": config.agent_learning_rate, "seed": config.seed, "device": "cpu",
              "policy_kwargs": {"net_arch": [64, 64]}, "verbose": 0}
    from agents.textgame import SlotDQNPolicy

    if config.algo == "dqn":
        # Target updates and learning start scaled to a loop's few thousand simulated steps per round.
        agent = DQN(SlotDQNPolicy, env, buffer_size=10_000, learning_starts=min(256, config.sim_steps // 2),
                    batch_size=64, train_freq=1, target_update_interval=500, exploration_fraction=0.3, **common)
    else:
        agent = PPO(ppo_policy(config.env), env, n_steps=config.n_steps, n_epochs=4,
                    batch_size=min(128, config.n_steps * env.num_envs), **common)
    return silent(agent)


def ppo_policy(env: str):
    """PPO's policy for `env`: for the text games one network scoring every action slot, else SB3's MlpPolicy."""
    from agents.textgame import SlotActorCriticPolicy

    return SlotActorCriticPolicy if env == TEXT_ENV else "MlpPolicy"


def silent(agent: BaseAlgorithm) -> BaseAlgorithm:
    """`agent` with a logger that writes nothing: SB3 otherwise makes an empty temp directory at every learn() (the
    loop logs its own TensorBoard scalars)."""
    agent.set_logger(Logger(None, []))
    return agent


def make_sim_env(config: CoTrainConfig, world: str):
    if config.env == RT1_ENV:
        from agents.robot import make_sim_env as make_rt1_env

        return make_rt1_env(world, config.num_envs, config.task, config.steps_per_episode, config.frame_size,
                            shaping=config.shaping, precision=config.precision, reach=config.reach,
                            observation=config.observation, uncertainty_penalty=config.uncertainty_penalty)
    from rlvr_gym.sim.sb3 import SB3VecEnv
    from rlvr_gym.sim.textgame import TextGameDiscreteVectorEnv

    return SB3VecEnv(TextGameDiscreteVectorEnv(config.num_envs, world, max_steps=config.steps_per_episode,
                                               autoreset_mode=AutoresetMode.DISABLED))


def score_in_real(agent: BaseAlgorithm, config: CoTrainConfig, world: str, first: int = 0) -> tuple[float, int]:
    """(d) Real success rate over `eval_episodes` (tabletop: the held-out starts from the `first`-th on), and the real
    steps that took."""
    if config.env == RT1_ENV:
        from agents.robot import evaluate_in_real

        real = evaluate_in_real(agent, config.eval_episodes, config.task, config.steps_per_episode, first=first)
    else:
        from agents.textgame import evaluate_in_real

        real = evaluate_in_real(agent, world, config.eval_episodes, config.seed, config.steps_per_episode)
    return real["success_rate"], int(round(real["mean_length"] * real["episodes"]))


def learned_success(agent: BaseAlgorithm, world: str, config: CoTrainConfig, episodes: int, first: int = 0) -> float:
    """The agent's success rate inside the learned simulator of `world`, from the starts it is scored from in the
    real env (tabletop: the held-out starts from the `first`-th on, as `score_rt1` takes them)."""
    if config.env == RT1_ENV:
        from agents.robot import evaluate_in_learned

        return evaluate_in_learned(agent, world, episodes, config.task, config.steps_per_episode, first=first,
                                   precision=config.precision, observation=config.observation,
                                   num_envs=config.num_envs, seed=config.seed)
    from agents.textgame import evaluate_in_learned

    return evaluate_in_learned(agent, world, episodes, config.seed, config.steps_per_episode, config.num_envs)


# ---------------------------------------------------------------------------------------------------- RT-1


def collect_rt1(agent: BaseAlgorithm, config: CoTrainConfig, state: State, out: Path) -> int:
    from envs.robot import RealRT1Env
    from rlvr_gym.data.episodes import write_shards

    if config.real_steps == 0:  # `score_data`: the scorings are the only data (`rt1_agent_data`)
        return 0
    rng = np.random.default_rng([config.seed, state.round])
    env = RealRT1Env(task=config.task, horizon=config.steps_per_episode)
    if config.real_updates:
        episodes = learn_in_real_rt1(agent, env, config, state)
        agent.save(out / REAL_UPDATED_AGENT)
    else:
        episodes, steps = [], 0
        with tqdm(total=config.real_steps, desc=f"round {state.round}: collect (real)", unit="step", leave=False) as bar:
            while steps < config.real_steps:
                episodes.append(agent_episode(env, agent, collect_seed(state), config, rng))
                steps += len(episodes[-1])
                bar.update(len(episodes[-1]))
    env.close()
    write_shards(episodes, out / "real", split="train", config={"round": state.round, "policy": "agent"}, overwrite=True)
    return sum(len(e) for e in episodes)


REAL_UPDATED_AGENT = "agent_real.zip"
"""The tabletop agent after the round's real updates, which a run resumed before the round's agent phase goes on
with."""


def collect_seed(state: State) -> int:
    """The env seed of the next real start state the agent collects data from."""
    from rlvr_gym.data.episodes import SEEDS_PER_RUN

    state.collect_seed += 1
    return COLLECT_SEED_RUN * SEEDS_PER_RUN + state.collect_seed - 1


def learn_in_real_rt1(agent: PPO, env, config: CoTrainConfig, state: State) -> list:
    """Dyna's direct RL on the tabletop: one PPO update on a rollout of `real_steps` real steps of the agent's own
    stochastic policy (a PPO learner on the real env that shares the agent's policy and optimizer, as the agent trained
    in the real env learns); the rollout's episodes are the round's data."""
    from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

    from agents.robot import StateObservation, VecFrames
    from rlvr_gym.data.episodes import EpisodeRecorder

    recorder = EpisodeRecorder(env, "agent", lambda: collect_seed(state))
    if config.observation == "state":
        venv = VecMonitor(DummyVecEnv([lambda: StateObservation(recorder)]))
    else:
        venv = VecFrames(VecMonitor(DummyVecEnv([lambda: recorder])), config.frame_size)
    learner = PPO("MlpPolicy", venv, n_steps=config.real_steps, n_epochs=4, batch_size=max(1, config.real_steps // 4),
                  learning_rate=config.agent_learning_rate, seed=config.seed + 1000 * state.round, device="cpu",
                  policy_kwargs={"net_arch": [64, 64]}, verbose=0)
    silent(learner)
    learner.policy = agent.policy
    with tqdm(total=config.real_steps, desc=f"round {state.round}: collect and learn (real)", unit="step",
              leave=False) as bar:
        learner.learn(config.real_steps, callback=lambda *_: bar.update() or True)
    return recorder.finish()


def agent_episode(env, agent: BaseAlgorithm, seed: int, config: CoTrainConfig, rng: np.random.Generator):
    """One real tabletop episode of the agent's deterministic action plus exploration noise."""
    from rlvr_gym.data.episodes import collect_episode
    from rlvr_gym.evaluation.policies import sb3_real_actor

    greedy = sb3_real_actor(agent)

    def act(frame: np.ndarray, info: dict) -> np.ndarray:
        return greedy(frame, info) + rng.normal(0, config.exploration, 7)

    return collect_episode(env, config.task, "agent", seed, act)


def refit_rt1(config: CoTrainConfig, state: State, out: Path, run_dir: Path) -> str:
    from rlvr_gym.data.robot import (
        episode_codes,
        load_initial_states,
        mle_examples,
        with_episode_starts,
        write_initial_states,
    )
    from rlvr_gym.models.lm import load_model
    from rlvr_gym.models.robot_world_model import RobotWorldModel
    from rlvr_gym.train.robot import save_with_initial_states
    from rlvr_gym.train.rt1_rlvr import RT1RLVRConfig, run_rt1_rlvr

    world = RobotWorldModel.load(state.world)
    agent_data, seen, replay = rt1_refit_data(config, state, run_dir)
    mixed = seen + replay
    examples = [ex for e in tqdm(mixed, desc=f"round {state.round}: refit (tokenise)", unit="episode", leave=False)
                for ex in mle_examples(episode_codes(world.frame_tokenizer, e), e, world.settings.context_steps + 2)]
    sft = SFTConfig(run_dir=str(out / "mle"), model=str(Path(state.world) / "lm"), steps=config.mle_steps,
                    lr=config.mle_lr, warmup_steps=min(10, config.mle_steps // 4), batch_size=8, micro_batch=8,
                    save_every=max(config.mle_steps, 1), seed=config.seed, resume=(out / "mle" / "checkpoints").exists())
    world.lm = load_model(train_sft(sft, examples))[0].eval()
    if world.state_dynamics is not None and config.dynamics_steps:
        world.state_dynamics = refit_dynamics(config, state, out, agent_data, seen, replay)
    mle_dir = save_with_initial_states(world, state.world, out / "world_mle")
    # The simulator resets from its own real start states and every one the agent has seen: with the agent's alone,
    # the first round's agent would learn from a handful of starts.
    starts = with_episode_starts(load_initial_states(state.world), seen)
    write_initial_states(mle_dir, starts)
    if config.grpo_steps == 0:
        return recalibrate_rt1(mle_dir, config, seen, replay, out)
    grpo = GRPOConfig(steps=config.grpo_steps, lr=3e-5, prompts_per_step=4, group_size=8, beta=0.0, temperature=0.5,
                      save_every=max(config.grpo_steps, 1), seed=config.seed,
                      resume=(out / "rlvr" / "checkpoints").exists())
    # GRPO's prompts: the agent's newest real steps, the round's collect or else the scoring before it.
    newest = out / "real" if (out / "real").is_dir() else agent_data[-1]
    recipe = RT1RLVRConfig(data=str(newest), model=str(mle_dir), out=str(out / "rlvr"), horizon=1,
                           rollout_depth=1, surprise_prompts=config.surprise_prompts, seed=config.seed, grpo=grpo)
    rlvr_dir = run_rt1_rlvr(recipe)
    write_initial_states(rlvr_dir, starts)
    return recalibrate_rt1(rlvr_dir, config, seen, replay, out)


def rt1_refit_data(config: CoTrainConfig, state: State, run_dir: Path) -> tuple[list[Path], list, list]:
    """What a tabletop refit learns from: the agent's real episode directories (`rt1_agent_data`), their episodes
    and the replay's."""
    from rlvr_gym.data.episodes import load_episodes

    agent_data = rt1_agent_data(config, state, run_dir)
    seen = [e for directory in agent_data for e in load_episodes(directory)]
    return agent_data, seen, load_episodes(config.replay) if config.replay else []


def rt1_agent_data(config: CoTrainConfig, state: State, run_dir: Path) -> list[Path]:
    """The agent's real episode directories that round `state.round`'s refit learns from: every collect so far, then
    (`score_data`) every scoring before this round's refit in order (without collects, the newest is last)."""
    collected = [run_dir / f"round_{r:02d}" / "real" for r in range(state.round + 1)]
    scorings = score_dirs(run_dir, state.round) if config.score_data else []
    return [d for d in collected if d.is_dir()] + scorings


def refit_dynamics(config: CoTrainConfig, state: State, out: Path, agent_data: list[Path], seen: list,
                   replay: list):
    """The world model's state dynamics fit further on the agent's real episodes (`rt1_agent_data`, the episodes
    `seen`), repeated to make `agent_share` of the data, and the replay's (out/dynamics, resumable)."""
    from rlvr_gym.models.robot_world_model import load_state_dynamics
    from rlvr_gym.train.state_dynamics import DynamicsConfig, train_state_dynamics

    repeats = agent_repeats(sum(len(e) for e in seen), sum(len(e) for e in replay), config.agent_share)
    data = tuple(str(directory) for directory in agent_data) * repeats
    dynamics = DynamicsConfig(run_dir=str(out / "dynamics"), model=str(Path(state.world) / "state_dynamics"),
                              data=data + ((config.replay,) if config.replay else ()), steps=config.dynamics_steps,
                              lr=3e-4, warmup_steps=0, save_every=config.dynamics_steps, seed=config.seed,
                              resume=(out / "dynamics" / "checkpoints").exists())
    return load_state_dynamics(train_state_dynamics(dynamics))


def final_refit_rt1(config: CoTrainConfig, state: State, out: Path, run_dir: Path) -> str:
    """`CoTrainConfig.final_dynamics_steps`: the last round's world with its state dynamics refit on every real
    episode so far (out/world_mle, resumable), its start states the agent's too."""
    from rlvr_gym.data.robot import load_initial_states, with_episode_starts, write_initial_states
    from rlvr_gym.models.robot_world_model import RobotWorldModel
    from rlvr_gym.train.robot import save_with_initial_states

    world = RobotWorldModel.load(state.world)
    agent_data, seen, replay = rt1_refit_data(config, state, run_dir)  # after the last round: all of them
    final = replace(config, dynamics_steps=config.final_dynamics_steps)
    world.state_dynamics = refit_dynamics(final, state, out, agent_data, seen, replay)
    final_dir = save_with_initial_states(world, state.world, out / "world_mle")
    write_initial_states(final_dir, with_episode_starts(load_initial_states(state.world), seen))
    log.info("final refit: %s", final_dir)
    return str(final_dir)


def agent_repeats(agent_steps: int, replay_steps: int, share: float) -> int:
    """How many times the agent's transitions go into a refit so that they make at least `share` of it."""
    if share <= 0 or agent_steps == 0:
        return 1
    return max(1, math.ceil(share * replay_steps / ((1 - share) * agent_steps)))


def recalibrate_rt1(world_dir: Path, config: CoTrainConfig, seen: list, replay: list, out: Path) -> str:
    """The refitted world's success threshold for the task, set from replays of the agent's real episodes and the
    replay's (`CoTrainConfig.recalibrate`); the result in out/calibration.json. A world model with state dynamics
    keeps the task's own test."""
    from rlvr_gym.sim.robot import recalibrate_task

    if not config.recalibrate or (Path(world_dir) / "state_dynamics").exists():
        return str(world_dir)
    replay = [e for e in replay if e.task == config.task]
    chosen = np.random.default_rng(config.seed).permutation(len(replay))[: config.calibration_replay]
    episodes = [e for e in seen if e.task == config.task] + [replay[i] for i in sorted(chosen)]
    if len({bool(e.succeeded) for e in episodes}) < 2:
        log.info("round %s: no recalibration, the real %s episodes hold no %s", out.name, config.task,
                 "failure" if episodes and episodes[0].succeeded else "success")
        return str(world_dir)
    result = recalibrate_task(world_dir, config.task, episodes)
    atomic_write_text(out / "calibration.json", json.dumps(result, indent=1))
    log.info("round %s: %s threshold %.3g (balanced accuracy %.2f on %d real episodes, %d successes)", out.name,
             config.task, result["threshold"], result["balanced_accuracy"], len(episodes), result["real_successes"])
    return str(world_dir)


def score_rt1(agent: BaseAlgorithm, config: CoTrainConfig, state: State, out: Path) -> list:
    """`score_in_real` recorded (`CoTrainConfig.score_data`): the agent's greedy episodes from `eval_episodes` held-out
    start states of this scoring's own, written to out/ as `collect_rt1` writes its data, and returned. The k-th
    scoring of a run starts from the held-out starts k * eval_episodes on (`agents.robot.real_start_states`): the
    refit adds a scoring's starts to the simulator's, so a later scoring reusing them would not be held out."""
    from agents.robot import real_start_states
    from envs.robot import RealRT1Env
    from rlvr_gym.data.episodes import collect_episode, write_shards
    from rlvr_gym.evaluation.policies import sb3_real_actor

    actor = sb3_real_actor(agent)
    starts = real_start_states(config.eval_episodes, config.task, first=scoring_first(config, state))
    env = RealRT1Env(task=config.task, horizon=config.steps_per_episode)
    episodes = [collect_episode(env, config.task, "agent", seed, actor)
                for _, seed in tqdm(starts, desc="score (real, recorded)", unit="episode", leave=False)]
    env.close()
    write_shards(episodes, out, split="train", config={"round": state.round, "policy": "agent", "scoring": True},
                 overwrite=True)
    return episodes


REPLAYED_CALLS = ("replayed_failures_paid", "replayed_successes_paid")


def replayed_calls(world: str, episodes: list, config: CoTrainConfig) -> dict[str, float]:
    """How honest the simulator the agent was trained in is on the agent's own fresh real episodes (a scoring no
    refit has seen yet): each replayed open loop under its real actions (`sim.robot.success_agreement`), the share of
    the real failures it pays and of the real successes (NaN when the scoring has none). A simulator that pays the
    agent's real failures is one it can still exploit."""
    from rlvr_gym.sim.robot import success_agreement

    calls = success_agreement(world, episodes, config.precision)[config.task]
    return {"replayed_failures_paid": calls["failures_paid"], "replayed_successes_paid": calls["successes_paid"]}


def scoring_first(config: CoTrainConfig, state: State) -> int:
    """The first held-out start of the tabletop scoring about to be made (`score_rt1`); 0 without `score_data`, whose
    scorings all start from the first `eval_episodes` (`agents.robot.evaluate_in_real`)."""
    return len(state.history) * config.eval_episodes if config.score_data else 0


# ---------------------------------------------------------------------------------------------------- text game


def collect_text(agent: BaseAlgorithm, config: CoTrainConfig, state: State, out: Path) -> int:
    """The agent in the real TextWorld games of the world's start states, taken in turn; each step a ByteSized32
    record (as `rlvr-gym collect textworld` writes them) in out/real/transitions.jsonl.gz."""
    rng = np.random.default_rng([config.seed, state.round])
    with tqdm(total=config.real_steps, desc=f"round {state.round}: collect (real)", unit="step", leave=False) as bar:
        games = ((index, config.seed) for index in itertools.count(state.collect_seed))
        wins, steps = play_text(agent, config.steps_per_episode, state.world, games, config.exploration, rng,
                                out / "real", bar, budget=config.real_steps)
    state.collect_seed += len(wins)
    return steps


def score_text(agent: BaseAlgorithm, config: CoTrainConfig, world: str, out: Path) -> tuple[float, int]:
    """`score_in_real`'s episodes (`agents.textgame.evaluate_in_real`: the same games, order and seeds, greedy),
    recorded in out/ as `collect_text` records its own: `CoTrainConfig.score_data`."""
    from agents.textgame import scored_games
    from rlvr_gym.sim.textgame import load_start_states

    games = scored_games(len(load_start_states(world)), config.eval_episodes, config.seed)
    with tqdm(desc="score (real, recorded)", unit="step", leave=False) as bar:
        wins, steps = play_text(agent, config.steps_per_episode, world, iter(games), 0.0, np.random.default_rng(0),
                                out, bar)
    return float(np.mean(wins)), steps


def play_text(agent: BaseAlgorithm | None, horizon: int, world: str, games, exploration: float,
              rng: np.random.Generator, out: Path, bar, budget: int | None = None) -> tuple[list[bool], int]:
    """The agent in the real games `games` yields ((start index, modulo the start states), reset seed), one episode
    each of at most `horizon` steps, until they run out or `budget` steps are taken (whole episodes); with
    probability `exploration` a step takes a uniformly random candidate, and every step without an agent (None:
    uniformly random play in the default spaces). Every step a ByteSized32 record in
    out/transitions.jsonl.gz, and the steps as the agent saw them in out/agent_transitions.npz (for
    `CoTrainConfig.real_updates`). Returns each episode's win and the steps taken."""
    from agents.textgame import RealTextWorldDiscreteEnv
    from envs.textworld import game_name
    from envs.textworld.play import Transition
    from rlvr_gym.data.textgame import textworld_record, write_transitions

    if agent is None:
        env, exploration = RealTextWorldDiscreteEnv(world, horizon), 1.0
    else:
        env = RealTextWorldDiscreteEnv(world, horizon, max_candidates=int(agent.action_space.n),
                                       obs_dim=int(agent.observation_space.shape[0]))
    n = env.max_candidates
    records, steps, wins, seen = [], 0, [], {key: [] for key in AGENT_TRANSITION_KEYS}
    try:
        for index, reset_seed in games:
            if budget is not None and steps >= budget:
                break
            index %= len(env.starts)
            start = env.starts[index]
            name = game_name(start.seed, start.nb_rooms, start.nb_objects, start.quest_length)
            obs, info = env.reset(seed=reset_seed, options={"index": index})
            previous, done = "", False
            while not done:
                choices = min(len(info["candidates"]), n)
                if choices and rng.random() < exploration:
                    action = int(rng.integers(choices))
                else:
                    action = int(agent.predict(obs, deterministic=True)[0])
                before, before_obs = info["state"], obs
                obs, reward, terminated, truncated, info = env.step(action)
                for key, value in zip(AGENT_TRANSITION_KEYS, (before_obs, obs, action, reward, terminated, truncated)):
                    seen[key].append(value)
                step = Transition(before, info["command"], info["state"], reward, terminated, info["is_success"], [])
                records.append(textworld_record(name, len(records), start.objective, previous, step))
                previous, done = info["command"], terminated or truncated
                steps += 1
                bar.update()
            wins.append(bool(info["is_success"]))
    finally:
        env.close()
    write_transitions(records, out)
    np.savez_compressed(out / AGENT_TRANSITIONS, **{k: np.asarray(v) for k, v in seen.items()})
    return wins, steps


RANDOM_PLAYER = "random"
"""`RecordPlayConfig.agents` entry for uniformly random play."""


@dataclass
class RecordPlayConfig:
    agents: tuple[str, ...] = ()
    """Saved SB3 text agents (.zip, e.g. a loop's round_NN/agent.zip or a real-env arm's pointK.zip), or `random`:
    uniformly random candidate commands (the real outcomes of the play an exploiting agent starts from)."""
    algo: Literal["dqn", "ppo"] = "dqn"
    """The agents' SB3 algorithm."""
    out: str = "runs/textworld/agent-play"
    """Output directory: transitions.jsonl.gz of every agent's play, and each agent's in agent_NN/."""
    world: str = "textgame-rlvr"
    """The world model whose start states (real TextWorld games) the agents play."""
    episodes_per_game: int = 1
    """Episodes of each agent in each game."""
    exploration: float = 0.1
    """Probability that a step takes a uniformly random candidate command instead of the agent's (`random`: 1)."""
    horizon: int = DEFAULT_MAX_STEPS
    seed: int = 0


def record_play(config: RecordPlayConfig) -> dict:
    """Trained agents' play in the real games, as ByteSized32 records: the states such agents drive a simulator into,
    for a refit (`rlvr-gym train textgame-sft --textworld OUT`) that a co-training loop's own data, one agent's
    play, covers less. An agent already recorded with the same settings is skipped, so a killed run resumes."""
    from rlvr_gym.data.textgame import TEXTWORLD_FILE, write_transitions
    from rlvr_gym.sim.textgame import load_start_states

    if not config.agents:
        raise ValueError("--agents: give at least one saved agent (.zip)")
    missing = [a for a in config.agents if a != RANDOM_PLAYER and not Path(a).is_file()]
    if missing:
        raise FileNotFoundError(f"no saved agent at {missing}")
    world = world_dir(CoTrainConfig(env=TEXT_ENV), config.world)
    out = Path(config.out)
    games = len(load_start_states(world))
    records, wins = [], []
    for k, path in enumerate(config.agents):
        part = out / f"agent_{k:02d}"
        random_play = path == RANDOM_PLAYER
        played = {"agent": str(path), "world": str(world), "episodes_per_game": config.episodes_per_game,
                  "exploration": 1.0 if random_play else config.exploration, "horizon": config.horizon,
                  "seed": config.seed}
        recorded = json.loads((part / "wins.json").read_text()) if (part / "wins.json").is_file() else {}
        if {key: v for key, v in recorded.items() if key != "wins"} != played:
            agent = None if random_play else (DQN if config.algo == "dqn" else PPO).load(path, device="cpu")
            rng = np.random.default_rng([config.seed, k])
            plays = [(index, config.seed + episode) for episode in range(config.episodes_per_game)
                     for index in range(games)]
            with tqdm(desc=f"agent {k}: {path}", unit="step", leave=False) as bar:
                won, _ = play_text(agent, config.horizon, world, iter(plays), config.exploration, rng, part, bar)
            recorded = {**played, "wins": won}
            atomic_write_text(part / "wins.json", json.dumps(recorded))
        with gzip.open(part / TEXTWORLD_FILE, "rt", encoding="utf-8") as f:
            records += [json.loads(line) for line in f]
        wins.append(float(np.mean(recorded["wins"])))
    write_transitions(records, out)
    return {"transitions": len(records), "agents": len(config.agents), "win_rate": wins, "out": str(out)}


AGENT_TRANSITIONS = "agent_transitions.npz"
"""The collect phase's real steps as the agent saw them (observation, action, reward, next observation), for
`CoTrainConfig.real_updates`."""
AGENT_TRANSITION_KEYS = ("obs", "next_obs", "action", "reward", "terminated", "truncated")


def learn_from_real(agent: DQN, path: Path) -> int:
    """Dyna's direct RL: the real transitions into the agent's replay buffer, one gradient step per transition (the
    agent trained in the real env takes as many), then the target network set to the trained one. Returns the
    number of transitions learned from."""

    data = np.load(path)
    width = agent.replay_buffer.n_envs
    # The buffer stores `width` transitions per row and samples every slot of a row: the last partial row stays out.
    rows = len(data["action"]) // width
    for row in range(rows):
        cut = slice(row * width, (row + 1) * width)
        timeouts = data["truncated"][cut] & ~data["terminated"][cut]
        agent.replay_buffer.add(data["obs"][cut], data["next_obs"][cut], data["action"][cut], data["reward"][cut],
                                data["terminated"][cut] | data["truncated"][cut],
                                [{"TimeLimit.truncated": bool(t)} for t in timeouts])
    if rows:
        if not hasattr(agent, "_logger"):  # train() logs; an agent that has not learned yet has no logger
            silent(agent)
        agent.train(gradient_steps=rows * width, batch_size=agent.batch_size)
        agent.q_net_target.load_state_dict(agent.q_net.state_dict())
    return rows * width


def refit_text(config: CoTrainConfig, state: State, out: Path, run_dir: Path) -> str:
    from rlvr_gym.data.bytesized32 import load_transitions
    from rlvr_gym.data.textgame import TEXTWORLD_FILE, write_transitions
    from rlvr_gym.domains.textgame import wins
    from rlvr_gym.train.textgame import (
        TextGameRLVRConfig,
        TextGameSFTConfig,
        run_textgame_rlvr,
        run_textgame_sft,
        weight_toward,
    )

    def records(directory: Path) -> list[dict]:
        with gzip.open(directory / TEXTWORLD_FILE, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    scorings = score_dirs(run_dir, state.round) if config.score_data else []
    collected = [run_dir / f"round_{r:02d}" / "real" for r in range(state.round + 1)]
    collected_records = [records(directory) for directory in collected]
    scored_records = [records(directory) for directory in scorings]
    seen = [record for part in collected_records + scored_records for record in part]
    # GRPO's prompts: the agent's newest real steps, the round's collect and the scoring before it.
    newest = out / "real"
    if scorings:
        newest = write_transitions(collected_records[-1] + scored_records[-1], out / "newest").parent
    won = [wins(r["current_score_state"], r["next_score_state"]) for r in seen]
    seen = weight_toward(seen, won, config.win_share)
    seen_file = write_transitions(seen, out / "seen")
    if config.replay:
        # The agent's transitions at least as many as the replay's, so that the refit learns the games it plays.
        copies = max(1, math.ceil(len(load_transitions(config.replay)) / len(seen)))
        data, textworld = config.replay, str(out / "seen")
    else:
        data, textworld, copies = str(seen_file), "", 1
    sft = TextGameSFTConfig(
        run_dir=str(out / "mle"), data=data, textworld=textworld, textworld_copies=copies, eval_data="",
        model=state.world, balance=None, eval_accuracy_examples=0, seed=config.seed,
        resume=(out / "mle" / "checkpoints").exists(),
        sft=SFTConfig(steps=config.mle_steps, lr=config.mle_lr, warmup_steps=min(10, config.mle_steps // 4),
                      batch_size=8, micro_batch=4, save_every=max(config.mle_steps, 1), eval_examples=0),
    )
    mle_dir = with_start_states(run_textgame_sft(sft), state.world)
    if config.grpo_steps == 0:
        return str(mle_dir)
    recipe = TextGameRLVRConfig(
        run_dir=str(out / "rlvr"), model=str(mle_dir), data=str(newest / TEXTWORLD_FILE), eval_data="",
        eval_accuracy_examples=0, surprise_prompts=config.surprise_prompts, surprise_on=config.surprise_on,
        seed=config.seed,
        resume=(out / "rlvr" / "checkpoints").exists(),
        grpo=GRPOConfig(steps=config.grpo_steps, lr=5e-5, prompts_per_step=4, group_size=8, max_new_tokens=128,
                        temperature=0.7, beta=0.0, micro_batch=8, save_every=max(config.grpo_steps, 1),
                        seed=config.seed),
    )
    return str(with_start_states(run_textgame_rlvr(recipe), state.world))


def with_start_states(model_dir: Path, world: str) -> Path:
    """The refitted model beside its simulator's start states (and their real-env versions), copied from `world`."""
    from rlvr_gym.data.real_env_versions import REAL_ENV_FILE
    from rlvr_gym.sim.textgame import START_STATES

    for name in (START_STATES, REAL_ENV_FILE):
        if (Path(world) / name).is_file():
            shutil.copy2(Path(world) / name, Path(model_dir) / name)
    return Path(model_dir)


# ---------------------------------------------------------------------------------------------------- the loop


def check_config(config: CoTrainConfig) -> None:
    if config.env not in ALGOS:
        raise ValueError(f"unknown --env {config.env!r}: use one of {sorted(ALGOS)}")
    if config.algo not in ALGOS[config.env]:
        raise ValueError(f"--algo {config.algo} does not fit {config.env}: use one of {ALGOS[config.env]}")
    if config.env == RT1_ENV:
        from envs.robot import TASKS
        from rlvr_gym.models.robot_world_model import PRECISIONS
        from rlvr_gym.sim.robot import OBSERVATIONS

        if config.task not in TASKS:
            raise ValueError(f"unknown task {config.task!r}: use one of {TASKS}")
        if config.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {PRECISIONS}, got {config.precision!r}")
        if config.observation not in OBSERVATIONS:
            raise ValueError(f"--observation must be one of {OBSERVATIONS}, got {config.observation!r}")
    elif config.precision != "float32" or config.reach or config.observation != "frame" or config.uncertainty_penalty:
        raise ValueError("--precision, --reach, --observation and --uncertainty-penalty are the tabletop simulator's "
                         "(RLVRWorld-RT1-v0)")
    for name in ("rounds", "real_steps", "eval_episodes", "sim_steps", "num_envs", "n_steps", "calibration_replay"):
        least = 0 if name == "real_steps" and config.score_data else 1  # with score_data the scorings are data
        if getattr(config, name) < least:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(config, name)}")
    if config.horizon < 0 or config.mle_steps < 1 or config.grpo_steps < 0 or config.exploration < 0 \
            or config.learning_rate < 0 or config.shaping < 0 or config.reach < 0 or config.pretrain_steps < 0 \
            or config.uncertainty_penalty < 0:
        raise ValueError("--mle-steps must be >= 1, --horizon, --grpo-steps, --exploration, --learning-rate, "
                         "--shaping, --reach, --pretrain-steps and --uncertainty-penalty >= 0")
    if config.real_updates and config.env == TEXT_ENV and config.algo != "dqn":
        raise ValueError("--real-updates in the text games takes --algo dqn")
    if config.surprise_on not in ("state", "outcome"):
        raise ValueError(f"--surprise-on is state or outcome, got {config.surprise_on!r}")
    if config.final_dynamics_steps < 0:
        raise ValueError(f"--final-dynamics-steps must be >= 0, got {config.final_dynamics_steps}")
    if config.final_dynamics_steps and not (
            config.env == RT1_ENV and (Path(resolve_world(config)) / "state_dynamics").is_dir()):
        raise ValueError("--final-dynamics-steps refits a tabletop world model's state dynamics: "
                         f"{config.world_checkpoint} has none (rt1-dynamics has them)")
    if not 0 <= config.agent_share < 1:
        raise ValueError(f"--agent-share must be in [0, 1), got {config.agent_share}")
    if not 0 <= config.win_share < 1:
        raise ValueError(f"--win-share is a fraction in [0, 1), got {config.win_share}")
    if config.env == TEXT_ENV and config.exploration > 1:
        raise ValueError(f"--exploration is a probability for the text games, got {config.exploration}")
    if config.pretrain_checkpoint:
        if not config.pretrain_steps:
            raise ValueError("--pretrain-checkpoint is the simulator of the pretraining: give --pretrain-steps too")
        world_dir(config, config.pretrain_checkpoint)  # a missing one fails now, not after a round


def load_agent(config: CoTrainConfig, path: Path, env) -> BaseAlgorithm:
    agent = silent((DQN if config.algo == "dqn" else PPO).load(path, env=env, device="cpu"))
    if config.algo == "dqn" and path.with_name("replay_buffer.pkl").is_file():
        agent.load_replay_buffer(path.with_name("replay_buffer.pkl"))
    return agent


def resumed_agent(out: Path, state: State) -> Path | None:
    """The agent a resumed run goes on with: the one after this round's real updates until the round's agent phase
    has saved its own, else the last one saved."""
    real = out / f"round_{state.round:02d}" / REAL_UPDATED_AGENT
    if state.phase in ("refit", "agent") and real.is_file():
        return real
    return out / "agent.zip" if (out / "agent.zip").is_file() else None


def save_agent(agent: BaseAlgorithm, round_dir: Path, out: Path) -> None:
    """The round's agent, then the run's current one (with DQN's replay buffer, so a resumed run loses none)."""
    agent.save(round_dir / "agent.zip")
    if isinstance(agent, DQN):
        agent.save_replay_buffer(out / "replay_buffer.pkl")
    shutil.copy2(round_dir / "agent.zip", out / "agent.zip")


def run_cotrain(config: CoTrainConfig) -> dict:
    """Run (or resume) the loop; returns the last round's record."""
    check_config(config)
    torch.set_num_threads(1)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    state = load_state(config, out)
    atomic_write_text(out / "config.json", json.dumps(asdict(config), indent=1))
    writer = SummaryWriter(str(out / "tensorboard"))
    agent, env = make_agent(config, state.world)
    saved = resumed_agent(out, state)
    if saved is not None:
        agent = load_agent(config, saved, env)
    if state.phase == PRETRAIN:
        pretrain_env = make_sim_env(config, world_dir(config, config.pretrain_checkpoint)) \
            if config.pretrain_checkpoint else env
        agent.set_env(pretrain_env)
        learn_in_sim(agent, pretrain_env, config, config.pretrain_steps, "pretrain")
        if pretrain_env is not env:
            pretrain_env.close()
            agent.set_env(env)
        (out / PRETRAIN).mkdir(exist_ok=True)
        save_agent(agent, out / PRETRAIN, out)
        state.phase = START_SCORE if config.score_data else PHASES[0]
        save_state(state, out)
    if state.phase == START_SCORE:
        score(agent, config, state, out / START_SCORE, writer, time.perf_counter())
        state.phase = PHASES[0]
        save_state(state, out)
        save_rounds(state, out)
    while state.round < config.rounds:
        round_dir = out / f"round_{state.round:02d}"
        round_dir.mkdir(exist_ok=True)
        started = time.perf_counter()
        if state.phase == "collect":
            collect(agent, config, state, round_dir)
            state.phase = "refit"
            save_state(state, out)
        if state.phase == "refit":
            state.world = refit(config, state, round_dir, out)
            state.phase = "agent"
            save_state(state, out)
        if state.phase == "agent":
            env.close()
            env = make_sim_env(config, state.world)
            agent.set_env(env)
            if config.real_updates and config.algo == "dqn":  # PPO learned from them as it collected them
                # The round's collect, and the scoring before it (`score_data`), which no agent phase has seen yet.
                latest_score = score_dirs(out, state.round)[-1:] if config.score_data else []
                learned = sum(learn_from_real(agent, d / AGENT_TRANSITIONS)
                              for d in [round_dir / "real", *latest_score])
                log.info("round %d: the agent learned from %d real transitions", state.round, learned)
            learn_in_sim(agent, env, config, config.sim_steps, f"round {state.round}: agent (learned sim)")
            save_agent(agent, round_dir, out)
            state.phase = "score"
            save_state(state, out)
        if state.phase == "score":
            score(agent, config, state, round_dir, writer, started)
            state.round, state.phase = state.round + 1, PHASES[0]
            save_state(state, out)
            save_rounds(state, out)
    final_dir = out / f"final_after_{state.round:02d}_rounds_{config.final_dynamics_steps}_steps"
    if config.final_dynamics_steps and state.final_world != str(final_dir / "world_mle"):
        state.final_world = final_refit_rt1(config, state, final_dir, out)
        save_state(state, out)
    env.close()
    writer.close()
    return state.history[-1] if state.history else {}


def score(agent: BaseAlgorithm, config: CoTrainConfig, state: State, round_dir: Path, writer: SummaryWriter,
          started: float) -> None:
    """(d) The agent's real success (its episodes recorded in round_dir/score with `score_data`) and its learned
    success from the same starts (a recorded tabletop scoring also replayed open loop: `replayed_calls`), appended to
    the state's history as the round's record."""
    replayed = {}
    if config.score_data and config.env == RT1_ENV:
        episodes = score_rt1(agent, config, state, round_dir / SCORE_DATA)
        real_success, real_steps = float(np.mean([e.succeeded for e in episodes])), sum(len(e) for e in episodes)
        replayed = replayed_calls(state.world, episodes, config)
    elif config.score_data:
        real_success, real_steps = score_text(agent, config, state.world, round_dir / SCORE_DATA)
    else:
        real_success, real_steps = score_in_real(agent, config, state.world)
    state.real_steps_total += real_steps
    record = {"round": -1 if state.phase == START_SCORE else state.round, "real_steps_total": state.real_steps_total,
              "real_success": real_success,
              "learned_success": learned_success(agent, state.world, config, config.eval_episodes,
                                                 scoring_first(config, state)),
              "agent_steps": int(agent.num_timesteps), "world": state.world,
              "seconds": round(time.perf_counter() - started, 1), **replayed}
    for key in ("real_success", "learned_success", *REPLAYED_CALLS):
        if key in record and np.isfinite(record[key]):
            writer.add_scalar(f"cotrain/{key}", record[key], state.real_steps_total)
    writer.flush()
    log.info("round %d: %s", record["round"], record)
    state.history.append(record)


def save_rounds(state: State, out: Path) -> None:
    """rounds.jsonl, rewritten whole from the saved state, so that a kill between the two writes leaves no round out
    or twice."""
    atomic_write_text(out / "rounds.jsonl", "".join(json.dumps(r) + "\n" for r in state.history))


def score_dirs(out: Path, round: int) -> list[Path]:
    """The recorded scorings (`score_data`) that precede round `round`'s refit: before round 0, and rounds before."""
    dirs = [out / START_SCORE / SCORE_DATA] + [out / f"round_{r:02d}" / SCORE_DATA for r in range(round)]
    return [d for d in dirs if d.is_dir()]


def learn_in_sim(agent: BaseAlgorithm, env, config: CoTrainConfig, steps: int, desc: str) -> None:
    # PPO learns in whole rollouts
    total = -(-steps // (config.n_steps * env.num_envs)) * config.n_steps * env.num_envs if config.algo == "ppo" \
        else steps
    with tqdm(total=total, desc=desc, unit="step", leave=False) as bar:
        agent.learn(steps, reset_num_timesteps=False, callback=lambda *_: bar.update(env.num_envs) or True)


def main() -> None:
    import tyro

    configure_logging()
    print(json.dumps(run_cotrain(tyro.cli(CoTrainConfig, description=__doc__))))


if __name__ == "__main__":
    main()

"""Co-training: an agent trained inside a learned simulator that the agent's own real experience keeps refitting.

    python -m agents.cotrain --checkpoint rt1-rlvr --task open_drawer --rounds 4 --out runs/cotrain/rt1-ppo

An agent trained in a frozen learned simulator learns to trigger the simulator's success signal from states the
world model never saw (`rlvr-gym probe`). Each round here closes that loop, as DIAMOND, MBPO and iVideoGPT's MBRL
setup do, with RLVR in it:
  (a) collect: the current agent acts in the real tabletop for `real_steps` steps (with exploration noise); the
      episodes are written in the world model's own format (`rlvr_gym.data.episodes`);
  (b) refit: the world model's transformer is fine-tuned by MLE on every agent episode so far (mixed with `replay`,
      its original training data, when given), then by GRPO with the video reward on prompts from this round's
      episodes, weighted toward the steps where the simulator was most wrong about the real next frame or its
      success (`grpo_steps` 0 is the MLE-only ablation); the simulator then resets from the real start states the
      agent has seen;
  (c) agent: PPO goes on learning inside the refitted simulator for `sim_steps` steps;
  (d) score: the agent in the real env from held-out start states, and in the learned env.
Every real step, for data or scoring, counts towards `real_steps_total`. Each phase writes its outputs before
`state.json` records it finished, so a killed run resumes at the phase it was in with nothing lost. Scalars go to
TensorBoard and `rounds.jsonl`; each phase has a progress bar.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gymnasium.vector import AutoresetMode  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.base_class import BaseAlgorithm  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402
from tqdm import tqdm  # noqa: E402

from agents.robot import DEFAULT_FRAME_SIZE, evaluate_in_real, make_sim_env  # noqa: E402
from envs.robot import TASKS, RealRT1Env  # noqa: E402
from rlvr_gym.data.episodes import SEEDS_PER_RUN, Episode, collect_episode, load_episodes, write_shards  # noqa: E402
from rlvr_gym.data.robot import episode_codes, mle_examples, save_initial_states  # noqa: E402
from rlvr_gym.evaluation.policies import Job, learned_rollouts, policy_frames, sb3_actor  # noqa: E402
from rlvr_gym.files import atomic_write_text  # noqa: E402
from rlvr_gym.logs import configure_logging  # noqa: E402
from rlvr_gym.models.lm import load_model  # noqa: E402
from rlvr_gym.models.robot_world_model import RobotWorldModel  # noqa: E402
from rlvr_gym.sim.robot import DEFAULT_HORIZON, RT1WorldVectorEnv  # noqa: E402
from rlvr_gym.train.grpo import GRPOConfig  # noqa: E402
from rlvr_gym.train.robot import save_with_initial_states  # noqa: E402
from rlvr_gym.train.rt1_rlvr import RT1RLVRConfig, run_rt1_rlvr  # noqa: E402
from rlvr_gym.train.sft import SFTConfig, train_sft  # noqa: E402

log = logging.getLogger(__name__)

PHASES = ("collect", "refit", "agent", "score")
COLLECT_SEED_RUN = 8
"""Real start states the agent collects data from: env seeds 8_000_000 + i (the scoring run is agents.robot's 9)."""


@dataclass
class CoTrainConfig:
    out: str = "runs/cotrain/rt1-ppo"
    """Run directory: state.json, rounds.jsonl, TensorBoard events, and round_NN/ with each phase's outputs."""
    checkpoint: str = "rt1-rlvr"
    """The world model the loop starts from: a shipped name or a directory."""
    task: str = "open_drawer"
    """The tabletop task the agent learns."""
    rounds: int = 4
    """Rounds of collect, refit, agent, score."""
    real_steps: int = 400
    """Real env steps the agent takes per round for data (whole episodes: the last one may end past it)."""
    exploration: float = 0.3
    """Std of Gaussian noise on the agent's actions while it collects data (clipped to [-1, 1])."""
    eval_episodes: int = 8
    """Real episodes per round that score the agent, from held-out start states (they count as real steps)."""
    sim_steps: int = 4096
    """Agent steps inside the learned simulator per round (summed over sub-envs)."""
    num_envs: int = 16
    """Sub-envs of the batched learned simulator."""
    horizon: int = DEFAULT_HORIZON
    """Steps per episode, real and learned."""
    frame_size: int = DEFAULT_FRAME_SIZE
    """Side of the block-averaged frames the agent sees."""
    replay: str = ""
    """An episode directory (the world model's training data) mixed into every MLE refit; empty: agent data only."""
    mle_steps: int = 60
    """MLE steps of the transformer per refit."""
    mle_lr: float = 2e-4
    """MLE learning rate of the refit."""
    grpo_steps: int = 10
    """GRPO steps per refit after the MLE ones (0: MLE-only refits, the ablation)."""
    surprise_prompts: float = 0.5
    """Fraction of the GRPO prompts from the steps where the refitted simulator was most wrong about the real next
    frame or its success (`RT1RLVRConfig.surprise_prompts`)."""
    learning_rate: float = 3e-4
    """PPO learning rate."""
    n_steps: int = 32
    """PPO rollout length per sub-env."""
    seed: int = 0
    """Seeds the agent, its exploration noise and the real start states' order."""


@dataclass
class State:
    round: int = 0
    phase: str = PHASES[0]
    """The next phase to run in `round`."""
    real_steps_total: int = 0
    world: str = ""
    """The world model the agent trains in now."""
    collect_seed: int = 0
    """The next real start state's index in the collection run."""
    history: list = field(default_factory=list)


def load_state(config: CoTrainConfig, out: Path) -> State:
    path = out / "state.json"
    if not path.is_file():
        return State(world=str(RobotWorldModel.resolve(config.checkpoint)))
    saved = json.loads(path.read_text())
    recorded = json.loads((out / "config.json").read_text())
    changed = {k for k, v in asdict(config).items() if recorded.get(k) != v and k != "rounds"}
    if changed:
        raise ValueError(f"{out} holds a run with other settings ({sorted(changed)}); resume it with the same "
                         "flags (only --rounds may grow) or pick another --out")
    return State(**saved)


def save_state(state: State, out: Path) -> None:
    atomic_write_text(out / "state.json", json.dumps(asdict(state), indent=1))


# ---------------------------------------------------------------------------------------------------- phases


def collect(agent: BaseAlgorithm, config: CoTrainConfig, state: State, out: Path) -> list[Episode]:
    """(a) The agent, with exploration noise, in the real tabletop until `real_steps` steps; written to out."""
    rng = np.random.default_rng([config.seed, state.round])
    env = RealRT1Env(task=config.task, horizon=config.horizon)
    episodes, steps = [], 0
    with tqdm(total=config.real_steps, desc=f"round {state.round}: collect (real)", unit="step", leave=False) as bar:
        while steps < config.real_steps:
            seed = COLLECT_SEED_RUN * SEEDS_PER_RUN + state.collect_seed
            state.collect_seed += 1
            episodes.append(agent_episode(env, agent, seed, config, rng))
            steps += len(episodes[-1])
            bar.update(len(episodes[-1]))
    env.close()
    write_shards(episodes, out / "real", split="train", config={"round": state.round, "policy": "agent"}, overwrite=True)
    state.real_steps_total += steps
    return episodes


def agent_episode(env: RealRT1Env, agent: BaseAlgorithm, seed: int, config: CoTrainConfig,
                  rng: np.random.Generator) -> Episode:
    """One real episode of the agent's deterministic action plus exploration noise."""

    def act(frame: np.ndarray, _info: dict) -> np.ndarray:
        action, _ = agent.predict(policy_frames(frame[None], config.frame_size), deterministic=True)
        return np.asarray(action, np.float32).reshape(-1) + rng.normal(0, config.exploration, 7)

    return collect_episode(env, config.task, "agent", seed, act)


def refit(config: CoTrainConfig, state: State, out: Path, run_dir: Path) -> str:
    """(b) MLE on every agent episode so far (plus replay), then GRPO on this round's; returns the new world dir."""
    world = RobotWorldModel.load(state.world)
    agent_data = [load_episodes(run_dir / f"round_{r:02d}" / "real") for r in range(state.round + 1)]
    seen = [e for episodes in agent_data for e in episodes]
    mixed = seen + (load_episodes(config.replay) if config.replay else [])
    examples = [ex for e in tqdm(mixed, desc=f"round {state.round}: refit (tokenise)", unit="episode", leave=False)
                for ex in mle_examples(episode_codes(world.frame_tokenizer, e), e, world.settings.context_steps + 2)]
    sft = SFTConfig(run_dir=str(out / "mle"), model=str(Path(state.world) / "lm"), steps=config.mle_steps,
                    lr=config.mle_lr, warmup_steps=min(10, config.mle_steps // 4), batch_size=8, micro_batch=8,
                    save_every=max(config.mle_steps, 1), seed=config.seed, resume=(out / "mle" / "checkpoints").exists())
    world.lm = load_model(train_sft(sft, examples))[0].eval()
    mle_dir = save_with_initial_states(world, state.world, out / "world_mle")
    save_initial_states(mle_dir, seen, n=len(seen))  # the simulator resets from the starts the agent has seen
    if config.grpo_steps == 0:
        return str(mle_dir)
    grpo = GRPOConfig(steps=config.grpo_steps, lr=3e-5, prompts_per_step=4, group_size=8, beta=0.0, temperature=0.5,
                      save_every=max(config.grpo_steps, 1), seed=config.seed,
                      resume=(out / "rlvr" / "checkpoints").exists())
    recipe = RT1RLVRConfig(data=str(out / "real"), model=str(mle_dir), out=str(out / "rlvr"), horizon=1,
                           rollout_depth=1, surprise_prompts=config.surprise_prompts, seed=config.seed, grpo=grpo)
    rlvr_dir = run_rt1_rlvr(recipe)
    save_initial_states(rlvr_dir, seen, n=len(seen))
    return str(rlvr_dir)


def learned_success(agent: BaseAlgorithm, world: str, config: CoTrainConfig, episodes: int) -> float:
    """The agent's success rate inside the learned simulator, over `episodes` of its initial states in turn."""
    venv = RT1WorldVectorEnv(num_envs=min(episodes, config.num_envs), checkpoint=world, horizon=config.horizon,
                             task=config.task, autoreset_mode=AutoresetMode.DISABLED)
    actor = sb3_actor(agent)
    jobs = [Job(i % len(venv.sim.states), actor=actor) for i in range(episodes)]
    results = learned_rollouts(venv, jobs, config.seed)
    venv.close()
    return float(np.mean([success for success, _, _ in results]))


# ---------------------------------------------------------------------------------------------------- the loop


def make_agent(config: CoTrainConfig, world: str) -> tuple[BaseAlgorithm, object]:
    env = make_sim_env(world, config.num_envs, config.task, config.horizon, config.frame_size)
    agent = PPO("MlpPolicy", env, n_steps=config.n_steps, n_epochs=4, batch_size=min(128, config.n_steps * config.num_envs),
                learning_rate=config.learning_rate,
                seed=config.seed, device="cpu", policy_kwargs={"net_arch": [64, 64]}, verbose=0)
    return agent, env


def check_config(config: CoTrainConfig) -> None:
    if config.task not in TASKS:
        raise ValueError(f"unknown task {config.task!r}: use one of {TASKS}")
    for name in ("rounds", "real_steps", "eval_episodes", "sim_steps", "num_envs", "horizon", "n_steps"):
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(config, name)}")
    if config.mle_steps < 1 or config.grpo_steps < 0 or config.exploration < 0:
        raise ValueError("--mle-steps must be >= 1, --grpo-steps and --exploration >= 0")


def run_cotrain(config: CoTrainConfig) -> dict:
    """Run (or resume) the loop; returns the last round's record."""
    check_config(config)
    torch.set_num_threads(1)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    state = load_state(config, out)
    atomic_write_text(out / "config.json", json.dumps(asdict(config), indent=1))
    writer = SummaryWriter(str(out / "tensorboard"))
    agent_path = out / "agent.zip"
    agent, env = make_agent(config, state.world)
    if agent_path.is_file():
        agent = PPO.load(agent_path, env=env, device="cpu")
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
            env = make_sim_env(state.world, config.num_envs, config.task, config.horizon, config.frame_size)
            agent.set_env(env)
            rollout = config.n_steps * config.num_envs  # PPO learns in whole rollouts
            with tqdm(total=-(-config.sim_steps // rollout) * rollout, desc=f"round {state.round}: agent (learned sim)",
                      unit="step", leave=False) as bar:
                agent.learn(config.sim_steps, reset_num_timesteps=False,
                            callback=lambda *_: bar.update(env.num_envs) or True)
            agent.save(round_dir / "agent.zip")
            shutil.copy2(round_dir / "agent.zip", agent_path)
            state.phase = "score"
            save_state(state, out)
        if state.phase == "score":
            real = evaluate_in_real(agent, config.eval_episodes, config.task, config.horizon)
            state.real_steps_total += int(round(real["mean_length"] * real["episodes"]))
            record = {"round": state.round, "real_steps_total": state.real_steps_total,
                      "real_success": real["success_rate"],
                      "learned_success": learned_success(agent, state.world, config, config.eval_episodes),
                      "agent_steps": int(agent.num_timesteps), "world": state.world,
                      "seconds": round(time.perf_counter() - started, 1)}
            for key in ("real_success", "learned_success"):
                writer.add_scalar(f"cotrain/{key}", record[key], state.real_steps_total)
            writer.flush()
            log.info("round %d: %s", state.round, record)
            state.history.append(record)
            state.round, state.phase = state.round + 1, PHASES[0]
            save_state(state, out)
            # Rewritten whole from the state, so a kill between the two writes leaves no round out or twice.
            atomic_write_text(out / "rounds.jsonl", "".join(json.dumps(r) + "\n" for r in state.history))
    env.close()
    writer.close()
    return state.history[-1] if state.history else {}


def main() -> None:
    import tyro

    configure_logging()
    print(json.dumps(run_cotrain(tyro.cli(CoTrainConfig, description=__doc__))))


if __name__ == "__main__":
    main()

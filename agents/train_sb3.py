"""Train an SB3 agent inside a learned simulator and score it in the real environment as it learns.

    python -m agents.train_sb3 --algo ppo --steps 20000 --checkpoint rt1-rlvr --eval-every 2000 --task open_drawer
    python -m agents.train_sb3 --env RLVRWorld-TextGame-v0 --algo dqn --checkpoint textgame-rlvr --out runs/agents/text-dqn

RT-1: the batched learned simulator (`rlvr_gym.sim.sb3`) on frames block-averaged to --frame-size, MlpPolicy (see
agents/robot.py for why); scored every --eval-every steps in the MuJoCo tabletop from held-out start states.
TextGame: `agents.textgame.make_sim_env` / `evaluate_in_real` (same start states, real TextWorld); DQN with
`SlotDQNPolicy`, PPO with `SlotActorCriticPolicy` (one network scores every action slot).
Writes to --out: TensorBoard events and progress.csv (SB3's scalars plus real/*), eval.jsonl (one line per real
evaluation), checkpoints/ (every --save-every steps), model.zip (final) and args.json.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from stable_baselines3 import DQN, PPO, SAC  # noqa: E402
from stable_baselines3.common.base_class import BaseAlgorithm  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback  # noqa: E402
from stable_baselines3.common.logger import configure  # noqa: E402

from rlvr_gym.logs import configure_logging  # noqa: E402

log = logging.getLogger(__name__)

RT1_ENV = "RLVRWorld-RT1-v0"
TEXT_ENV = "RLVRWorld-TextGame-v0"
ALGOS = {RT1_ENV: ("ppo", "sac"), TEXT_ENV: ("dqn", "ppo")}


@dataclass
class Args:
    env: Literal["RLVRWorld-RT1-v0", "RLVRWorld-TextGame-v0"] = RT1_ENV
    """Learned simulator to train in."""
    algo: Literal["ppo", "sac", "dqn"] = "ppo"
    """SB3 algorithm: ppo or sac for RT-1, dqn or ppo for the text game."""
    steps: int = 20_000
    """Environment steps to train for (summed over sub-envs)."""
    checkpoint: str = ""
    """World-model checkpoint of the simulator (a shipped name or a directory); default rt1-rlvr / textgame-rlvr."""
    eval_every: int = 2_000
    """Score the agent in the real env every this many steps (and at the end)."""
    eval_episodes: int = 16
    """Real episodes per evaluation."""
    eval_learned: bool = False
    """At each evaluation also score the agent in the simulator it trains in, from the same starts (RT-1: the held-out
    starts' real first frames and true states; text: the same games): `learned/success_rate` beside
    `real/success_rate`, how far the simulator is from the real env on this agent's own play."""
    save_every: int = 0
    """Save an SB3 checkpoint every this many steps (0: as often as --eval-every)."""
    out: str = ""
    """Run directory; default runs/agents/rt1-ALGO or runs/agents/textgame-ALGO."""
    seed: int = 0
    """Seeds the agent, the simulator's resets, and (text game) the real start states' order."""
    num_envs: int = 16
    """RT-1: sub-envs of the batched simulator, stepped in one world-model forward pass."""
    task: str | None = None
    """RT-1: train and evaluate on one task (the frames alone do not say which task an episode is); default all."""
    horizon: int = 50
    """RT-1: steps per episode in the simulator and the real env."""
    frame_size: int = 32
    """RT-1: frames are block-averaged to this size (divides 64) before the policy sees them."""
    temperature: float = 0.0
    """RT-1: sampling temperature of the simulator's frames (0: greedy)."""
    precision: str = "float32"
    """RT-1: the simulator's weight products, float32 or bfloat16 (about 1.7x the batched env's steps on a CPU with
    AVX-512 BF16; `python -m bench.rt1_sim` measures speed and fidelity of both)."""
    shaping: float = 0.0
    """RT-1: weight of the shaped reward in the simulator (`agents.robot.VecShaped`: the change in the log-odds of
    success it reports, added to the sparse reward); 0: the sparse reward alone."""
    observation: str = "frame"
    """RT-1: what the agent sees, "frame" or "state" (the predicted state, for a simulator with state dynamics; in
    the real env the true state: `agents.robot.StateObservation`)."""
    reach: float = 0.0
    """RT-1: weight per metre of the reach term in the shaped reward (`agents.robot.VecShaped`: the decrease in the
    palm's distance to the drawer handle or behind the object to push); needs a simulator with state dynamics."""
    eval_first: int = 0
    """RT-1: the real scorings' held-out starts begin at this index of their run (a simulator refit on real episodes
    from the first ones, as the co-training loop's are, is scored past them)."""
    learning_rate: float = 3e-4
    """Optimizer learning rate."""
    batch_size: int = 128
    """Minibatch size of each gradient step."""
    n_steps: int = 32
    """PPO: steps per sub-env between updates (rollout = n_steps * num_envs)."""
    buffer_size: int = 20_000
    """SAC / DQN: replay buffer size, in transitions."""


class RealEvalCallback(BaseCallback):
    """Every `every` steps, and once at the end, score the model with `evaluate` and log `real/*` (`learned/*` for its
    `learned_*` keys; TensorBoard, CSV, eval.jsonl). Keeps the time spent evaluating, so steps/s can leave it out."""

    def __init__(self, evaluate: Callable[[BaseAlgorithm], dict], every: int, path: Path):
        super().__init__()
        self.evaluate, self.every, self.path = evaluate, every, path
        self.next_eval, self.last_eval, self.seconds = every, -1, 0.0
        self.results: list[dict] = []

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next_eval:
            self._run()
            self.next_eval += self.every * max(1, (self.num_timesteps - self.next_eval) // self.every + 1)
        return True

    def _on_training_end(self) -> None:
        if self.last_eval != self.num_timesteps:
            self._run()

    def _run(self) -> None:
        start = time.perf_counter()
        result = {"step": self.num_timesteps, **self.evaluate(self.model)}
        self.seconds += time.perf_counter() - start
        self.last_eval = self.num_timesteps
        self.results.append(result)
        for key, value in result.items():
            if key != "step":
                learned = key.startswith("learned_")
                self.logger.record(f"learned/{key.removeprefix('learned_')}" if learned else f"real/{key}", value)
        self.logger.dump(self.num_timesteps)
        with self.path.open("a") as f:
            f.write(json.dumps(result) + "\n")
        log.info("step %d, real env: %s", self.num_timesteps, result)


def make_model(args: Args, env) -> BaseAlgorithm:
    common = {"learning_rate": args.learning_rate, "batch_size": args.batch_size, "seed": args.seed, "device": "cpu",
              "policy_kwargs": {"net_arch": [64, 64]}, "verbose": 0}
    # The text game's agents score each action slot with one network shared by the slots (agents.textgame).
    from agents.textgame import SlotActorCriticPolicy, SlotDQNPolicy

    if args.algo == "ppo":
        policy = SlotActorCriticPolicy if args.env == TEXT_ENV else "MlpPolicy"
        return PPO(policy, env, n_steps=args.n_steps, n_epochs=4, **common)
    if args.algo == "sac":
        return SAC("MlpPolicy", env, buffer_size=args.buffer_size, learning_starts=min(256, args.steps // 2), **common)
    return DQN(SlotDQNPolicy, env, buffer_size=args.buffer_size, learning_starts=min(256, args.steps // 2), **common)


def build(args: Args) -> tuple[object, Callable[[BaseAlgorithm], dict]]:
    """The training env and the evaluation for `args.env`: real, and with `eval_learned` learned success too."""
    if args.env == RT1_ENV:
        from agents import robot

        checkpoint = args.checkpoint or robot.DEFAULT_CHECKPOINT
        robot.check_held_out(checkpoint, robot.real_start_states(args.eval_episodes, args.task, first=args.eval_first))
        env = robot.make_sim_env(checkpoint, args.num_envs, args.task, args.horizon, args.frame_size, args.temperature,
                                 args.shaping, args.precision, reach=args.reach, observation=args.observation)
        real = lambda model: robot.evaluate_in_real(model, args.eval_episodes, args.task, args.horizon,  # noqa: E731
                                                    first=args.eval_first)
        learned = lambda model: robot.evaluate_in_learned(  # noqa: E731
            model, checkpoint, args.eval_episodes, args.task, args.horizon, first=args.eval_first,
            precision=args.precision, observation=args.observation, num_envs=args.num_envs, seed=args.seed)
        return env, both(real, learned) if args.eval_learned else real
    if args.shaping or args.reach or args.eval_first or args.precision != "float32" or args.observation != "frame":
        raise ValueError("--shaping, --reach, --eval-first, --precision and --observation are the tabletop's "
                         "(RLVRWorld-RT1-v0)")
    from agents import textgame

    checkpoint = args.checkpoint or textgame.DEFAULT_CHECKPOINT
    env = textgame.make_sim_env(checkpoint, args.seed)
    real = lambda model: textgame.evaluate_in_real(model, checkpoint, args.eval_episodes, args.seed)  # noqa: E731
    learned = lambda model: textgame.evaluate_in_learned(model, checkpoint, args.eval_episodes, args.seed)  # noqa: E731
    return env, both(real, learned) if args.eval_learned else real


def both(real: Callable[[BaseAlgorithm], dict], learned: Callable[[BaseAlgorithm], float]
         ) -> Callable[[BaseAlgorithm], dict]:
    """The real scoring's result with the learned success rate beside it."""
    return lambda model: {**real(model), "learned_success_rate": learned(model)}


def train(args: Args) -> dict:
    """Train, evaluating in the real env as configured; returns the final real score, steps/s and the model path."""
    if args.algo not in ALGOS[args.env]:
        raise ValueError(f"--algo {args.algo} does not fit {args.env}: use one of {ALGOS[args.env]}")
    if args.steps < 1 or args.eval_every < 1 or args.eval_episodes < 1 or args.num_envs < 1:
        raise ValueError("steps, eval_every, eval_episodes and num_envs must be >= 1")
    if args.shaping < 0 or args.reach < 0 or args.eval_first < 0:
        raise ValueError(f"shaping, reach and eval_first must be >= 0, got {args.shaping}, {args.reach} and "
                         f"{args.eval_first}")
    torch.set_num_threads(1)
    out = Path(args.out or f"runs/agents/{'rt1' if args.env == RT1_ENV else 'textgame'}-{args.algo}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps(asdict(args), indent=2))
    (out / "eval.jsonl").unlink(missing_ok=True)
    env, evaluate = build(args)
    model = make_model(args, env)
    model.set_logger(configure(str(out), ["csv", "tensorboard"]))
    save_every = max((args.save_every or args.eval_every) // model.n_envs, 1)
    evaluation = RealEvalCallback(evaluate, args.eval_every, out / "eval.jsonl")
    start = time.perf_counter()
    model.learn(args.steps, callback=CallbackList([CheckpointCallback(save_every, str(out / "checkpoints"), args.algo),
                                                   evaluation]))
    seconds = time.perf_counter() - start - evaluation.seconds
    model.save(out / "model.zip")
    env.close()
    return {"env": args.env, "algo": args.algo, "steps": int(model.num_timesteps),
            "steps_per_s": round(model.num_timesteps / seconds, 2), "real": evaluation.results[-1],
            "model": str(out / "model.zip")}


def main() -> None:
    import tyro

    configure_logging()
    print(json.dumps(train(tyro.cli(Args, description=__doc__))))


if __name__ == "__main__":
    main()

"""RLVR post-training of the video world model: GRPO on -(L1 + LPIPS) of the decoded predicted frames.

    rlvr-gym train rt1-rlvr --data runs/rt1/train --model runs/rt1/mle/world_model --run-dir runs/rt1/rlvr
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlvr_gym.data import video_tokens as V
from rlvr_gym.data.episodes import Episode, load_episodes
from rlvr_gym.data.robot import (
    episode_codes,
    example_flags,
    frame_flags,
    rlvr_examples,
    whole_object_moves,
    whole_object_reveals,
)
from rlvr_gym.domains.robot import frame_reward_fn
from rlvr_gym.models.lm import load_model
from rlvr_gym.models.robot_world_model import RobotWorldModel, RolloutStart, predict_in_batches
from rlvr_gym.train import run as RUN
from rlvr_gym.train.grpo import GRPOConfig, train_grpo
from rlvr_gym.train.robot import draw_prompts, repeat_moved, save_with_initial_states

log = logging.getLogger("rlvr_gym")


@dataclass
class RT1RLVRConfig:
    data: str = "runs/rt1/train"
    """Episodes whose real next frames score the rollouts."""
    model: str = "runs/rt1/mle/world_model"
    """The MLE world model (a directory or shipped name). Its motion refiner, if it has one, refines the frames the
    reward scores and those the prompts are rolled out through (as in the learned env), and stays in OUT/world_model."""
    out: str = "runs/rt1/rlvr"
    """Run directory; the world model is written to OUT/world_model."""
    horizon: int = 1
    """Frames predicted per rollout (1: single-step; >1: real actions spliced between generated frames). A k-step
    rollout is one completion, so its prompt grows past `context_steps` by k-1 steps, where eval and the env slide
    the window instead, and its later frames follow the generated codes even for a model with `context_from_frames`.
    `--rollout-depth` prompts are the env's own: they come from `RobotWorldModel.rollout`."""
    object_weight: float = 0.5
    """Weight of the object term: the reward loses this times the mean over the objects showing in the real frame
    of min(centroid distance, 45 px) / 45, a lost object counting 1 (colours read from the frames, as the eval's
    object error). 0 (with no repetition penalty): RLVR-World's -(L1 + LPIPS) alone."""
    repetition_penalty: float = 0.15
    """Taken off the reward for each predicted frame that repeats the frame before it (the same codes) while the
    real frame changed: RLVR-World's repetition failure, read from the real codes."""
    rollout_depth: int = 4
    """Prompts sit 1..D frames deep into a rollout (drawn evenly): for depth d the model first predicts d-1 frames
    greedily from the real history under the real actions, sliding its window as the learned env does, and the
    prompt holds those predictions; the reward still scores the real next frame. 1: real history only (needed for
    --horizon > 1). The contexts are rolled out once, by the starting model, before training."""
    rollout_prompts: int = 2048
    """With --rollout-depth > 1: the number of (episode, t) prompts drawn (each needs its rollout)."""
    moved_prompts: float = 0.0
    """Fraction of the prompts whose real next frame moves a whole object (the eval's object error counts only
    those; about 9% of all). 0 keeps the data's own mix. With --rollout-depth > 1 the drawn prompts hold this
    fraction of them; with 1 (every transition a prompt) they are repeated until they make it."""
    revealed_prompts: float = 0.0
    """With --rollout-depth > 1: fraction of the prompts whose real next frame shows an object coming out from under
    the gripper (`R.revealed_objects`; a third of the moved ones), drawn before --moved-prompts' share. Every object
    the shipped models still lose is one of these. Measured: 0.25
    of them, with 0.25 moved, did not place moved objects better at step 5 than rt1-mle."""
    surprise_prompts: float = 0.0
    """With --rollout-depth 1: fraction of the prompts where the starting model was most wrong about the real next
    frame (the top quarter by L1 of its greedy prediction, or where its success flag contradicts the real one),
    repeated until they make it: RLVR weighted toward the steps the simulator and the real env disagree on (the
    co-training loop's refits). 0 keeps the data's own mix."""
    seed: int = 0
    """Draws the rollout prompts."""
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(steps=200, lr=5e-5, prompts_per_step=8, group_size=8, beta=0.0,
                                                                 temperature=0.5, save_every=10))
    """Trainer settings (run_dir, model and max_new_tokens are set by this command). At temperature 1 the samples
    almost never repeat a frame, so the repetition penalty would never fire; the defaults are the shipped rt1-rlvr's
    (one process: prompts_per_step counts per process, so under two give 4 each)."""


def rollout_examples(world: RobotWorldModel, episodes: list[Episode], depth: int, count: int, seed: int = 0,
                     batch: int = 64, codes_per_episode: list[np.ndarray] | None = None,
                     moved_fraction: float = 0.0, revealed_fraction: float = 0.0) -> list[dict]:
    """Single-step prompts `count` (episode, t) pairs drawn at random (`moved_fraction` of them where a whole object
    moves, `revealed_fraction` where an object comes out from under the gripper; see `draw_prompts`), each d frames
    deep into a greedy rollout of the model (d drawn evenly from 1..depth): the frames after t-d+1 in the prompt are
    the model's predictions, made by `world.rollout` with the window sliding as in the learned env (and entering the
    prompt as it does there). "last_codes" is the prompt's last frame (what a repeat copies)."""
    codes = codes_per_episode or [episode_codes(world.frame_tokenizer, e) for e in episodes]
    flags = [frame_flags(e) for e in episodes]
    real = rlvr_examples(world, episodes, 1, codes)
    rng = np.random.default_rng(seed)
    focus = moved_fraction > 0 or revealed_fraction > 0
    none = np.zeros(len(real), dtype=bool)
    moved = example_flags(episodes, real, whole_object_moves) if focus else none
    revealed = example_flags(episodes, real, whole_object_reveals) if revealed_fraction > 0 else none
    drawn = draw_prompts(moved, count, moved_fraction, rng, revealed, revealed_fraction)
    if focus:
        log.info("%d prompts, %d where a whole object moves, %d of them where one comes out from under the gripper",
                 len(drawn), moved[drawn].sum(), revealed[drawn].sum())
    picked = [real[i] for i in drawn]
    # Frames predicted before each prompt: depth - 1, clipped at the episode's first frame.
    predicted = [min(int(d) - 1, ex["t"]) for ex, d in zip(picked, rng.integers(1, depth + 1, size=len(picked)))]
    out = [{**ex, "depth": 1} for ex, n in zip(picked, predicted) if n == 0]
    for n in range(1, depth):
        group = [ex for ex, m in zip(picked, predicted) if m == n]
        for s in range(0, len(group), batch):
            part = group[s : s + batch]
            begins = [(ex["episode"], ex["t"] - n) for ex in part]
            prompts = [world.prompt(codes[e][: b + 1], flags[e][: b + 1], episodes[e].actions[: b + 1]) for e, b in begins]
            future = [episodes[e].actions[b + 1 : b + n] for e, b in begins]
            rollout = world.rollout(prompts, RolloutStart.of_episodes(episodes, begins), k=n, future_actions=future)
            for ex, (e, b), frames, probs in zip(part, begins, rollout.context, rollout.success):
                history = list(codes[e][: b + 1]) + list(frames)
                history_flags = list(flags[e][: b + 1]) + [bool(p > 0.5) for p in probs]
                prompt = world.prompt(history, history_flags, episodes[e].actions[: ex["t"] + 1])
                out.append({**ex, "prompt_ids": prompt, "last_codes": frames[-1].tolist(), "depth": n + 1})
    return out


def surprise_flags(world: RobotWorldModel, episodes: list[Episode], examples: list[dict],
                   d: RUN.Dist | None = None) -> np.ndarray:
    """Per single-step example: whether the model's greedy next frame is in the top quarter by L1 against the real
    one, or its success flag (above 0.5) contradicts the real env's. Under torchrun each rank predicts its share."""

    def scan(part: list[dict]) -> list[tuple[float, bool]]:
        if not part:  # fewer examples than ranks
            return []
        where = [(ex["episode"], ex["t"]) for ex in part]
        predicted = predict_in_batches(world, [ex["prompt_ids"] for ex in part],
                                       RolloutStart.of_episodes(episodes, where), 1, None)
        real = np.stack([episodes[e].frames[t + 1] for e, t in where]).astype(np.float32)
        error = np.abs(predicted.frames[:, 0].astype(np.float32) - real).mean(axis=(1, 2, 3))
        flag_wrong = (predicted.success[:, 0] > 0.5) != np.array([episodes[e].success[t] for e, t in where])
        return list(zip(error.tolist(), flag_wrong.tolist()))

    results = RUN.map_across_ranks(d or RUN.Dist(0, 1, world.device), examples, scan)
    error = np.array([e for e, _ in results])
    flag_wrong = np.array([wrong for _, wrong in results], dtype=bool)
    return (error >= np.quantile(error, 0.75)) | flag_wrong


def run_rt1_rlvr(config: RT1RLVRConfig) -> Path:
    if not 0 <= config.moved_prompts < 1:
        raise ValueError(f"--moved-prompts is a fraction in [0, 1), got {config.moved_prompts}")
    if not 0 <= config.revealed_prompts < 1 or config.moved_prompts + config.revealed_prompts >= 1:
        raise ValueError("--revealed-prompts is a fraction in [0, 1) whose sum with --moved-prompts stays below 1, got "
                         f"{config.revealed_prompts} and {config.moved_prompts}")
    if not 0 <= config.surprise_prompts < 1 or (config.surprise_prompts > 0 and config.rollout_depth > 1):
        raise ValueError(f"--surprise-prompts is a fraction in [0, 1) for --rollout-depth 1, got {config.surprise_prompts}")
    if config.revealed_prompts > 0 and config.rollout_depth == 1:
        raise ValueError("--revealed-prompts needs --rollout-depth > 1 (prompts drawn, not every transition)")
    d = RUN.setup_processes(config.grpo.threads)
    out = Path(config.out)
    world = RobotWorldModel.load(config.model, d.device)  # rolls out the prompts and decodes the rewarded frames
    lm_dir = RobotWorldModel.resolve(config.model) / "lm"
    grpo = RUN.set_by_command(config.grpo, "grpo", run_dir=str(out), model=str(lm_dir),
                              max_new_tokens=V.rollout_length(config.horizon, world.frame_tokens))
    if config.rollout_depth > 1 and (config.horizon != 1 or world.context_frame != "first"):
        raise ValueError("--rollout-depth > 1 needs --horizon 1 and a frame tokenizer conditioned on the first frame "
                         "(pass --rollout-depth 1 for multi-frame rollouts from real history)")
    episodes = load_episodes(config.data)
    codes = [episode_codes(world.frame_tokenizer, e) for e in episodes]
    if config.rollout_depth > 1:
        examples = rollout_examples(world, episodes, config.rollout_depth, config.rollout_prompts, config.seed,
                                    codes_per_episode=codes, moved_fraction=config.moved_prompts,
                                    revealed_fraction=config.revealed_prompts)
    else:
        examples = rlvr_examples(world, episodes, config.horizon, codes)
        if config.surprise_prompts > 0:
            surprising = surprise_flags(world, episodes, examples, d)
            examples = repeat_moved(examples, surprising, config.surprise_prompts)
            log.info("%d prompts after repeating the %d most surprising", len(examples), int(surprising.sum()))
        if config.moved_prompts > 0:
            moved = example_flags(episodes, examples, whole_object_moves)
            still = int((~moved).sum())
            examples = repeat_moved(examples, moved, config.moved_prompts)
            log.info("%d prompts, %d where a whole object moves", len(examples), len(examples) - still)
    reward = frame_reward_fn(world, episodes, config.horizon, config.object_weight, config.repetition_penalty, codes)
    final = train_grpo(grpo, reward, examples, decode=None, allowed_tokens=V.rollout_allowed_tokens(config.horizon, world.frame_tokens))
    if d.is_main:
        world.lm = load_model(final)[0]
        save_with_initial_states(world, config.model, out / "world_model")
    RUN.barrier(d)
    return out / "world_model"

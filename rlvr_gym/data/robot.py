"""RT-1 sequences: an episode's frame codes and success flags, the MLE windows and RLVR prompts built from them, and
the real start states a learned tabletop resets to.

A world-model checkpoint directory also holds those start states, real first frames of collected episodes, as DIAMOND
and RLVR-World do:
    initial_states.npz   frames uint8 (N, 64, 64, 3), tasks (N,) str, instructions (N,) str, seeds (N,) int, and
                         optionally the true start states: states float32 (N, len(STATE_NAMES)), targets float32
                         (N, 2) (the marker's centre), NaN where unknown; a state-dynamics model starts from them
Functions that tokenize take the frame tokenizer or world model as an argument; this module imports no network.
"""

from __future__ import annotations

import os
import zipfile
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from envs.robot.tasks import TASKS, task_and_layout
from rlvr_gym.data import video_tokens as V
from rlvr_gym.data.episodes import IMAGE_SHAPE, STATE_NAMES, Episode, info_state
from rlvr_gym.data.real_env_versions import check_real_env_versions, write_real_env_versions
from rlvr_gym.domains import robot as R
from rlvr_gym.files import CheckpointError

if TYPE_CHECKING:
    from rlvr_gym.models.frame_tokenizer import FrameTokenizer
    from rlvr_gym.models.robot_world_model import RobotWorldModel

INITIAL_STATES = "initial_states.npz"


@dataclass
class InitialStates:
    """Real first frames the simulator resets to, with the task each episode was collected for."""

    frames: np.ndarray
    """uint8 (N, 64, 64, 3)"""
    tasks: np.ndarray
    """(N,) unicode task names"""
    instructions: np.ndarray
    """(N,) unicode instructions"""
    seeds: np.ndarray
    """(N,) int64 real-env reset seeds (-1 for imported episodes)"""
    states: np.ndarray | None = None
    """float32 (N, len(STATE_NAMES)) the true state of each first frame (NaN rows: unknown); None: not recorded"""
    targets: np.ndarray | None = None
    """float32 (N, 2) the target marker's centre in the table plane (NaN rows: unknown); None: not recorded"""

    def __len__(self) -> int:
        return len(self.frames)

    def select(self, rows: np.ndarray) -> InitialStates:
        pick = lambda x: None if x is None else x[rows]  # noqa: E731
        return InitialStates(self.frames[rows], self.tasks[rows], self.instructions[rows], self.seeds[rows],
                             pick(self.states), pick(self.targets))

    def true_states(self) -> tuple[np.ndarray, np.ndarray]:
        """(states, targets) with NaN rows where unknown (all NaN when not recorded)."""
        n = len(self)
        states = self.states if self.states is not None else np.full((n, len(STATE_NAMES)), np.nan, np.float32)
        targets = self.targets if self.targets is not None else np.full((n, 2), np.nan, np.float32)
        return states, targets


def save_initial_states(world_dir: str | os.PathLike, episodes: Sequence[Episode], n: int = 64) -> Path:
    """Store the first frames of up to n episodes, taken in turn from each task, as WORLD_DIR/initial_states.npz."""
    if n < 1:
        raise ValueError(f"n must be a positive number of initial states, got {n}")
    if not episodes:
        raise ValueError("no episodes to take initial states from; pass the world model's training episodes")
    by_task: dict[str, deque[Episode]] = {}
    for episode in episodes:
        by_task.setdefault(episode.task, deque()).append(episode)
    chosen: list[Episode] = []
    while len(chosen) < n and any(by_task.values()):
        for queue in by_task.values():
            if queue and len(chosen) < n:
                chosen.append(queue.popleft())
    return write_initial_states(world_dir, episode_starts(chosen))


def episode_starts(episodes: Sequence[Episode]) -> InitialStates:
    """The first frames of the episodes, with their tasks, instructions, seeds and true states (the target marker
    from the reset seed, as the real env draws it)."""
    targets = [task_and_layout(e.task, e.seed)[1].target_xy if e.seed >= 0 and e.task in TASKS else np.full(2, np.nan)
               for e in episodes]
    return InitialStates(np.stack([e.frames[0] for e in episodes]).astype(np.uint8),
                         np.array([e.task for e in episodes], dtype=str),
                         np.array([e.instruction for e in episodes], dtype=str),
                         np.array([e.seed for e in episodes], dtype=np.int64),
                         np.stack([e.states[0] for e in episodes]).astype(np.float32),
                         np.stack(targets).astype(np.float32))


def with_episode_starts(states: InitialStates, episodes: Sequence[Episode]) -> InitialStates:
    """`states` followed by the first frames of the episodes whose real-env seeds it does not hold yet."""
    known, new = set(states.seeds.tolist()), []
    for episode in episodes:
        if episode.seed not in known:
            known.add(episode.seed)
            new.append(episode)
    return concatenate_starts(states, episode_starts(new)) if new else states


def concatenate_starts(first: InitialStates, second: InitialStates) -> InitialStates:
    """`first`'s initial states followed by `second`'s (true states NaN where either does not record them)."""
    return InitialStates(*(np.concatenate([getattr(first, name), getattr(second, name)])
                           for name in ("frames", "tasks", "instructions", "seeds")),
                         *(np.concatenate([a, b]) for a, b in zip(first.true_states(), second.true_states())))


def real_initial_states(starts: list[tuple[str, int]]) -> InitialStates:
    """The real env's first frames at `starts` ((task, env seed), e.g. `agents.robot.real_start_states`), with their
    true states, for the learned env to start from where the real one does (`_Simulator.add_starts`)."""
    from envs.robot.env import RealRT1Env  # MuJoCo and a renderer: only when a real env is reset

    envs: dict[str, RealRT1Env] = {}
    frames, instructions, states, targets = [], [], [], []
    try:
        for name, seed in starts:
            frame, info = envs.setdefault(name, RealRT1Env(task=name)).reset(seed=seed)
            frames.append(frame)
            instructions.append(info["instruction"])
            states.append(info_state(info))
            targets.append(info["target_pos"][:2])
    finally:
        for env in envs.values():
            env.close()
    return InitialStates(np.stack(frames), np.array([name for name, _ in starts], dtype=str),
                         np.array(instructions, dtype=str), np.array([seed for _, seed in starts], dtype=np.int64),
                         np.stack(states).astype(np.float32), np.stack(targets).astype(np.float32))


def write_initial_states(world_dir: str | os.PathLike, states: InitialStates) -> Path:
    """Store `states` as WORLD_DIR/initial_states.npz, with the real env's versions they came from."""
    path = Path(world_dir) / INITIAL_STATES
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    true = {}
    if states.states is not None:
        true = dict(zip(("states", "targets"), (x.astype(np.float32) for x in states.true_states())))
    np.savez_compressed(tmp, frames=states.frames.astype(np.uint8), tasks=states.tasks.astype(str),
                        instructions=states.instructions.astype(str), seeds=states.seeds.astype(np.int64), **true)
    os.replace(tmp, path)
    write_real_env_versions(world_dir, "rt1")
    return path


def load_initial_states(world_dir: str | os.PathLike) -> InitialStates:
    """Read WORLD_DIR/initial_states.npz (no pickles), checked for shapes and types."""
    path = Path(world_dir) / INITIAL_STATES
    if not path.is_file():
        raise CheckpointError(
            f"{world_dir} has no {INITIAL_STATES}, so the simulator has no real frames to start from; "
            "write them with rlvr_gym.sim.robot.save_initial_states(world_dir, episodes)"
        )
    try:
        with np.load(path, allow_pickle=False) as npz:
            optional = [npz[name] if name in npz.files else None for name in ("states", "targets")]
            states = InitialStates(npz["frames"], npz["tasks"], npz["instructions"], npz["seeds"], *optional)
    except (zipfile.BadZipFile, ValueError, OSError, KeyError, EOFError) as error:
        raise CheckpointError(f"{path} is corrupt ({type(error).__name__}: {error}); write it again with save_initial_states") from None
    n = len(states.frames)
    if states.frames.dtype != np.uint8 or states.frames.shape[1:] != IMAGE_SHAPE or n == 0:
        raise CheckpointError(f"{path}: frames must be uint8 (N >= 1, 64, 64, 3), got {states.frames.dtype} {states.frames.shape}")
    for name in ("tasks", "instructions", "seeds"):
        array = getattr(states, name)
        kind = "i" if name == "seeds" else "U"
        if array.shape != (n,) or array.dtype.kind != kind:
            raise CheckpointError(f"{path}: {name} must be a ({n},) {'int' if kind == 'i' else 'unicode'} array, got {array.dtype} {array.shape}")
    for name, width in (("states", len(STATE_NAMES)), ("targets", 2)):
        array = getattr(states, name)
        if array is not None and (array.shape != (n, width) or array.dtype.kind != "f"):
            raise CheckpointError(f"{path}: {name} must be a float ({n}, {width}) array, got {array.dtype} {array.shape}")
    check_real_env_versions(world_dir, "rt1")
    return states


def episode_codes(frame_tokenizer: FrameTokenizer, episode: Episode) -> np.ndarray:
    """Frame codes (T+1, tokens per frame) of an episode, each frame tokenized against the episode's first frame."""
    frames = torch.as_tensor(episode.frames)
    return torch.cat([frame_tokenizer.encode(f, frames[:1].expand(len(f), -1, -1, -1)) for f in frames.split(256)]).numpy()


def frame_flags(episode: Episode) -> np.ndarray:
    """Success flag of every frame: the first frame is before any step, frame t+1 follows action t."""
    return np.concatenate([[False], episode.success.astype(bool)])


def mle_examples(codes: np.ndarray, episode: Episode, window: int, changed_weight: float = 1.0) -> list[dict]:
    """Windows of `window` frames: the first step is the prompt, the rest the target (actions masked out). Frame
    codes that differ from the same position in the frame before weigh `changed_weight` in the loss (1: plain MLE)."""
    flags = frame_flags(episode)
    # The last frame has no action; any action token there is masked from the loss, so pad with zeros.
    actions = np.concatenate([episode.actions, np.zeros((1, V.ACTION_DIM), np.float32)])
    frame_tokens = codes.shape[1]
    step = V.step_length(frame_tokens)
    out = []
    for start in range(0, len(codes) - 1):
        end = min(start + window, len(codes))
        tokens = V.window_tokens(codes[start:end], flags[start:end], actions[start:end])
        prompt_len = 1 + step
        target = tokens[prompt_len:-V.ACTION_DIM]  # ends with the last frame's flag
        mask = np.array([(i % step) < frame_tokens + 1 for i in range(len(target))], dtype=float)
        for j in range(start + 1, end):
            frame = mask[(j - start - 1) * step :][:frame_tokens]  # a view: writes land in mask
            frame[codes[j] != codes[j - 1]] = changed_weight
        out.append({"prompt_ids": tokens[:prompt_len], "target_ids": target, "target_mask": mask.tolist()})
    return out


def whole_object_moves(episode: Episode) -> np.ndarray:
    """Per step t of the episode, whether a whole object moved between its real frames t and t + 1 (where the eval's
    object error has something to count)."""
    return R.moved_objects(episode.frames[1:], episode.frames[:-1], min_target_pixels=R.WHOLE_OBJECT_PIXELS).any(1)


def whole_object_reveals(episode: Episode) -> np.ndarray:
    """Per step t of the episode, whether an object came out from under the gripper between its real frames t and
    t + 1 (`R.revealed_objects`)."""
    return R.revealed_objects(episode.frames[1:], episode.frames[:-1]).any(1)


def windows_with_moves(episode: Episode, window: int) -> np.ndarray:
    """Per `mle_examples` window of the episode, whether a whole object moves in one of the frames it predicts."""
    moved = whole_object_moves(episode)
    return np.array([moved[start : start + window - 1].any() for start in range(len(episode.frames) - 1)], dtype=bool)


def rlvr_examples(world: RobotWorldModel, episodes: list[Episode], horizon: int,
                  codes_per_episode: list[np.ndarray] | None = None) -> list[dict]:
    """One prompt per (episode, t): the last context steps up to frame t and action t, the next `horizon` real frames."""
    n = world.settings.context_steps
    out = []
    for index, episode in enumerate(episodes):
        codes = episode_codes(world.frame_tokenizer, episode) if codes_per_episode is None else codes_per_episode[index]
        flags = frame_flags(episode)
        for t in range(len(episode.actions) - horizon + 1):
            lo = max(0, t - n + 1)
            prompt = V.window_tokens(codes[lo : t + 1], flags[lo : t + 1], episode.actions[lo : t + 1])
            future = episode.actions[t + 1 : t + horizon]
            out.append({
                "prompt_ids": prompt,
                "forced": V.rollout_forced_tokens(future, flags[t + 1 : t + 1 + horizon], world.frame_tokens),
                "episode": index,
                "t": t,
                "last_codes": codes[t].tolist(),
            })
    return out


def example_flags(episodes: list[Episode], examples: list[dict],
                  per_step: Callable[[Episode], np.ndarray]) -> np.ndarray:
    """Per example, the flag that `per_step` (`whole_object_moves`, `whole_object_reveals`) gives its episode's step t."""
    per_episode = [per_step(e) for e in episodes]
    return np.array([per_episode[ex["episode"]][ex["t"]] for ex in examples], dtype=bool)

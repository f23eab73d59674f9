"""The video world model's vocabulary: frame codes, RT-1 action bins and success flags, and the token sequences of
episode windows and rollouts built from them and parsed back."""

import numpy as np
import torch

ACTION_DIM = 7  # RT-1: world_vector 3, rotation_delta 3, gripper_closedness 1


NUM_BINS = 256


# Bin b stands for -1 + 2 b / 255, so -1, +1 (gripper open / closed) are exact and a round trip
# is off by at most half the spacing, 1 / 255.
BIN_SPACING = 2.0 / (NUM_BINS - 1)


def actions_to_bins(actions: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Map actions [..., 7] in [-1, 1] (values outside are clipped) to int64 bins 0..255, per dimension."""
    if not isinstance(actions, torch.Tensor):
        actions = np.asarray(actions, dtype=np.float64)
    if actions.shape[-1:] != (ACTION_DIM,):
        raise ValueError(f"actions must have shape [..., {ACTION_DIM}] (RT-1 end-effector action), got {tuple(actions.shape)}")
    if isinstance(actions, torch.Tensor):
        if not torch.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf; check the policy output before binning")
        return torch.round((actions.clamp(-1, 1) + 1) / BIN_SPACING).long()
    if not np.isfinite(actions).all():
        raise ValueError("actions contain NaN or inf; check the policy output before binning")
    return np.rint((np.clip(actions, -1, 1) + 1) / BIN_SPACING).astype(np.int64)


def bins_to_actions(bins: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Map int bins [..., 7] in 0..255 back to float32 actions in [-1, 1]."""
    if not isinstance(bins, torch.Tensor):
        bins = np.asarray(bins)
    if bins.shape[-1:] != (ACTION_DIM,):
        raise ValueError(f"bins must have shape [..., {ACTION_DIM}] (RT-1 end-effector action), got {tuple(bins.shape)}")
    if bins.min() < 0 or bins.max() >= NUM_BINS:
        raise ValueError(f"action bins must lie in 0..{NUM_BINS - 1}, got values in {int(bins.min())}..{int(bins.max())}")
    if isinstance(bins, torch.Tensor):
        return bins.double().mul(BIN_SPACING).sub(1).float()
    return (bins.astype(np.float64) * BIN_SPACING - 1).astype(np.float32)


# ---------------------------------------------------------------------------------------------------- token layout
# The video world model reads and writes one sequence per episode window:
#     BOS, [frame_t (64 codes), flag_t, action_t (7 bins)], [frame_t+1, flag_t+1, action_t+1], ...
# frame codes are the frame tokenizer's ids, flag_t says whether the task has succeeded in frame t (the world
# model's success head is this token's probability), action bins are shifted past the codebook. A frame is 64 codes
# with the shipped 8x8-token tokenizer; the functions below take `frame_tokens` for a finer one (16x16: 256).
CODEBOOK_SIZE = 1000


FRAME_TOKENS = 64


ACTION_OFFSET = CODEBOOK_SIZE


FLAG_RUNNING = ACTION_OFFSET + NUM_BINS


FLAG_SUCCESS = FLAG_RUNNING + 1


BOS = FLAG_SUCCESS + 1


PAD = BOS + 1


VOCAB_SIZE = PAD + 1


def step_length(frame_tokens: int = FRAME_TOKENS) -> int:
    """Tokens per step: a frame's codes, its flag, an action."""
    return frame_tokens + 1 + ACTION_DIM


STEP_TOKENS = step_length()


def step_tokens(frame_tokens, success: bool, action=None) -> list[int]:
    """One step of the sequence: a frame's codes, its success flag, then (if given) the action taken from it."""
    out = [int(t) for t in frame_tokens] + [FLAG_SUCCESS if success else FLAG_RUNNING]
    if action is not None:
        out += [ACTION_OFFSET + int(b) for b in actions_to_bins(np.asarray(action, dtype=np.float32))]
    return out


def window_tokens(frame_tokens, success, actions) -> list[int]:
    """BOS + steps for frames 0..n-1 with the n actions taken from them (the last frame's action included)."""
    if len(actions) != len(frame_tokens):
        raise ValueError(f"{len(frame_tokens)} frames need {len(frame_tokens)} actions (one taken from each), got {len(actions)}")
    out = [BOS]
    for frame, flag, action in zip(frame_tokens, success, actions):
        out += step_tokens(frame, bool(flag), action)
    return out


def rollout_forced_tokens(actions, success=None, frame_tokens: int = FRAME_TOKENS) -> dict[int, int]:
    """Forced completion positions for a k-step rollout: completion = frame, flag, [action, frame, flag]*(k-1).

    `actions` are the k-1 actions taken *between* predicted frames (the first action is in the prompt). Flags
    are forced to the real success values when given (they are not what the frame reward scores).
    """
    forced = {}
    k = len(actions) + 1
    for step in range(k):
        start = step * step_length(frame_tokens)
        if success is not None:
            forced[start + frame_tokens] = FLAG_SUCCESS if success[step] else FLAG_RUNNING
        if step < k - 1:
            for j, b in enumerate(actions_to_bins(np.asarray(actions[step], dtype=np.float32))):
                forced[start + frame_tokens + 1 + j] = ACTION_OFFSET + int(b)
    return forced


def rollout_length(k: int, frame_tokens: int = FRAME_TOKENS) -> int:
    return k * step_length(frame_tokens) - ACTION_DIM


def rollout_allowed_tokens(k: int, frame_tokens: int = FRAME_TOKENS) -> torch.Tensor:
    """(rollout_length(k), VOCAB_SIZE) bool: frame codes where a frame goes, flags after it, actions between."""
    length = rollout_length(k, frame_tokens)
    allowed = torch.zeros((length, VOCAB_SIZE), dtype=torch.bool)
    for pos in range(length):
        offset = pos % step_length(frame_tokens)
        if offset < frame_tokens:
            allowed[pos, :CODEBOOK_SIZE] = True
        elif offset == frame_tokens:
            allowed[pos, FLAG_RUNNING : FLAG_SUCCESS + 1] = True
        else:
            allowed[pos, ACTION_OFFSET : ACTION_OFFSET + NUM_BINS] = True
    return allowed


def parse_rollout(completion_ids, k: int, frame_tokens: int = FRAME_TOKENS) -> tuple[np.ndarray | None, np.ndarray | None, str | None]:
    """Completion ids of a k-step rollout -> (frame codes (k, frame_tokens), success flags (k,), error)."""
    ids = list(completion_ids)
    if len(ids) < rollout_length(k, frame_tokens):
        return None, None, f"rollout has {len(ids)} tokens, {rollout_length(k, frame_tokens)} needed for {k} frames"
    frames, flags = [], []
    for step in range(k):
        start = step * step_length(frame_tokens)
        frame = ids[start : start + frame_tokens]
        if any(not 0 <= t < CODEBOOK_SIZE for t in frame):
            return None, None, f"frame {step} holds a token that is not a frame code"
        flag = ids[start + frame_tokens]
        if flag not in (FLAG_RUNNING, FLAG_SUCCESS):
            return None, None, f"frame {step} is not followed by a success flag"
        frames.append(frame)
        flags.append(flag == FLAG_SUCCESS)
    return np.asarray(frames, dtype=np.int64), np.asarray(flags), None

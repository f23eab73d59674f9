"""Robot video domain: RT-1 action binning, frame metrics, object positions read from the frames, token layout.

Frames come either as the real env renders them, (N, H, W, 3) uint8, or as a decoder emits them,
(N, 3, H, W) float in [0, 1]; numpy arrays and torch tensors both work. Every metric is computed on
the [0, 1] scale and returns a per-sample (N,) float32 tensor on the frames' device.
"""

import math

import numpy as np
import torch

from rlvr_gym.domains.lpips import load_lpips

ACTION_DIM = 7  # RT-1: world_vector 3, rotation_delta 3, gripper_closedness 1
NUM_BINS = 256
# Bin b stands for -1 + 2 b / 255, so -1, +1 (gripper open / closed) are exact and a round trip
# is off by at most half the spacing, 1 / 255.
BIN_SPACING = 2.0 / (NUM_BINS - 1)

Frames = np.ndarray | torch.Tensor

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1, SSIM_K2 = 0.01, 0.03


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


def _as_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    # torch.tensor copies, so read-only numpy arrays (e.g. from np.load) convert without a warning.
    return x if isinstance(x, torch.Tensor) else torch.tensor(np.asarray(x))


def frames_to_float(frames: Frames) -> torch.Tensor:
    """(N, H, W, 3) uint8 or (N, 3, H, W) float in [0, 1] -> (N, 3, H, W) float32 tensor in [0, 1]."""
    frames = _as_tensor(frames)
    if frames.dtype == torch.uint8:
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"uint8 frames must be (N, H, W, 3), got {tuple(frames.shape)}; add a batch axis with frames[None]")
        return frames.permute(0, 3, 1, 2).float() / 255.0
    if not frames.is_floating_point():
        raise ValueError(f"frames must be uint8 (N, H, W, 3) or float (N, 3, H, W), got dtype {frames.dtype}")
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"float frames must be (N, 3, H, W), got {tuple(frames.shape)}; add a batch axis with frames[None]")
    if frames.numel() and (frames.min() < 0 or frames.max() > 1):
        raise ValueError(
            f"float frames must lie in [0, 1], got values in [{frames.min().item():.3g}, {frames.max().item():.3g}]; "
            "clamp decoder output with .clamp(0, 1)"
        )
    return frames.float()


def _frame_pair(pred: Frames, target: Frames) -> tuple[torch.Tensor, torch.Tensor]:
    pred, target = frames_to_float(pred), frames_to_float(target)
    if pred.shape != target.shape:
        raise ValueError(f"predicted and target frames differ in shape: {tuple(pred.shape)} vs {tuple(target.shape)} (as N, 3, H, W)")
    return pred, target.to(pred.device)


def mse(pred: Frames, target: Frames) -> torch.Tensor:
    """Per-frame mean squared error on the [0, 1] scale."""
    pred, target = _frame_pair(pred, target)
    return (pred - target).pow(2).mean(dim=(1, 2, 3))


def psnr(pred: Frames, target: Frames) -> torch.Tensor:
    """Per-frame PSNR in dB with data range 1; identical frames give inf."""
    return -10 * torch.log10(mse(pred, target))


def _gaussian_band(size: int, device: torch.device) -> torch.Tensor:
    """(size, size - 10) matrix whose column j holds the 1-D Gaussian window on rows j..j+10: `x @ band` blurs the last axis, valid part only."""
    coords = torch.arange(SSIM_WINDOW, dtype=torch.float64, device=device) - SSIM_WINDOW // 2
    g = torch.exp(-(coords**2) / (2 * SSIM_SIGMA**2))
    g = g / g.sum()
    offset = torch.arange(size, device=device)[:, None] - torch.arange(size - SSIM_WINDOW + 1, device=device)[None, :]
    inside = (offset >= 0) & (offset < SSIM_WINDOW)
    return torch.where(inside, g[offset.clamp(0, SSIM_WINDOW - 1)], torch.zeros((), dtype=torch.float64, device=device))


def ssim(pred: Frames, target: Frames) -> torch.Tensor:
    """Per-frame SSIM (Wang et al. 2004): 11x11 Gaussian window, sigma 1.5, data range 1, valid windows only, mean over channels.

    Matches pytorch-msssim's `ssim(..., data_range=1, size_average=False)` and skimage's
    `structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1)`.
    """
    pred, target = _frame_pair(pred, target)
    if min(pred.shape[2:]) < SSIM_WINDOW:
        raise ValueError(f"SSIM needs frames of at least {SSIM_WINDOW}x{SSIM_WINDOW}, got {tuple(pred.shape[2:])}")
    # float64 because var = E[x^2] - mu^2 cancels badly in float32 on flat regions, where C2 is tiny.
    pred, target = pred.double(), target.double()
    band_h, band_w = _gaussian_band(pred.shape[2], pred.device), _gaussian_band(pred.shape[3], pred.device)

    def blur(x: torch.Tensor) -> torch.Tensor:
        # Separable Gaussian as two banded matmuls: an order of magnitude faster on CPU than a grouped conv2d.
        return band_h.T @ x @ band_w

    mu_x, mu_y = blur(pred), blur(target)
    var_x = blur(pred * pred) - mu_x**2
    var_y = blur(target * target) - mu_y**2
    cov = blur(pred * target) - mu_x * mu_y
    c1, c2 = SSIM_K1**2, SSIM_K2**2
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return ssim_map.mean(dim=(1, 2, 3)).float()


def lpips_distance(pred: Frames, target: Frames) -> torch.Tensor:
    """Per-frame LPIPS (v0.1, AlexNet); frames must be at least 31x31."""
    pred, target = _frame_pair(pred, target)
    model = load_lpips(pred.device)
    with torch.no_grad():
        return model(pred * 2 - 1, target * 2 - 1)


# The reward of an unparsable rollout: below any frame's -(L1 + LPIPS) (a black frame against a real one scores
# about -1.6), since 0, the usual parse-failure score, would be the best reward here.
PARSE_FAILURE_REWARD = -2.0


def frame_reward_terms(pred: Frames, target: Frames) -> tuple[torch.Tensor, torch.Tensor]:
    """Per frame (L1, LPIPS) of the video reward, L1 being the mean absolute error on the [0, 1] scale."""
    pred, target = _frame_pair(pred, target)
    return (pred - target).abs().mean(dim=(1, 2, 3)), lpips_distance(pred, target)


def frame_reward(pred: Frames, target: Frames) -> torch.Tensor:
    """RLVR-World's video reward, -(L1 + LPIPS) per frame."""
    l1, lpips = frame_reward_terms(pred, target)
    return -(l1 + lpips)


def changed_pixels(target: torch.Tensor, prev: torch.Tensor, threshold: float = 0.05) -> torch.Tensor:
    """(N, H, W) bool: pixels of float frames (N, 3, H, W) that changed from `prev` to `target` in some channel by
    more than `threshold` ([0, 1] scale)."""
    return (target - prev).abs().amax(dim=1) > threshold


def changed_pixel_mse(pred: Frames, target: Frames, prev: Frames, threshold: float = 0.05) -> torch.Tensor:
    """Per-frame MSE restricted to pixels that changed from `prev` to `target` (any channel by more than `threshold`, [0, 1] scale).

    Copying the previous frame scores well on whole-frame metrics when little moves; this one
    only looks where the scene moved. Frames where nothing changed give NaN.
    """
    pred, target = _frame_pair(pred, target)
    prev = _frame_pair(prev, target)[0]
    changed = changed_pixels(target, prev, threshold)[:, None].float()
    squared = (pred - target).pow(2) * changed
    count = changed.sum(dim=(1, 2, 3)) * pred.shape[1]
    return squared.sum(dim=(1, 2, 3)) / count


def repetition_rate(pred_tokens: np.ndarray | torch.Tensor, prev_tokens: np.ndarray | torch.Tensor) -> float:
    """Fraction of predicted frames whose token sequence equals the previous frame's; tokens are (N, ...) per frame."""
    pred_tokens, prev_tokens = _as_tensor(pred_tokens), _as_tensor(prev_tokens)
    if pred_tokens.shape != prev_tokens.shape or pred_tokens.ndim < 2:
        raise ValueError(
            f"token batches must both be (N, tokens per frame, ...) with the same shape, got {tuple(pred_tokens.shape)} and {tuple(prev_tokens.shape)}"
        )
    if pred_tokens.shape[0] == 0:
        raise ValueError("repetition rate of an empty batch is undefined; pass at least one frame")
    same = (pred_tokens == prev_tokens.to(pred_tokens.device)).flatten(1).all(dim=1)
    return same.float().mean().item()


def false_repetition_rate(
    pred_tokens: np.ndarray | torch.Tensor,
    prev_pred_tokens: np.ndarray | torch.Tensor,
    real_tokens: np.ndarray | torch.Tensor,
    prev_real_tokens: np.ndarray | torch.Tensor,
) -> float:
    """Among the steps where the real frame changed (its tokens differ from the previous real frame's), the fraction
    whose prediction repeats the previous predicted frame: the repetition failure of RLVR-World, without counting the
    still frames the real data has (NaN when no real frame changed)."""
    tensors = [_as_tensor(x) for x in (pred_tokens, prev_pred_tokens, real_tokens, prev_real_tokens)]
    if len({tuple(t.shape) for t in tensors}) != 1 or tensors[0].ndim < 2:
        raise ValueError(f"token batches must all be (N, tokens per frame, ...) with one shape, got {[tuple(t.shape) for t in tensors]}")
    pred, prev_pred, real, prev_real = (t.flatten(1).cpu() for t in tensors)
    return _repeats_where(pred, prev_pred, (real != prev_real).any(dim=1))


def _repeats_where(pred: torch.Tensor, prev_pred: torch.Tensor, changed: torch.Tensor) -> float:
    """Fraction of the `changed` rows whose (N, tokens) prediction equals the previous one (NaN when none changed)."""
    if not changed.any():
        return math.nan
    return (pred == prev_pred).all(dim=1)[changed].float().mean().item()


# A real frame moved visibly when at least this many pixels changed (the changed-pixel MSE's test): 1% of a 64x64
# frame, about a cube's area. Fewer is a sub-pixel shift or a shadow's edge, which can still flip a code.
VISIBLE_MOTION_PIXELS = 41


def moving_repetition_rate(pred_tokens: np.ndarray | torch.Tensor, prev_pred_tokens: np.ndarray | torch.Tensor,
                           target: Frames, prev: Frames, threshold: float = 0.05,
                           min_pixels: int = VISIBLE_MOTION_PIXELS) -> float:
    """Among the steps where the real frame visibly moved (`min_pixels` or more pixels changed from `prev` to `target`
    by more than `threshold` in some channel), the fraction whose prediction repeats the previous predicted frame.

    `false_repetition_rate` reads change from the codes, so a code or two flipping between near-identical frames
    counts as motion and repeating such a frame as a failure; this one counts only frames a person would see move
    (NaN when none did)."""
    pred, prev_pred = _as_tensor(pred_tokens).flatten(1).cpu(), _as_tensor(prev_pred_tokens).flatten(1).cpu()
    target, prev = _frame_pair(target, prev)
    if pred.shape != prev_pred.shape or len(pred) != len(target):
        raise ValueError(f"expected token batches of one shape and as many frames, got {tuple(pred.shape)}, "
                         f"{tuple(prev_pred.shape)} and {len(target)} frames")
    return _repeats_where(pred, prev_pred, changed_pixels(target, prev, threshold).sum(dim=(1, 2)) >= min_pixels)


def frozen_frame_rate(pred: Frames, prev_pred: Frames, target: Frames, prev: Frames, threshold: float = 0.05,
                      min_pixels: int = VISIBLE_MOTION_PIXELS) -> float:
    """Among the steps where the real frame visibly moved (as in `moving_repetition_rate`), the fraction whose
    predicted frame did not: fewer than `min_pixels` pixels changed from the frame shown before it.

    Read from the frames rather than the codes, so it means the same for any tokenizer, with a motion refiner, and
    for a model whose prompts take the codes of the frames shown (`context_from_frames`), whose generated codes
    rarely equal the re-encoded ones bit for bit even when the picture stands still (NaN when no real frame moved)."""
    pred, prev_pred = _frame_pair(pred, prev_pred)
    target, prev = _frame_pair(target, prev)
    if len(pred) != len(target):
        raise ValueError(f"expected as many predicted as real frames, got {len(pred)} and {len(target)}")
    moved = changed_pixels(target, prev, threshold).sum(dim=(1, 2)) >= min_pixels
    if not moved.any():
        return math.nan
    return (changed_pixels(pred, prev_pred, threshold).sum(dim=(1, 2)) < min_pixels)[moved].float().mean().item()


# ---------------------------------------------------------------------------------------------------- objects

# Object colours in the rendered frames (envs/robot/scene.py: red cube, green cube, blue can), as channel tests.
OBJECT_MASKS = {
    "red": lambda f: (f[..., 0] > 140) & (f[..., 1] < 90) & (f[..., 2] < 90),
    "green": lambda f: (f[..., 1] > 110) & (f[..., 0] < 100) & (f[..., 2] < 100),
    "blue": lambda f: (f[..., 2] > 140) & (f[..., 0] < 90) & (f[..., 1] < 130),
}


def object_pixels(frames: np.ndarray) -> np.ndarray:
    """(N, 64, 64, 3) uint8 -> (N, 3 objects) the number of pixels of each object's colour."""
    return np.stack([mask_fn(frames.astype(np.int16)).sum((1, 2)) for mask_fn in OBJECT_MASKS.values()], 1)


def object_centroids(frames: np.ndarray, min_pixels: int = 2) -> np.ndarray:
    """(N, 64, 64, 3) uint8 -> (N, 3 objects, 2) pixel centroids (row, col), NaN where an object is not visible."""
    out = np.full((len(frames), len(OBJECT_MASKS), 2), np.nan)
    rows, cols = np.mgrid[: frames.shape[1], : frames.shape[2]]
    for j, mask_fn in enumerate(OBJECT_MASKS.values()):
        masks = mask_fn(frames.astype(np.int16))
        counts = masks.sum((1, 2))
        visible = counts >= min_pixels
        out[visible, j, 0] = (masks * rows).sum((1, 2))[visible] / counts[visible]
        out[visible, j, 1] = (masks * cols).sum((1, 2))[visible] / counts[visible]
    return out


# Objects showing at least this many pixels in the real frame count as whole (a cube shows 15-40 from this camera);
# fewer are half under the gripper, and their centroid says little about where they are.
WHOLE_OBJECT_PIXELS = 15


def moved_objects(target: np.ndarray, prev: np.ndarray, min_motion: float = 1.0, min_target_pixels: int = 2) -> np.ndarray:
    """(N, 3 objects) True where the object moved by more than `min_motion` px between the previous real frame and
    the target and shows `min_target_pixels` in the target."""
    t = object_centroids(target, min_pixels=min_target_pixels)
    return np.linalg.norm(t - object_centroids(prev), axis=-1) > min_motion  # NaN compares False: not seen in both


def revealed_objects(target: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """(N, 3 objects) True where an object moved and shows whole in the target but not in the previous frame: it came
    out from under the gripper. Every object the session-18 world models lost on 200 fresh episodes was one of these
    (docs/research/rt1_experiments.md, session 19): the transformer's codes seldom redraw them."""
    hidden = object_pixels(prev) < WHOLE_OBJECT_PIXELS
    return moved_objects(target, prev, min_target_pixels=WHOLE_OBJECT_PIXELS) & hidden


def moved_object_distances(pred: np.ndarray, target: np.ndarray, prev: np.ndarray, min_motion: float = 1.0,
                           min_target_pixels: int = 2) -> np.ndarray:
    """Pixel distances between object centroids read from predicted and real frames, one per `moved_objects`
    object; NaN where the prediction lost the object. Flat, frame-major."""
    moved = moved_objects(target, prev, min_motion, min_target_pixels)
    t = object_centroids(target, min_pixels=min_target_pixels)
    return np.linalg.norm(object_centroids(pred) - t, axis=-1)[moved]


# An object the prediction lost counts as the frame's half-diagonal: losing it must not look good.
LOST_OBJECT_PX = 45.0


def object_position_error(pred: np.ndarray, target: np.ndarray, prev: np.ndarray, min_motion: float = 1.0,
                          min_target_pixels: int = 2) -> float:
    """Mean of `moved_object_distances`, a lost object counting LOST_OBJECT_PX: the eval's object error. Still
    objects are left out, or copying would look perfect. NaN when nothing moved."""
    d = moved_object_distances(pred, target, prev, min_motion, min_target_pixels)
    return float(np.where(np.isnan(d), LOST_OBJECT_PX, d).mean()) if d.size else math.nan


def object_reward_error(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per frame, in [0, 1]: the mean over the objects showing in the real frame of min(centroid distance, 45 px) / 45,
    a lost object counting 1 (0 where no object shows). The object term of the RT-1 RLVR reward: every object, moved
    or not, since a prediction that drops a still one is as wrong."""
    p, t = object_centroids(pred), object_centroids(target)
    shown = ~np.isnan(t[..., 0])
    d = np.where(np.isnan(p[..., 0]), LOST_OBJECT_PX, np.minimum(np.linalg.norm(p - t, axis=-1), LOST_OBJECT_PX))
    d = d / LOST_OBJECT_PX
    return np.where(shown, d, 0.0).sum(-1) / np.maximum(shown.sum(-1), 1)


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

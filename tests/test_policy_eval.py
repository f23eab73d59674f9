"""Policy evaluation, real vs learned: SIMPLER's metrics on hand-computed cases, and the ladder on the shipped
rt1-rlvr checkpoint (real MuJoCo episodes, real world-model rollouts) checked against single-env replays."""

import json
import shutil

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from stable_baselines3 import PPO

from envs.robot import RealRT1Env, make_scripted_policy
from rlvr_gym.data.robot import INITIAL_STATES, load_initial_states
from rlvr_gym.evaluation.policies import (
    RT1PolicyEvalConfig,
    mae,
    mmrv,
    pearson,
    policy_frames,
    real_rollout,
    run_rt1_policy_eval,
    sb3_actor,
    scripted_seed,
)
from rlvr_gym.models.lm import CheckpointError
from rlvr_gym.models.robot_world_model import RobotWorldModel
from rlvr_gym.sim.robot import RT1WorldEnv

CHECKPOINT = "rt1-rlvr"
TASK = "open_drawer"
HORIZON = 12


def test_mmrv_matches_hand_computed_violations_and_is_asymmetric():
    sim, real = [0.1, 0.5, 0.3], [0.2, 0.4, 0.8]
    # Policies 1 and 2 are swapped by the simulator: each pays the real gap 0.4; policy 0 is ranked right.
    assert mmrv(sim, real) == pytest.approx((0.0 + 0.4 + 0.4) / 3)
    # Arguments swapped, the gap paid is the other vector's (0.5 - 0.3): the order (sim, real) matters.
    assert mmrv(real, sim) == pytest.approx((0.0 + 0.2 + 0.2) / 3)


def test_mmrv_counts_simulator_ties_as_violations_but_real_ties_cost_nothing():
    assert mmrv([0.5, 0.5], [0.2, 0.6]) == pytest.approx(0.4 / 2)
    assert mmrv([0.2, 0.6], [0.5, 0.5]) == 0.0
    # Only the policy that is really better pays for a tie: its largest real gap to the policies tied with it.
    assert mmrv([0.3, 0.3, 0.3], [0.0, 0.5, 1.0]) == pytest.approx((0.0 + 0.5 + 1.0) / 3)


def test_pearson_and_mae_on_hand_computed_cases():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([0, 1, 0, 1], [0, 0, 1, 1]) == pytest.approx(0.0)
    assert pearson([0.4, 0.4], [0.1, 0.1]) == 1.0  # SIMPLER: identical centred vectors
    assert pearson([0.4, 0.4], [0.1, 0.9]) == 0.0
    assert mae([0.0, 1.0, 0.5], [0.5, 0.5, 0.5]) == pytest.approx(1.0 / 3)
    with pytest.raises(ValueError, match="equal length"):
        mmrv([0.1, 0.2], [0.1])


@given(st.lists(st.integers(0, 16).map(lambda k: k / 16), min_size=2, max_size=8), st.floats(0.1, 5), st.floats(-1, 1))
def test_a_simulator_that_keeps_the_real_order_has_no_violations(real, scale, shift):
    sim = [scale * r + shift for r in real]
    assert mmrv(sim, real) == 0.0
    assert mmrv(real, real) == 0.0
    if len(set(real)) > 1:
        assert pearson(sim, real) == pytest.approx(1.0, abs=1e-4)  # SIMPLER's 1e-8 in the denominator


def test_policy_frames_block_average():
    frames = np.zeros((2, 64, 64, 3), np.uint8)
    frames[1, :2, :2] = [200, 100, 0]
    small = policy_frames(frames, 32)
    assert small.shape == (2, 32, 32, 3) and small.dtype == np.uint8
    assert small[1, 0, 0].tolist() == [200, 100, 0] and small[0].max() == 0
    assert policy_frames(frames, 64) is frames
    with pytest.raises(ValueError, match="divide"):
        policy_frames(frames, 24)


@pytest.fixture(scope="module")
def frame_agent(tmp_path_factory):
    """An (untrained) SB3 PPO policy on 16x16 frames, saved as a checkpoint."""
    env = gym.wrappers.TransformObservation(RealRT1Env(task=TASK), lambda o: policy_frames(o, 16),
                                            gym.spaces.Box(0, 255, (16, 16, 3), np.uint8))
    path = tmp_path_factory.mktemp("agent") / "ppo.zip"
    PPO("MlpPolicy", env, n_steps=16, batch_size=16, seed=0, device="cpu").save(path)
    return path


@pytest.fixture(scope="module")
def ladder(tmp_path_factory, frame_agent):
    out = tmp_path_factory.mktemp("eval")
    config = RT1PolicyEvalConfig(checkpoint=CHECKPOINT, episodes=2, task=TASK, skills=(1.0, 0.0), sb3=(f"ppo:{frame_agent}",),
                                 horizon=HORIZON, num_envs=2, seed=3, out=str(out))
    return config, run_rt1_policy_eval(config), out


def test_ladder_scores_each_policy_in_both_envs_and_writes_its_report(ladder):
    config, result, out = ladder
    names = ["scripted-1.0", "scripted-0.0", config.sb3[0]]
    assert list(result["policies"]) == names
    assert result["policies"]["scripted-1.0"]["real"] == 1.0, "the expert opens the drawer within 12 steps"
    sim = [result["policies"][n]["learned"] for n in names]
    real = [result["policies"][n]["real"] for n in names]
    assert result["mmrv"] == mmrv(sim, real) and result["pearson"] == pearson(sim, real) and result["mae"] == mae(sim, real)
    saved = json.loads((out / "results.json").read_text())
    assert len(saved["episodes"]) == 6 and saved["pearson"] == result["pearson"]
    assert all(name in (out / "table.md").read_text() for name in names)
    assert (out / "scatter.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_learned_side_equals_single_env_replays_from_the_same_initial_state(ladder, frame_agent):
    """The batched work queue must give what one RT1WorldEnv gives: the scripted policy's real actions replayed
    open loop, the SB3 policy acting on predicted frames, success from the success head, from the same row."""
    config, _, out = ladder
    records = json.loads((out / "results.json").read_text())["episodes"]
    states = load_initial_states(RobotWorldModel.resolve(CHECKPOINT))
    sim = RT1WorldEnv(checkpoint=CHECKPOINT, horizon=HORIZON)
    real_env = RealRT1Env(task=TASK, horizon=HORIZON)
    agent = sb3_actor(PPO.load(frame_agent, device="cpu"))
    for record in records:
        assert states.tasks[record["row"]] == TASK and states.seeds[record["row"]] == record["env_seed"]
        frame, info = sim.reset(options={"index": record["row"]})
        np.testing.assert_array_equal(frame, real_env.reset(seed=record["env_seed"])[0])
        if record["policy"].startswith("scripted"):
            skill = float(record["policy"].split("-")[1])
            policy = make_scripted_policy(TASK, skill, scripted_seed(config.seed, record["env_seed"]))
            real = real_rollout(real_env, record["env_seed"], policy, to_horizon=True)
            act = iter(real.actions).__next__
        else:
            real = real_rollout(real_env, record["env_seed"], lambda f, _i: agent(f[None])[0])
            act = lambda: agent(frame[None])[0]  # noqa: E731
        assert (real.success, real.steps) == (record["real_success"], record["real_steps"])
        steps, best, done = 0, 0.0, False
        while not done:
            frame, _, terminated, truncated, info = sim.step(act())
            steps, best, done = steps + 1, max(best, info["success_prob"]), terminated or truncated
        assert (bool(info["is_success"]), steps) == (record["learned_success"], record["learned_steps"])
        assert best == pytest.approx(record["learned_max_success_prob"], abs=1e-4)


def test_initial_states_the_real_env_cannot_reproduce_are_refused(tmp_path):
    world = tmp_path / "world"
    shutil.copytree(RobotWorldModel.resolve(CHECKPOINT), world)
    with np.load(world / INITIAL_STATES) as npz:
        arrays = dict(npz)
    arrays["seeds"] = arrays["seeds"] + 1  # every frame now belongs to another seed's layout
    np.savez_compressed(world / INITIAL_STATES, **arrays)
    with pytest.raises(CheckpointError, match="initial state"):
        run_rt1_policy_eval(RT1PolicyEvalConfig(checkpoint=str(world), episodes=1, task=TASK, skills=(1.0, 0.0),
                                                horizon=2, out=str(tmp_path / "out")))


@pytest.mark.parametrize("change, message", [({"episodes": 99}, "fewer than --episodes"), ({"sb3": ("td3:x.zip",)}, "ALGO:PATH"),
                                             ({"skills": (1.0,)}, "at least two policies"), ({"task": "juggle"}, "unknown task")])
def test_bad_configs_say_what_to_change(tmp_path, change, message):
    config = RT1PolicyEvalConfig(checkpoint=CHECKPOINT, episodes=1, task=TASK, horizon=2, out=str(tmp_path))
    with pytest.raises(ValueError, match=message):
        run_rt1_policy_eval(RT1PolicyEvalConfig(**{**vars(config), **change}))

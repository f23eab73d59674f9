import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from envs.robot import ENV_ID, OBJECT_NAMES, TASKS, RealRT1Env, make_scripted_policy, register_envs, rollout
from envs.robot.env import DEFAULT_HORIZON
from envs.robot.scene import OBJECT_HALF_SIZE
from envs.robot.tasks import (
    DRAWER_CLOSED,
    DRAWER_OPEN,
    NEAR_DISTANCE,
    ON_TARGET_DISTANCE,
    all_tasks,
    is_success,
    success_margin,
    task_and_layout,
    task_from_instruction,
)


@pytest.fixture(scope="module")
def env():
    env = RealRT1Env()
    yield env
    env.close()


def changed_pixels(a: np.ndarray, b: np.ndarray) -> int:
    return int((np.abs(a.astype(int) - b.astype(int)).sum(-1) > 30).sum())


def test_passes_gymnasium_and_sb3_env_checkers():
    made = gym.make(ENV_ID, render_mode="rgb_array")
    check_env(made.unwrapped)
    frame, _ = made.reset(seed=0)
    assert np.array_equal(made.render(), frame)
    made.close()
    sb3_env = RealRT1Env(task="push_to_target")
    sb3_check_env(sb3_env)
    sb3_env.close()


def test_register_envs_is_idempotent_and_task_is_a_make_kwarg():
    register_envs()
    register_envs()
    made = gym.make(ENV_ID, task="close_drawer")
    _, info = made.reset(seed=0)
    assert info["task"] == "close_drawer"
    assert info["instruction"] == "close the drawer"
    made.close()


def test_random_task_draws_every_task_from_the_seed(env):
    drawn = {env.reset(seed=seed)[1]["task"] for seed in range(30)}
    assert drawn == set(TASKS)


def test_same_seed_gives_the_same_rollout():
    envs = [RealRT1Env(), RealRT1Env()]
    runs = []
    for env in envs:
        actions = np.random.default_rng(3).uniform(-1, 1, size=(25, 7)).astype(np.float32)
        frame, info = env.reset(seed=11)
        frames, infos = [frame], [info]
        for action in actions:
            frame, _, _, _, info = env.step(action)
            frames.append(frame)
            infos.append(info)
        runs.append((frames, infos))
        env.close()
    (frames_a, infos_a), (frames_b, infos_b) = runs
    assert all(np.array_equal(a, b) for a, b in zip(frames_a, frames_b))
    assert all(np.array_equal(a["object_pos"], b["object_pos"]) for a, b in zip(infos_a, infos_b))
    assert not np.array_equal(frames_a[0], frames_a[-1])


def test_different_seeds_give_different_starts(env):
    (frame_a, info_a), (frame_b, info_b) = env.reset(seed=1), env.reset(seed=2)
    assert not np.allclose(info_a["object_pos"], info_b["object_pos"])
    assert not np.array_equal(frame_a, frame_b)


def test_info_carries_the_true_state(env):
    _, info = env.reset(seed=5)
    assert info["object_pos"].shape == (len(OBJECT_NAMES), 3)
    assert np.allclose(info["object_pos"][:, 2], 0.025, atol=1e-3)
    assert info["gripper_pos"].shape == (3,) and info["handle_pos"].shape == (3,) and info["target_pos"].shape == (3,)
    assert 0.0 <= info["drawer_qpos"] <= 0.13
    assert info["success"] is False and info["is_success"] is False and info["step"] == 0


EXPERT_MIN_SUCCESS = 0.9
"""Expert success the tabletop must keep on any host and MuJoCo version (measured 59-60 of 60 seeds per task)."""
SKILL_GAP = 0.3
"""How far below the expert the lowest-skill policy must stay (measured 0.27-0.48 success against 0.98-1.0)."""


def success_rate(task: str, skill: float, seeds: range) -> tuple[float, list[dict]]:
    env = RealRT1Env(task=task)
    last_infos = []
    for seed in seeds:
        _, _, infos = rollout(env, make_scripted_policy(task, skill, seed), seed)
        assert not any(info["success"] for info in infos[:-1]), f"{task} seed {seed}: the episode went on after success"
        last_infos.append(infos[-1])
    env.close()
    return float(np.mean([info["success"] for info in last_infos])), last_infos


@pytest.mark.parametrize("task", TASKS)
def test_expert_policy_succeeds(task):
    # A rate over seeds, not every seed: contact dynamics differ in the last bits across MuJoCo versions and CPUs.
    rate, last_infos = success_rate(task, 1.0, range(10))
    assert rate >= EXPERT_MIN_SUCCESS, f"{task}: expert succeeded on {rate:.0%} of 10 seeds"
    assert all(info["step"] < DEFAULT_HORIZON for info in last_infos if info["success"])


def test_success_tests_match_the_true_state():
    env = RealRT1Env(task="move_near")
    _, _, infos = rollout(env, make_scripted_policy("move_near", seed=0), seed=0)
    first, last = infos[0], infos[-1]
    a, b = last["object_a"], last["object_b"]
    assert np.linalg.norm(first["object_pos"][a, :2] - first["object_pos"][b, :2]) > NEAR_DISTANCE
    assert np.linalg.norm(last["object_pos"][a, :2] - last["object_pos"][b, :2]) < NEAR_DISTANCE
    env.close()
    env = RealRT1Env(task="push_to_target")
    _, _, infos = rollout(env, make_scripted_policy("push_to_target", seed=0), seed=0)
    a = infos[-1]["object_a"]
    assert np.linalg.norm(infos[-1]["object_pos"][a, :2] - infos[-1]["target_pos"][:2]) < ON_TARGET_DISTANCE
    env.close()


def test_success_margins_are_positive_exactly_where_the_tasks_are_done():
    rng = np.random.default_rng(0)
    objects = rng.uniform([-0.3, -0.2, -0.01], [0.0, 0.2, 0.05], size=(400, 3, 3))
    objects[:, 1, :2] = objects[:, 0, :2] + rng.normal(0, 0.06, size=(400, 2))  # often near each other
    drawer, target = rng.uniform(0, 0.13, 400), objects[:, 0, :2] + rng.normal(0, 0.03, size=(400, 2))
    on_table = objects[:, :, 2] > OBJECT_HALF_SIZE / 2
    for task in all_tasks():
        a, b = task.object_a, task.object_b
        done = {
            "open_drawer": drawer >= DRAWER_OPEN,
            "close_drawer": drawer <= DRAWER_CLOSED,
            "move_near": on_table[:, a] & (np.linalg.norm(objects[:, a, :2] - objects[:, b, :2], axis=-1) < NEAR_DISTANCE),
            "push_to_target": on_table[:, a] & (np.linalg.norm(objects[:, a, :2] - target, axis=-1) < ON_TARGET_DISTANCE),
        }[task.name]
        assert np.array_equal(success_margin(task, objects, drawer, target) > 0, done), task
        assert [is_success(task, objects[i], drawer[i], np.append(target[i], 0.0)) for i in range(400)] == done.tolist()
        assert 0 < done.mean() < 1 or task.name == "push_to_target" and a != 0, task


def test_instructions_and_seeds_give_back_the_task_and_start_the_env_draws():
    assert [task_from_instruction(t.instruction) for t in all_tasks()] == all_tasks() and len(all_tasks()) == 11
    with pytest.raises(ValueError, match="none of the tabletop's instructions"):
        task_from_instruction("make coffee")
    for name in ("close_drawer", "move_near", "push_to_target"):
        env = RealRT1Env(task=name)
        _, info = env.reset(seed=5)
        task, layout = task_and_layout(name, 5)
        assert (task.object_a, task.object_b) == (info["object_a"], info["object_b"])
        assert np.allclose(layout.target_xy, info["target_pos"][:2]) and np.isclose(layout.drawer_qpos, info["drawer_qpos"])
        env.close()


@pytest.mark.parametrize("task", ["open_drawer", "push_to_target"])
def test_low_skill_policy_succeeds_clearly_less_than_the_expert(task):
    seeds = range(20)
    expert, _ = success_rate(task, 1.0, seeds)
    low, _ = success_rate(task, 0.1, seeds)
    assert expert >= EXPERT_MIN_SUCCESS, f"{task}: expert {expert:.0%}"
    assert low <= expert - SKILL_GAP, f"{task}: skill 0.1 {low:.0%} against the expert's {expert:.0%}"


def test_bad_actions_raise_value_error(env):
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(6, np.float32))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((1, 7), np.float32))
    with pytest.raises(ValueError, match="finite"):
        env.step(np.array([0, 0, np.nan, 0, 0, 0, 0], np.float32))
    with pytest.raises(ValueError, match="finite"):
        env.step(np.array([np.inf, 0, 0, 0, 0, 0, 0], np.float32))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="unknown task"):
        RealRT1Env(task="stack_blocks")
    with pytest.raises(ValueError, match="skill"):
        make_scripted_policy("open_drawer", skill=1.5)
    with pytest.raises(RuntimeError, match="reset"):
        RealRT1Env().step(np.zeros(7, np.float32))


def test_full_scale_action_changes_the_frame_and_holding_still_barely_does(env):
    frame, _ = env.reset(seed=4)
    hold = np.array([0, 0, 0, 0, 0, 0, -1], np.float32)
    before, _, _, _, info = env.step(hold)
    assert changed_pixels(frame, before) < 10
    for axis, direction in [(0, 1.0), (1, 1.0), (2, -1.0)]:
        action = hold.copy()
        action[axis] = direction
        after, _, _, _, next_info = env.step(action)
        moved = np.linalg.norm(next_info["gripper_pos"] - info["gripper_pos"])
        assert moved > 0.06, f"axis {axis}: palm moved only {moved:.3f} m"
        assert changed_pixels(before, after) > 60, f"axis {axis}: frame barely changed"
        before, info = after, next_info


def test_episode_truncates_at_the_horizon():
    env = RealRT1Env(task="open_drawer", horizon=3)
    env.reset(seed=0)
    results = [env.step(np.zeros(7, np.float32)) for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert not any(r[2] for r in results) and all(r[1] == 0.0 for r in results)
    env.close()


def test_policy_rejects_an_episode_of_another_task(env):
    _, info = env.reset(seed=0)
    other = next(t for t in TASKS if t != info["task"])
    with pytest.raises(ValueError, match="policy made for"):
        make_scripted_policy(other)(None, info)

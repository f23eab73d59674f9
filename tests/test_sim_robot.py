"""The learned robot simulator RLVRWorld-RT1-v0: single env, batched VectorEnv and SB3 adapter, on a tiny real world model."""

import dataclasses
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode
from stable_baselines3 import PPO
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.vec_env import VecMonitor

import rlvr_gym  # noqa: F401  (registers the env ids)
from rlvr_gym.data import video_tokens as V
from rlvr_gym.data.episodes import CollectConfig, collect, load_episodes
from rlvr_gym.data.robot import (
    INITIAL_STATES,
    load_initial_states,
    save_initial_states,
    with_episode_starts,
    write_initial_states,
)
from rlvr_gym.domains.robot import balanced_accuracy
from rlvr_gym.models.lm import CheckpointError, LlamaSize
from rlvr_gym.models.motion_refiner import MotionRefiner, MotionRefinerConfig
from rlvr_gym.models.robot_world_model import RobotWorldModel
from rlvr_gym.sim import register_envs
from rlvr_gym.sim.robot import (
    CalibrateConfig,
    RT1WorldEnv,
    RT1WorldVectorEnv,
    best_threshold,
    calibrate,
    first_held_step,
    held_score,
    recalibrate_task,
)
from rlvr_gym.sim.sb3 import SB3VecEnv
from rlvr_gym.train.frame_tokenizer import TokenizerConfig, train_frame_tokenizer
from rlvr_gym.train.rt1_mle import RT1MLEConfig, run_rt1_mle
from rlvr_gym.train.sft import SFTConfig

ENV_ID = "RLVRWorld-RT1-v0"


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("rt1sim")
    collect(CollectConfig(out=str(root / "train"), episodes=4, seed=11, horizon=8))
    tokenizer = train_frame_tokenizer(TokenizerConfig(run_dir=str(root / "tok"), data=str(root / "train"), steps=4, batch_size=8))
    world = run_rt1_mle(RT1MLEConfig(data=str(root / "train"), tokenizer=str(tokenizer), out=str(root / "mle"),
                                     size=LlamaSize(32, 1, 2, 64, 1024),
                                     sft=SFTConfig(steps=3, batch_size=4, micro_batch=4, save_every=3)))
    episodes = load_episodes(root / "train")
    save_initial_states(world, episodes)
    return world, episodes


def actions(n: int, seed: int = 0, num_envs: int | None = None) -> np.ndarray:
    shape = (n, 7) if num_envs is None else (n, num_envs, 7)
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def rollout(env, seed: int, steps: int, options=None) -> tuple[list[np.ndarray], list[dict]]:
    obs, info = env.reset(seed=seed, options=options)
    frames, infos = [obs], [info]
    for action in actions(steps):
        obs, _, _, _, info = env.step(action)
        frames.append(obs)
        infos.append(info)
    return frames, infos


def test_initial_states_round_trip_and_are_checked(tiny_world, tmp_path):
    _, episodes = tiny_world
    save_initial_states(tmp_path, episodes, n=3)
    states = load_initial_states(tmp_path)
    assert len(states) == 3 and states.frames.dtype == np.uint8 and states.frames.shape == (3, 64, 64, 3)
    assert len(set(states.tasks.tolist())) == 3, "initial states are taken in turn from each task"
    np.testing.assert_array_equal(states.frames[0], episodes[0].frames[0])
    assert states.seeds.tolist() == [e.seed for e in episodes[:3]]
    assert states.instructions[0] == episodes[0].instruction
    # The co-training loop adds the starts of the agent's episodes, each real-env seed once.
    grown = with_episode_starts(states, episodes + episodes[:1])
    assert grown.seeds.tolist() == [e.seed for e in episodes[:3]] + [e.seed for e in episodes[3:]]
    write_initial_states(tmp_path / "grown", grown)
    np.testing.assert_array_equal(load_initial_states(tmp_path / "grown").frames, grown.frames)
    assert with_episode_starts(grown, episodes) is grown
    # The true start states (what state dynamics start from) travel with them; older files without them grow NaN rows.
    loaded = load_initial_states(tmp_path / "grown")
    np.testing.assert_array_equal(loaded.states, np.stack([e.states[0] for e in episodes]))
    assert loaded.targets.shape == (len(episodes), 2) and np.isfinite(loaded.targets).all()
    old = dataclasses.replace(states, states=None, targets=None)
    write_initial_states(tmp_path / "old", old)
    assert load_initial_states(tmp_path / "old").states is None
    mixed = with_episode_starts(old, episodes)
    assert np.isnan(mixed.states[:3]).all() and np.array_equal(mixed.states[3:], loaded.states[3:])
    (tmp_path / "bad").mkdir()
    np.savez(tmp_path / "bad" / INITIAL_STATES, frames=states.frames, tasks=states.tasks, instructions=states.instructions,
             seeds=states.seeds, states=np.zeros((3, 2), np.float32))
    with pytest.raises(CheckpointError, match="states must be a float"):
        load_initial_states(tmp_path / "bad")
    with pytest.raises(CheckpointError, match="save_initial_states"):
        load_initial_states(tmp_path / "nowhere")
    (tmp_path / INITIAL_STATES).write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_initial_states(tmp_path)
    np.savez(tmp_path / INITIAL_STATES, frames=np.zeros((2, 64, 64, 3), np.float32), tasks=np.array(["a", "b"]),
             instructions=np.array(["a", "b"]), seeds=np.array([1, 2]))
    with pytest.raises(CheckpointError, match="uint8"):
        load_initial_states(tmp_path)
    with pytest.raises(ValueError, match="no episodes"):
        save_initial_states(tmp_path, [])


def test_env_passes_gymnasium_and_sb3_checks(tiny_world):
    world, _ = tiny_world
    env = gym.make(ENV_ID, checkpoint=world, horizon=5, render_mode="rgb_array").unwrapped
    check_env(env, skip_render_check=False)
    sb3_check_env(env)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs) and info["step"] == 0
    np.testing.assert_array_equal(env.render(), obs)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    np.testing.assert_array_equal(env.render(), obs)
    assert set(info) >= {"success_prob", "success_threshold", "is_success", "task", "instruction", "step"}
    assert info["step"] == 1 and info["success_threshold"] == 0.5  # an uncalibrated checkpoint
    assert reward == float(info["success_prob"] > 0.5) == float(terminated) == float(info["is_success"])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_same_seed_gives_the_same_rollout(tiny_world, temperature):
    world, _ = tiny_world
    a, b = (RT1WorldEnv(checkpoint=world, temperature=temperature) for _ in range(2))
    frames_a, infos_a = rollout(a, seed=5, steps=3)
    frames_b, infos_b = rollout(b, seed=5, steps=3)
    for fa, fb in zip(frames_a, frames_b):
        np.testing.assert_array_equal(fa, fb)
    assert infos_a == infos_b
    assert not np.array_equal(frames_a[0], frames_a[1]), "the model predicts a new frame rather than the initial one"
    if temperature > 0:
        other, _ = rollout(b, seed=6, steps=3, options={"index": infos_a[0]["initial_state"]})
        assert not np.array_equal(other[3], frames_a[3]), "another seed samples other frames from the same start"


def test_bad_actions_raise_clear_errors(tiny_world):
    world, _ = tiny_world
    env = RT1WorldEnv(checkpoint=world)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(7, np.float32))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(7,\)"):
        env.step(np.zeros(6, np.float32))
    with pytest.raises(ValueError, match="finite"):
        env.step(np.full(7, np.nan, np.float32))
    with pytest.raises(ValueError, match="real numbers"):
        env.step(np.array(["a"] * 7))
    with pytest.raises(ValueError, match=r"index.*\[0, 4\)"):
        env.reset(options={"index": 4})
    with pytest.raises(ValueError, match="temperature"):
        RT1WorldEnv(checkpoint=world, temperature=-1.0)
    env.step(np.full(7, 3.0))  # out of range is clipped, as in the real env


def test_device_is_checked_and_a_gpu_steps_like_the_cpu(tiny_world):
    world, _ = tiny_world
    with pytest.raises(ValueError, match="not a torch device"):
        RT1WorldEnv(checkpoint=world, device="gpu0")
    cpu_frames, cpu_infos = rollout(RT1WorldEnv(checkpoint=world, device="cpu"), seed=3, steps=3)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            RT1WorldEnv(checkpoint=world, device="cuda")
        return
    # On a machine with a GPU: the same greedy rollout, up to rounding (an argmax may flip a code or two).
    gpu_frames, gpu_infos = rollout(RT1WorldEnv(checkpoint=world, device="cuda"), seed=3, steps=3)
    assert [i["initial_state"] for i in gpu_infos] == [i["initial_state"] for i in cpu_infos]
    for a, b in zip(cpu_frames, gpu_frames):
        assert b.dtype == np.uint8 and np.abs(a.astype(int) - b).mean() < 5
    vector = RT1WorldVectorEnv(num_envs=2, checkpoint=world, device="cuda")
    vector.reset(seed=0)
    assert vector.step(actions(1, num_envs=2)[0])[0].shape == (2, 64, 64, 3)


def test_task_restricts_the_initial_states(tiny_world):
    world, episodes = tiny_world
    task = episodes[1].task
    env = RT1WorldEnv(checkpoint=world, task=task)
    assert {env.reset(seed=s)[1]["task"] for s in range(6)} == {task}
    with pytest.raises(ValueError, match="no initial states for task"):
        RT1WorldEnv(checkpoint=world, task="juggle")


def test_gym_make_finds_the_env_and_names_a_missing_checkpoint(tiny_world):
    world, _ = tiny_world
    register_envs()  # idempotent: already registered by `import rlvr_gym`
    env = gym.make(ENV_ID, checkpoint=world, horizon=2)
    assert isinstance(env.unwrapped, RT1WorldEnv)
    env.reset(seed=0)
    truncated = [env.step(env.action_space.sample())[3] for _ in range(2)]
    assert truncated[0] is False
    with pytest.raises(CheckpointError, match="no-such-model"):
        gym.make(ENV_ID, checkpoint="no-such-model")
    (world.parent / "broken").mkdir()
    with pytest.raises(CheckpointError, match="world_model.json"):
        gym.make(ENV_ID, checkpoint=world.parent / "broken")


def test_import_registers_without_loading_torch():
    code = "import sys, gymnasium as gym, rlvr_gym; gym.spec('RLVRWorld-RT1-v0'); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_vector_env_steps_like_sequential_single_envs(tiny_world):
    world, _ = tiny_world
    venv = gym.make_vec(ENV_ID, num_envs=4, vectorization_mode="vector_entry_point", checkpoint=world, horizon=20)
    assert isinstance(venv, RT1WorldVectorEnv) and venv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    singles = [RT1WorldEnv(checkpoint=world, horizon=20) for _ in range(4)]
    obs, infos = venv.reset(seed=7)
    for i, env in enumerate(singles):
        single_obs, single_info = env.reset(seed=7 + i)
        np.testing.assert_array_equal(obs[i], single_obs)
        assert infos["initial_state"][i] == single_info["initial_state"]
    alive = np.ones(4, dtype=bool)
    for batch in actions(3, seed=1, num_envs=4):
        obs, rewards, terminated, truncated, infos = venv.step(batch)
        for i in np.flatnonzero(alive):
            single_obs, reward, *_ = singles[i].step(batch[i])
            # The frame decoder's convolutions may round differently at another batch size: one grey level at most.
            np.testing.assert_allclose(obs[i].astype(int), single_obs.astype(int), atol=1, rtol=0)
            assert rewards[i] == reward
        alive &= ~(terminated | truncated)  # an ended sub-env is reset on the next step, the single env is not


def test_next_step_autoreset_resets_on_the_step_after_the_end(tiny_world):
    world, _ = tiny_world
    venv = RT1WorldVectorEnv(num_envs=3, checkpoint=world, horizon=1)
    venv.reset(seed=0)
    steps = actions(3, num_envs=3)
    _, _, terminated, truncated, infos = venv.step(steps[0])
    assert (terminated | truncated).all() and (infos["step"] == 1).all(), "every sub-env ends at the horizon"
    obs, rewards, terminated, truncated, infos = venv.step(steps[1])
    assert (rewards == 0).all() and not terminated.any() and not truncated.any() and (infos["step"] == 0).all()
    states = load_initial_states(world)
    np.testing.assert_array_equal(obs, states.frames[infos["initial_state"].astype(int)])
    assert (venv.step(steps[2])[4]["step"] == 1).all()
    with pytest.raises(ValueError, match=r"\(3, 7\)"):
        venv.step(np.zeros((2, 7), np.float32))


def test_same_step_autoreset_returns_the_final_frame_in_info(tiny_world):
    world, _ = tiny_world
    venv = RT1WorldVectorEnv(num_envs=3, checkpoint=world, horizon=1, autoreset_mode="SameStep")
    assert venv.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    venv.reset(seed=0)
    obs, _, terminated, truncated, infos = venv.step(actions(1, num_envs=3)[0])
    assert (terminated | truncated).all() and infos["_final_obs"].all()
    assert (infos["step"] == 0).all() and (infos["final_info"]["step"] == 1).all()
    states = load_initial_states(world)
    np.testing.assert_array_equal(obs, states.frames[infos["initial_state"].astype(int)])
    assert not np.array_equal(infos["final_obs"][0], obs[0])


def test_partial_reset_keeps_the_other_sub_envs(tiny_world):
    world, _ = tiny_world
    venv = RT1WorldVectorEnv(num_envs=2, checkpoint=world, horizon=1, autoreset_mode=AutoresetMode.DISABLED)
    venv.reset(seed=0, options={"index": [0, 1]})
    stepped, *_ = venv.step(actions(1, num_envs=2)[0])
    with pytest.raises(RuntimeError, match="reset_mask"):
        venv.step(actions(1, num_envs=2)[0])
    obs, infos = venv.reset(options={"reset_mask": np.array([True, False]), "index": 2})
    np.testing.assert_array_equal(obs[0], load_initial_states(world).frames[2])
    np.testing.assert_array_equal(obs[1], stepped[1])
    assert infos["_step"].tolist() == [True, False]


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_sb3_adapter_resets_ended_envs_and_keeps_the_terminal_frame(tiny_world, mode):
    world, _ = tiny_world
    venv = SB3VecEnv(RT1WorldVectorEnv(num_envs=2, checkpoint=world, horizon=1, autoreset_mode=mode, render_mode="rgb_array"))
    venv.seed(3)
    venv.reset()
    obs, rewards, dones, infos = venv.step(actions(1, num_envs=2)[0])
    assert dones.all() and rewards.dtype == np.float32
    states = load_initial_states(world)
    for i, info in enumerate(infos):
        assert info["step"] == 1 and info["TimeLimit.truncated"] == (not info["is_success"])
        np.testing.assert_array_equal(obs[i], states.frames[venv.reset_infos[i]["initial_state"]])
        assert info["terminal_observation"].shape == (64, 64, 3) and not np.array_equal(info["terminal_observation"], obs[i])
    assert venv.get_attr("horizon") == [1, 1] and venv.env_is_wrapped(gym.Wrapper) == [False, False]
    venv.set_attr("horizon", 3)
    assert venv.get_attr("horizon", indices=[1]) == [3]
    with pytest.raises(ValueError, match="share"):
        venv.set_attr("horizon", 2, indices=[0])
    assert len(venv.get_images()) == 2 and venv.render().shape == (128, 64, 3)


def test_sb3_adapter_reaches_the_sub_envs_of_a_sync_vector_env(tiny_world):
    world, _ = tiny_world
    venv = SB3VecEnv(gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", checkpoint=world, horizon=1, render_mode="rgb_array"))
    venv.reset()
    obs, _, dones, infos = venv.step(actions(1, num_envs=2)[0])
    assert dones.all() and all(info["step"] == 1 for info in infos) and all(info["step"] == 0 for info in venv.reset_infos)
    venv.set_attr("horizon", 4, indices=[1])
    assert venv.get_attr("horizon") == [1, 4]
    assert venv.env_is_wrapped(gym.wrappers.OrderEnforcing) == [True, True]
    np.testing.assert_array_equal(np.stack(venv.env_method("render")), obs)


def test_sb3_ppo_learns_in_the_batched_simulator(tiny_world):
    world, _ = tiny_world
    venv = VecMonitor(SB3VecEnv(gym.make_vec(ENV_ID, num_envs=4, vectorization_mode="vector_entry_point", checkpoint=world, horizon=8)))
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, n_epochs=1, policy_kwargs={"net_arch": [16]}, seed=0)
    model.learn(total_timesteps=256)
    assert model.num_timesteps == 256
    assert len(model.ep_info_buffer) > 0, "episodes ended and were reset within the rollouts"


def test_best_threshold_separates_successes_by_balanced_accuracy():
    threshold, score = best_threshold(np.array([0.1, 0.2, 0.3, 0.4]), np.array([False, False, True, True]))
    assert threshold == pytest.approx(0.25) and score == 1.0
    # One success below three failures: the best is to catch the other success alone (TPR 1/2, TNR 3/3).
    probs, succeeded = np.array([0.05, 0.6, 0.7, 0.8, 0.9]), np.array([True, False, False, False, True])
    threshold, score = best_threshold(probs, succeeded)
    assert threshold == pytest.approx(0.85) and score == pytest.approx(0.75)
    assert balanced_accuracy(probs, succeeded, 0.0) == 0.5, "calling everything a success catches no failure"
    with pytest.raises(ValueError, match="one success label per episode"):
        best_threshold(np.array([0.1, 0.2]), np.array([True]))
    # A trivial policy's failure at 0.6 would be paid at the best threshold: a cap of 0 moves it above 0.6.
    probs, succeeded = np.array([0.1, 0.6, 0.5, 0.7]), np.array([False, False, True, True])
    trivial = np.array([False, True, False, False])
    assert best_threshold(probs, succeeded)[0] == pytest.approx(0.3)
    threshold, score = best_threshold(probs, succeeded, trivial, max_trivial_success=0.0)
    assert threshold == pytest.approx(0.65) and score == pytest.approx(0.75)
    assert best_threshold(probs, succeeded, trivial, max_trivial_success=1.0)[0] == pytest.approx(0.3)


def test_held_score_is_the_best_probability_kept_for_hold_frames():
    probs = [0.1, 0.9, 0.2, 0.8, 0.7]
    assert held_score(probs, 1) == 0.9
    assert held_score(probs, 2) == 0.7, "0.9 lasts one frame; 0.8 then 0.7 hold 0.7 for two"
    assert held_score(probs, 6) == 0.0
    # The env's rule: success at the first step that ends `hold` frames above the threshold; called exactly when the
    # episode's held score beats the threshold, which is what calibration relies on.
    assert first_held_step(probs, 0.75, 1) == 1 and first_held_step(probs, 0.65, 2) == 4
    for hold in (1, 2, 3, 6):
        for threshold in (0.05, 0.5, 0.65, 0.75, 0.85, 0.95):
            assert (first_held_step(probs, threshold, hold) is not None) == (held_score(probs, hold) > threshold)


def test_calibration_writes_per_task_thresholds_that_the_sim_uses(tiny_world, tmp_path):
    import shutil

    world, _ = tiny_world
    calibrated = shutil.copytree(world, tmp_path / "world")
    collect(CollectConfig(out=str(tmp_path / "calib"), episodes=4, seed=12, horizon=8))
    result = calibrate(CalibrateConfig(checkpoint=str(calibrated), data=str(tmp_path / "calib"), episodes_per_task=2))
    thresholds = RobotWorldModel.load(calibrated).settings.success_thresholds
    tasks = {e.task for e in load_episodes(tmp_path / "calib")}
    assert set(result["tasks"]) == set(thresholds) == tasks and all(0 < t < 1 for t in thresholds.values())
    # Trivial policies' episodes join the replays: up to episodes_per_task of each task from each directory.
    collect(CollectConfig(out=str(tmp_path / "trivial"), episodes=4, seed=13, horizon=8, tasks=("open_drawer",),
                          random_fraction=0.0, trivial_fraction=1.0))
    both = calibrate(CalibrateConfig(checkpoint=str(calibrated), data=(str(tmp_path / "calib"), str(tmp_path / "trivial")),
                                     episodes_per_task=2))
    assert both["tasks"]["open_drawer"]["episodes"] == result["tasks"]["open_drawer"]["episodes"] + 2
    assert both["tasks"]["close_drawer"]["trivial_failures_called"] is None  # no trivial episode of that task
    capped = calibrate(CalibrateConfig(checkpoint=str(calibrated), data=(str(tmp_path / "calib"), str(tmp_path / "trivial")),
                                       episodes_per_task=2, max_trivial_success=0.0))
    assert capped["tasks"]["open_drawer"]["trivial_failures_called"] == 0.0
    assert both["tasks"]["close_drawer"]["episodes"] == result["tasks"]["close_drawer"]["episodes"]
    # One task recalibrated on given real episodes (as the co-training loop does after a refit): the others kept.
    before = RobotWorldModel.load(calibrated).settings.success_thresholds
    episodes = load_episodes(tmp_path / "trivial")[:2]  # open_drawer
    episodes[0] = dataclasses.replace(episodes[0], success=np.ones_like(episodes[0].success))
    episodes[1] = dataclasses.replace(episodes[1], success=np.zeros_like(episodes[1].success))
    one = recalibrate_task(calibrated, "open_drawer", episodes)
    after = RobotWorldModel.load(calibrated).settings.success_thresholds
    assert (one["episodes"], one["real_successes"]) == (2, 1) and 0.5 <= one["balanced_accuracy"] <= 1
    assert after["open_drawer"] == one["threshold"] and {k: v for k, v in after.items() if k != "open_drawer"} \
        == {k: v for k, v in before.items() if k != "open_drawer"}

    # A threshold of 0 makes every predicted frame a success: the env must end at its first step.
    model = RobotWorldModel.load(calibrated)
    model.settings.success_thresholds = {task: 0.0 for task in tasks}
    model.save_settings(calibrated)
    env = RT1WorldEnv(checkpoint=calibrated)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(actions(1)[0])
    assert terminated and reward == 1.0 and info["is_success"]
    # Held for two frames, the success comes one step later; the frame before it goes back into the prompt unflagged.
    for env in (RT1WorldEnv(checkpoint=calibrated, success_hold=2),
                RT1WorldVectorEnv(num_envs=2, checkpoint=calibrated, success_hold=2)):
        env.reset(seed=0)
        batch = actions(2, num_envs=2) if isinstance(env, RT1WorldVectorEnv) else actions(2)
        _, reward, terminated, _, info = env.step(batch[0])
        assert not np.any(terminated) and np.all(np.asarray(reward) == 0.0) and not np.any(info["is_success"])
        rollouts = env._rollouts if isinstance(env, RT1WorldVectorEnv) else [env._rollout]
        assert all(r.held == 1 and not r.flags[-1] for r in rollouts)
        _, reward, terminated, _, info = env.step(batch[1])
        assert np.all(terminated) and np.all(np.asarray(reward) == 1.0) and np.all(info["is_success"])
    with pytest.raises(ValueError, match="success_hold"):
        RT1WorldEnv(checkpoint=calibrated, success_hold=0)
    with pytest.raises(ValueError, match="directory you can write to"):
        calibrate(CalibrateConfig(checkpoint="rt1-rlvr"))


@pytest.mark.parametrize("context_from_frames", [False, True])
def test_a_world_model_with_a_motion_refiner_steps_through_the_env_frame_by_frame(tiny_world, tmp_path, context_from_frames):
    world_dir, _ = tiny_world
    world = RobotWorldModel.load(world_dir)
    torch.manual_seed(0)
    world.refiner = MotionRefiner(MotionRefinerConfig(width=8)).eval()
    torch.nn.init.normal_(world.refiner.head[-1].weight, std=0.05)  # a refiner that moves pixels, not a fresh one's even mix
    world.settings.context_from_frames = context_from_frames
    refined_dir = world.save(tmp_path / "refined")
    save_initial_states(refined_dir, load_episodes(world_dir.parent.parent / "train"))
    env = gym.make(ENV_ID, checkpoint=refined_dir, horizon=5, render_mode="rgb_array").unwrapped
    check_env(env)
    obs, info = env.reset(seed=3)
    first = before = last = obs
    for action in actions(3, seed=2):
        obs, *_ = env.step(action)
        codes = np.asarray(env._rollout.codes[-1])[None]
        if context_from_frames:  # the next prompt holds what the agent saw, not the codes generated
            np.testing.assert_array_equal(codes, world.encode(obs[None], first[None]))
            before, last = last, obs
            continue
        expected = world.refiner.refine(before[None], last[None], world.decode(codes, first[None]), action[None])[0]
        np.testing.assert_array_equal(obs, expected)
        before, last = last, obs
    venv = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="vector_entry_point", checkpoint=refined_dir, horizon=5)
    obs, _ = venv.reset(seed=4)
    first = before = last = obs
    alive = np.ones(2, dtype=bool)
    for batch in actions(3, seed=5, num_envs=2):
        obs, _, terminated, truncated, _ = venv.step(batch)
        codes = np.stack([r.codes[-1] for r in venv._rollouts])
        if context_from_frames:
            np.testing.assert_array_equal(codes, world.encode(obs, first))
            before, last = last, obs
            continue
        expected = world.refiner.refine(before, last, world.decode(codes, first), batch)
        # Convolutions may round differently at another batch size: one grey level at most.
        np.testing.assert_allclose(obs[alive].astype(int), expected[alive].astype(int), atol=1, rtol=0)
        alive &= ~(terminated | truncated)  # an ended sub-env starts again on the next step
        before, last = last, obs


def test_uncertainty_is_the_generated_codes_negative_log_likelihood_and_is_reported(tiny_world):
    env = RT1WorldEnv(checkpoint=tiny_world[0])
    _, infos = rollout(env, seed=3, steps=3)
    assert infos[0]["uncertainty"] == 0.0 and not infos[0]["halted"]  # the real first frame
    values = [info["uncertainty"] for info in infos[1:]]
    # An almost untrained model spreads its probability over the 1,000 codes: its greedy codes are far from certain.
    assert all(0.0 < u <= np.log(V.CODEBOOK_SIZE) + 1e-4 for u in values)


def test_uncertainty_penalty_and_halt_change_reward_and_episode_end_only(tiny_world):
    plain, penalised = RT1WorldEnv(checkpoint=tiny_world[0]), RT1WorldEnv(checkpoint=tiny_world[0], uncertainty_penalty=0.5)
    plain.reset(seed=4)
    penalised.reset(seed=4)
    step = actions(1)[0]
    obs_a, reward_a, _, _, info_a = plain.step(step)
    obs_b, reward_b, _, _, info_b = penalised.step(step)
    assert np.array_equal(obs_a, obs_b) and info_a["uncertainty"] == info_b["uncertainty"]
    assert reward_b == pytest.approx(reward_a - 0.5 * info_a["uncertainty"])
    halting = RT1WorldEnv(checkpoint=tiny_world[0], halt_uncertainty=info_a["uncertainty"] / 2)
    halting.reset(seed=4)
    _, reward, terminated, truncated, info = halting.step(step)
    assert info["halted"] and truncated and not terminated and reward == 0.0 and not info["is_success"]
    venv = RT1WorldVectorEnv(num_envs=2, checkpoint=tiny_world[0], halt_uncertainty=info_a["uncertainty"] / 2)
    venv.reset(seed=4)
    _, rewards, terminated, truncated, infos = venv.step(actions(1, num_envs=2)[0])
    assert truncated.all() and not terminated.any() and infos["halted"].all() and (rewards == 0).all()
    with pytest.raises(ValueError, match="halt_uncertainty"):
        RT1WorldEnv(checkpoint=tiny_world[0], halt_uncertainty=0.0)


def test_bfloat16_precision_is_checked_and_stays_close_to_float32(tiny_world):
    world_dir, episodes = tiny_world
    with pytest.raises(ValueError, match="precision must be one of"):
        RT1WorldEnv(checkpoint=world_dir, precision="int8")
    full, half = RobotWorldModel.load(world_dir), RobotWorldModel.load(world_dir, precision="bfloat16")
    assert half.matmul_dtype == torch.bfloat16 and full.matmul_dtype is None
    assert all(p.dtype == torch.float32 for _, network in half.networks() for p in network.parameters())
    frames, first = episodes[0].frames[:4], episodes[0].frames[:1]
    codes = full.encode(frames, first)
    # The frame networks in bfloat16: nearly the same codes, the same pictures up to rounding.
    assert (half.encode(frames, first) == codes).mean() > 0.9
    assert np.abs(half.decode(codes, first).astype(int) - full.decode(codes, first)).mean() < 2
    # The transformer's products in bfloat16: its success probability moves by rounding only.
    prompts = [full.prompt([codes[0]], [False], [episodes[0].actions[0]])]
    np.testing.assert_allclose(half.predict(prompts)[1], full.predict(prompts)[1], atol=0.05)
    env = gym.make(ENV_ID, checkpoint=world_dir, horizon=3, precision="bfloat16").unwrapped
    check_env(env)
    frames, _ = rollout(env, seed=3, steps=2)
    assert all(f.shape == (64, 64, 3) and f.dtype == np.uint8 for f in frames)

"""SB3 agents trained inside the learned simulators (tiny world models made here) and scored in the real envs:
the MuJoCo tabletop from held-out start states, and TextWorld."""

import csv
import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO, SAC
from test_sim_textgame import game_dir, garbage_checkpoint, start_file  # noqa: F401  (a tiny learned text game)

from agents.robot import (
    EVAL_SEED_RUN,
    check_held_out,
    evaluate_in_learned,
    evaluate_in_real,
    make_sim_env,
    real_start_states,
)
from agents.train_sb3 import Args, build, train
from envs.robot import TASKS, RealRT1Env
from rlvr_gym.data.episodes import SEEDS_PER_RUN, CollectConfig, collect, load_episodes
from rlvr_gym.data.robot import load_initial_states, save_initial_states
from rlvr_gym.models.lm import LlamaSize
from rlvr_gym.models.robot_world_model import RobotWorldModel
from rlvr_gym.sim.robot import success_agreement
from rlvr_gym.train.frame_tokenizer import TokenizerConfig, train_frame_tokenizer
from rlvr_gym.train.rt1_mle import RT1MLEConfig, run_rt1_mle
from rlvr_gym.train.sft import SFTConfig


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("rt1agents")
    collect(CollectConfig(out=str(root / "train"), episodes=4, seed=11, horizon=8))
    tokenizer = train_frame_tokenizer(TokenizerConfig(run_dir=str(root / "tok"), data=str(root / "train"), steps=4, batch_size=8))
    world = run_rt1_mle(RT1MLEConfig(data=str(root / "train"), tokenizer=str(tokenizer), out=str(root / "mle"),
                                     size=LlamaSize(32, 1, 2, 64, 1024),
                                     sft=SFTConfig(steps=3, batch_size=4, micro_batch=4, save_every=3)))
    save_initial_states(world, load_episodes(root / "train"))
    return str(world)


def test_ppo_trains_in_the_learned_sim_and_is_scored_in_the_real_env(tiny_world, tmp_path):
    args = Args(algo="ppo", steps=256, checkpoint=tiny_world, eval_every=128, eval_episodes=2, num_envs=8, horizon=8,
                n_steps=16, batch_size=64, out=str(tmp_path))
    result = train(args)
    assert result["steps"] == 256 and result["steps_per_s"] > 0
    evals = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [128, 256]
    assert all(0.0 <= e["success_rate"] <= 1.0 and e["episodes"] == 2 and 1 <= e["mean_length"] <= 8 for e in evals)
    assert result["real"] == evals[-1]
    with (tmp_path / "progress.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {"real/success_rate", "real/mean_return", "train/value_loss", "rollout/ep_len_mean"} <= set(rows[0])
    assert list(tmp_path.glob("events.out.tfevents.*")), "TensorBoard events are written"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ppo_128_steps.zip", "ppo_256_steps.zip"]
    model = PPO.load(tmp_path / "model.zip", device="cpu")
    assert model.observation_space.shape[1:] == (32, 32), "the policy acts on 32x32 frames"
    # The saved agent is scored again, independently, from the same held-out real starts: same deterministic result.
    again = evaluate_in_real(model, episodes=2, horizon=8)
    assert again == {k: v for k, v in evals[-1].items() if k != "step"}


def test_sac_trains_in_the_learned_sim_and_is_scored_in_it_beside_the_real_env(tiny_world, tmp_path):
    result = train(Args(algo="sac", steps=64, checkpoint=tiny_world, eval_every=64, eval_episodes=3, num_envs=4,
                        horizon=6, batch_size=16, buffer_size=500, frame_size=16, eval_learned=True, out=str(tmp_path)))
    assert result["steps"] == 64 and result["real"]["episodes"] == 3
    with (tmp_path / "progress.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert any(row.get("train/actor_loss") for row in rows), "SAC took gradient steps"
    assert rows[-1]["learned/success_rate"] != "" and rows[-1]["real/success_rate"] != ""
    # The saved agent scored again in the simulator, from the same held-out starts' real first frames: same result.
    model = SAC.load(tmp_path / "model.zip", device="cpu")
    again = evaluate_in_learned(model, tiny_world, episodes=3, horizon=6, num_envs=4)
    assert result["real"]["learned_success_rate"] == again


def test_sim_env_gives_downsampled_frames_and_episode_stats(tiny_world):
    venv = make_sim_env(tiny_world, num_envs=2, horizon=3, frame_size=16)
    obs = venv.reset()
    assert obs.shape == (2, 16, 16, 3)
    ended = []
    for _ in range(3):
        obs, _, dones, infos = venv.step(venv.action_space.sample()[None].repeat(2, 0))
        assert obs.shape == (2, 16, 16, 3)
        ended += [info for done, info in zip(dones, infos) if done]
    assert len(ended) >= 2, "every sub-env ends within its 3-step horizon"
    assert all(info["terminal_observation"].shape == (16, 16, 3) and "episode" in info for info in ended)
    venv.close()


def test_shaping_adds_the_change_in_the_log_odds_of_success_and_nothing_across_episodes(tiny_world, tmp_path):
    world = shutil.copytree(tiny_world, tmp_path / "world")
    model = RobotWorldModel.load(world)
    model.settings.success_thresholds = {task: 1.0 for task in TASKS}  # never paid: episodes run to the horizon
    model.save_settings(world)
    sparse = make_sim_env(world, num_envs=2, horizon=3, frame_size=16)
    shaped = make_sim_env(world, num_envs=2, horizon=3, frame_size=16, shaping=0.5)
    actions = [sparse.action_space.sample()[None].repeat(2, 0) for _ in range(5)]
    for venv in (sparse, shaped):
        venv.seed(0)
        venv.reset()
    previous, shaped_any = None, False
    for action in actions:
        _, plain, plain_dones, plain_infos = sparse.step(action)
        _, rewards, dones, infos = shaped.step(action)
        probs = np.clip([info["success_prob"] for info in infos], 1e-12, 1 - 1e-12)
        assert np.allclose(probs, [info["success_prob"] for info in plain_infos], atol=1e-6)  # the same rollouts
        log_odds = np.log(probs / (1 - probs))
        expected = plain + (0.0 if previous is None else 0.5 * np.where(np.isnan(previous), 0, log_odds - previous))
        np.testing.assert_allclose(rewards, expected, atol=1e-4)
        assert "episode" not in infos[0] or infos[0]["episode"]["r"] == plain_infos[0]["episode"]["r"], \
            "episode stats report the sparse return"
        assert (dones == plain_dones).all() and not plain.any()
        shaped_any |= bool((rewards != plain).any())
        previous = np.where(dones, np.nan, log_odds)
    assert shaped_any
    with pytest.raises(ValueError, match="shaping"):
        make_sim_env(tiny_world, num_envs=1, shaping=-1.0)
    sparse.close()
    shaped.close()


def test_rt1_training_takes_the_shaped_reward_and_scores_from_the_held_out_starts_asked_for(tiny_world, monkeypatch):
    from agents.robot import VecShaped
    from agents.train_sb3 import build

    firsts = []
    monkeypatch.setattr("agents.robot.evaluate_in_real",
                        lambda model, episodes, task, horizon, first: firsts.append(first) or {"success_rate": 0.0})
    env, evaluate = build(Args(checkpoint=tiny_world, num_envs=2, horizon=8, shaping=0.2, eval_first=500))
    assert isinstance(env.venv, VecShaped) and env.venv.weight == 0.2
    assert evaluate(None) == {"success_rate": 0.0} and firsts == [500]
    env.close()
    env, _ = build(Args(checkpoint=tiny_world, num_envs=2, horizon=8))
    assert not isinstance(env.venv, VecShaped), "unshaped by default"
    env.close()
    with pytest.raises(ValueError, match="tabletop"):
        build(Args(env="RLVRWorld-TextGame-v0", algo="dqn", shaping=0.2))
    with pytest.raises(ValueError, match=">= 0"):
        train(Args(checkpoint=tiny_world, eval_first=-1))


def test_real_scores_come_from_held_out_start_states(tiny_world):
    starts = real_start_states(5)
    assert [t for t, _ in starts][:4] == ["open_drawer", "close_drawer", "move_near", "push_to_target"]
    assert all(seed // SEEDS_PER_RUN == EVAL_SEED_RUN for _, seed in starts)
    check_held_out(tiny_world, starts)
    with pytest.raises(ValueError, match="initial states of"):
        check_held_out(tiny_world, [("open_drawer", 11 * SEEDS_PER_RUN)])


def test_the_real_env_shaped_as_the_learned_one_reads_success_off_the_true_state_and_monitors_the_sparse_reward():
    from agents.robot import TrueSuccessProbability, make_real_env
    from envs.robot.policies import drawer_action

    env = TrueSuccessProbability(RealRT1Env(task="close_drawer", horizon=50))
    _, info = env.reset(seed=3)
    probabilities, successes = [info["success_prob"]], [info["success"]]
    while not successes[-1]:
        _, _, terminated, truncated, info = env.step(drawer_action(info, pull=False))
        probabilities.append(info["success_prob"])
        successes.append(info["success"])
        assert not truncated
    env.close()
    # Above one half exactly where the real env says success, as the simulator's state dynamics would report it.
    assert [p > 0.5 for p in probabilities] == successes and probabilities[-1] > probabilities[0]

    venv = make_real_env("close_drawer", horizon=4, frame_size=16, shaping=0.5)
    assert venv.reset().shape == (1, 16, 16, 3)
    rewards = []
    for _ in range(4):
        _, reward, done, infos = venv.step(np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]]))
        rewards.append(float(reward[0]))
    assert done[0] and infos[0]["episode"]["r"] == 0.0, "the monitor keeps the real, sparse return"
    assert rewards[0] == 0.0, "the first step has no previous value to shape from"
    venv.close()
    with pytest.raises(ValueError, match="shaping"):
        make_real_env("close_drawer", shaping=-1.0)


@pytest.mark.parametrize("task", ["open_drawer", "push_to_target"])
def test_the_reach_term_leads_to_where_the_expert_starts_the_work_and_shapes_by_its_decrease(task):
    from agents.robot import TrueSuccessProbability, make_real_env
    from envs.robot import make_scripted_policy

    env, policy = TrueSuccessProbability(RealRT1Env(task=task)), make_scripted_policy(task)
    obs, info = env.reset(seed=1)
    first, distances, done = info, [info["reach_distance"]], False
    moved = lambda i: (abs(i["drawer_qpos"] - first["drawer_qpos"]) if task == "open_drawer"  # noqa: E731
                       else np.linalg.norm(i["object_pos"][first["object_a"]] - first["object_pos"][first["object_a"]]))
    while not done:
        obs, _, terminated, truncated, next_info = env.step(policy(obs, info))
        if moved(next_info) > 0.005 and moved(info) <= 0.005:
            assert info["reach_distance"] < 0.04, "the work starts where the reach term leads"
        info, done = next_info, terminated or truncated
        distances.append(info["reach_distance"])
    env.close()
    assert info["success"] and distances[0] > 0.15 and min(distances) < 0.01

    venv = make_real_env(task, horizon=4, frame_size=16, reach=5.0)
    venv.reset()
    previous = None
    for action in ([0.0, 0.0, -1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]):
        _, reward, done, infos = venv.step(np.array([[*action, 0.0, 0.0, 0.0, -1.0]]))
        distance = infos[0]["reach_distance"]
        assert reward[0] == pytest.approx(0.0 if previous is None else 5.0 * (previous - distance), abs=1e-5)
        previous = distance
    assert done[0] and infos[0]["episode"]["r"] == 0.0, "the monitor keeps the real, sparse return"
    venv.close()
    with pytest.raises(ValueError, match="reach"):
        make_real_env(task, reach=-1.0)


def test_reach_shaping_and_the_state_observation_need_a_simulator_that_predicts_the_state(tiny_world):
    with pytest.raises(ValueError, match="state dynamics"):
        make_sim_env(tiny_world, num_envs=1, reach=5.0)
    with pytest.raises(ValueError, match="has none"):
        make_sim_env(tiny_world, num_envs=1, observation="state")
    with pytest.raises(ValueError, match="observation must be one of"):
        make_sim_env(tiny_world, num_envs=1, observation="pixels")
    with pytest.raises(ValueError, match="tabletop"):
        build(Args(env="RLVRWorld-TextGame-v0", algo="dqn", reach=5.0))


def test_an_agent_on_the_state_sees_the_true_state_in_the_real_env_and_is_scored_on_it():
    from agents.robot import StateObservation, make_real_env
    from rlvr_gym.data.episodes import info_state
    from rlvr_gym.evaluation.policies import acts_on_state, sb3_real_actor

    env = StateObservation(RealRT1Env(task="open_drawer", horizon=5))
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    np.testing.assert_allclose(obs, [*info_state(info), *info["target_pos"][:2]])
    obs, _, _, _, info = env.step(np.array([0.5, 0, 0, 0, 0, 0, 1], np.float32))
    np.testing.assert_allclose(obs[:3], info["gripper_pos"], atol=1e-6)
    env.close()
    venv = make_real_env("open_drawer", horizon=5, observation="state", reach=5.0, num_envs=2)
    model = PPO("MlpPolicy", venv, n_steps=8, batch_size=16, seed=0, device="cpu").learn(16)
    assert acts_on_state(model) and sb3_real_actor(model)(None, info).shape == (7,)
    first = evaluate_in_real(model, episodes=2, task="open_drawer", horizon=5)
    assert first == evaluate_in_real(model, episodes=2, task="open_drawer", horizon=5), "greedy: the same twice"
    venv.close()
    with pytest.raises(ValueError, match="observation must be one of"):
        make_real_env("open_drawer", observation="pixels")


@pytest.mark.parametrize("env, algo", [("RLVRWorld-RT1-v0", "dqn"), ("RLVRWorld-TextGame-v0", "sac")])
def test_algorithm_must_fit_the_env(env, algo, tmp_path):
    with pytest.raises(ValueError, match="does not fit"):
        train(Args(env=env, algo=algo, out=str(tmp_path)))


def test_dqn_trains_in_the_learned_text_game_and_is_scored_in_real_textworld(garbage_checkpoint, tmp_path):
    result = train(Args(env="RLVRWorld-TextGame-v0", algo="dqn", steps=24, checkpoint=str(garbage_checkpoint), eval_every=24,
                        eval_episodes=1, batch_size=8, buffer_size=100, eval_learned=True, out=str(tmp_path)))
    assert result["steps"] == 24 and result["real"]["episodes"] == 1 and 0.0 <= result["real"]["success_rate"] <= 1.0
    assert result["real"]["learned_success_rate"] in (0.0, 1.0), "one game, won or not in the learned simulator"
    assert (tmp_path / "checkpoints" / "dqn_24_steps.zip").is_file()


def test_cotraining_counts_real_steps_refits_the_world_on_the_agents_episodes_and_resumes(tiny_world, tmp_path,
                                                                                         monkeypatch):
    from agents import cotrain

    config = cotrain.CoTrainConfig(out=str(tmp_path / "run"), checkpoint=tiny_world, task="open_drawer", rounds=1,
                                   real_steps=10, eval_episodes=2, sim_steps=32, num_envs=2, horizon=6, frame_size=16,
                                   replay=str(Path(tiny_world).parent.parent / "train"), mle_steps=2, grpo_steps=1,
                                   n_steps=8)
    first = cotrain.run_cotrain(config)
    collected = load_episodes(tmp_path / "run" / "round_00" / "real")
    data_steps = sum(len(e) for e in collected)
    assert data_steps >= 10 and all(e.policy == "agent" and e.task == "open_drawer" for e in collected)
    assert data_steps < first["real_steps_total"] <= data_steps + 2 * 6  # the two scoring episodes count too
    assert 0 <= first["real_success"] <= 1 and 0 <= first["learned_success"] <= 1 and first["agent_steps"] >= 32
    # The refitted simulator starts from its own real states and those the agent saw, and its transformer moved.
    starts = load_initial_states(first["world"])
    own = load_initial_states(tiny_world).seeds.tolist()
    assert starts.seeds.tolist() == own + [e.seed for e in collected]
    before = RobotWorldModel.load(tiny_world).lm.state_dict()
    after = RobotWorldModel.load(first["world"]).lm.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # Killed in the middle of round 1's refit: the rerun resumes there, redoes nothing finished, loses nothing.
    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cotrain, "refit", killed)
    with pytest.raises(KeyboardInterrupt):
        cotrain.run_cotrain(replace(config, rounds=2))
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert (state["round"], state["phase"]) == (1, "refit") and state["real_steps_total"] > first["real_steps_total"]
    monkeypatch.undo()
    second = cotrain.run_cotrain(replace(config, rounds=2))
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1] and second == rounds[-1]
    assert second["real_steps_total"] > state["real_steps_total"] and second["world"] != first["world"]
    with pytest.raises(ValueError, match="other settings"):
        cotrain.run_cotrain(replace(config, rounds=3, mle_steps=5))


def test_a_loop_with_state_dynamics_refits_them_on_the_agents_transitions_and_keeps_the_tasks_own_test(tiny_world,
                                                                                                       tmp_path):
    from agents import cotrain
    from rlvr_gym.train.state_dynamics import DynamicsConfig, train_state_dynamics

    train_dir = str(Path(tiny_world).parent.parent / "train")
    dynamics = DynamicsConfig(run_dir=str(tmp_path / "dynamics"), world_model=tiny_world, data=(train_dir,), steps=10,
                              batch_size=16, members=2, hidden=16, layers=1, save_every=10)
    with pytest.raises(ValueError, match="initial states"):
        train_state_dynamics(dynamics)  # the tiny world starts from all of its training episodes
    collect(CollectConfig(out=str(tmp_path / "other"), episodes=4, seed=14, horizon=8))
    train_state_dynamics(replace(dynamics, data=(str(tmp_path / "other"),)))
    world = str(tmp_path / "dynamics" / "world_model")
    config = cotrain.CoTrainConfig(out=str(tmp_path / "run"), checkpoint=world, task="open_drawer", rounds=1,
                                   real_steps=10, eval_episodes=1, sim_steps=16, num_envs=2, horizon=5, frame_size=16,
                                   replay=train_dir, mle_steps=1, grpo_steps=1, dynamics_steps=5, n_steps=8,
                                   shaping=0.2, reach=5.0)
    record = cotrain.run_cotrain(config)
    # An agent on the state: it collects, is scored and trains on the state, real and predicted alike.
    on_state = cotrain.run_cotrain(replace(config, out=str(tmp_path / "state"), observation="state", real_updates=True))
    agent = PPO.load(tmp_path / "state" / "agent.zip", device="cpu")
    assert agent.observation_space.shape == (16,) and 0.0 <= on_state["real_success"] <= 1.0
    # A final refit added to the finished run: a world the agent never trained in, made once.
    final = replace(config, out=str(tmp_path / "state"), observation="state", real_updates=True, final_dynamics_steps=5)
    cotrain.run_cotrain(final)
    final_world = json.loads((tmp_path / "state" / "state.json").read_text())["final_world"]
    refit = RobotWorldModel.load(final_world).state_dynamics.state_dict()
    trained_in = RobotWorldModel.load(on_state["world"]).state_dynamics.state_dict()
    assert any(not torch.equal(refit[k], trained_in[k]) for k in refit), "refit on the last scoring too"
    made = (Path(final_world) / "state_dynamics").stat().st_mtime_ns
    cotrain.run_cotrain(final)
    assert (Path(final_world) / "state_dynamics").stat().st_mtime_ns == made, "resumed, nothing redone"
    before = RobotWorldModel.load(world).state_dynamics.state_dict()
    after = RobotWorldModel.load(record["world"]).state_dynamics.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the dynamics were refit"
    starts = load_initial_states(record["world"])
    assert len(starts) > len(load_initial_states(world)) and np.isfinite(starts.states).all()
    assert not list((tmp_path / "run").rglob("calibration.json")), "success stays the task's own test"


def test_tabletop_score_data_makes_each_scoring_from_fresh_held_out_starts_the_next_refits_data(tiny_world, tmp_path,
                                                                                                  monkeypatch):
    from agents import cotrain
    from rlvr_gym.sim.robot import _Simulator

    learned_starts, add_starts = [], _Simulator.add_starts
    monkeypatch.setattr(_Simulator, "add_starts",
                        lambda sim, states: learned_starts.append(states) or add_starts(sim, states))
    config = cotrain.CoTrainConfig(out=str(tmp_path / "run"), checkpoint=tiny_world, task="open_drawer", rounds=1,
                                   real_steps=0, eval_episodes=2, sim_steps=16, num_envs=2, horizon=5, frame_size=16,
                                   mle_steps=1, grpo_steps=1, recalibrate=False, n_steps=8, score_data=True)
    last = cotrain.run_cotrain(config)
    run = tmp_path / "run"
    rounds = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    before, after = load_episodes(run / cotrain.START_SCORE / "score"), load_episodes(run / "round_00" / "score")
    first = EVAL_SEED_RUN * SEEDS_PER_RUN
    assert [e.seed for e in before] == [first, first + 1] and [e.seed for e in after] == [first + 2, first + 3]
    assert [r["round"] for r in rounds] == [-1, 0] and not (run / "round_00" / "real").exists()
    # The scorings are the only real steps; each record's success is that of its recorded episodes.
    assert last["real_steps_total"] == sum(len(e) for e in before + after)
    assert [r["real_success"] for r in rounds] == [np.mean([e.succeeded for e in eps]) for eps in (before, after)]
    # And how the simulator the agent trained in calls them, replayed open loop: what it pays of the real failures.
    for record, episodes in zip(rounds, (before, after)):
        paid = success_agreement(record["world"], episodes)["open_drawer"]
        assert record["replayed_failures_paid"] == pytest.approx(paid["failures_paid"], nan_ok=True)
        assert np.isnan(record["replayed_successes_paid"]) == (not any(e.succeeded for e in episodes))
    # Each record's learned success comes from the starts its real scoring took.
    for states, episodes in zip(learned_starts, (before, after), strict=True):
        assert states.seeds.tolist() == [e.seed for e in episodes]
        assert all(np.array_equal(frame, e.frames[0]) for frame, e in zip(states.frames, episodes))
    # Round 0's refit learned from the scoring before it, and its simulator starts from those states too.
    assert load_initial_states(last["world"]).seeds.tolist()[-2:] == [first, first + 1]
    with pytest.raises(ValueError, match="real-steps"):
        cotrain.run_cotrain(replace(config, out=str(tmp_path / "x"), score_data=False))


def test_real_updates_train_the_tabletop_agent_on_its_data_steps_and_a_kill_keeps_them(tiny_world, tmp_path,
                                                                                        monkeypatch):
    from agents import cotrain

    config = cotrain.CoTrainConfig(out=str(tmp_path / "run"), checkpoint=tiny_world, task="open_drawer", rounds=1,
                                   real_steps=12, eval_episodes=1, sim_steps=16, num_envs=2, horizon=5, frame_size=16,
                                   mle_steps=1, grpo_steps=0, recalibrate=False, n_steps=8, real_updates=True)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cotrain, "refit", killed)
    with pytest.raises(KeyboardInterrupt):
        cotrain.run_cotrain(config)
    # One PPO rollout of exactly the data steps, its episodes (the last one cut) written as the world model's data.
    collected = load_episodes(tmp_path / "run" / "round_00" / "real")
    assert sum(len(e) for e in collected) == 12 and [len(e) for e in collected] == [5, 5, 2]
    assert len({e.seed for e in collected}) == 3 and all(e.policy == "agent" for e in collected)
    state = cotrain.State(**json.loads((tmp_path / "run" / "state.json").read_text()))
    assert (state.phase, state.real_steps_total, state.collect_seed) == ("refit", 12, 3)
    # The agent learned from them, and a resumed run goes on with that agent.
    untrained = cotrain.make_agent(config, state.world)[0].policy.state_dict()
    saved = cotrain.resumed_agent(tmp_path / "run", state)
    assert saved == tmp_path / "run" / "round_00" / cotrain.REAL_UPDATED_AGENT
    updated = PPO.load(saved, device="cpu").policy.state_dict()
    assert any(not torch.equal(untrained[k], updated[k]) for k in untrained)
    monkeypatch.undo()
    assert cotrain.run_cotrain(config)["real_steps_total"] > 12


def test_a_run_recorded_before_a_setting_existed_resumes_with_that_setting_at_its_default(tmp_path):
    from agents import cotrain

    config = cotrain.CoTrainConfig(out=str(tmp_path), checkpoint="rt1-rlvr")
    recorded = asdict(config)
    del recorded["shaping"]  # a run begun before shaping was a setting: it ran unshaped
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    (tmp_path / "state.json").write_text(json.dumps(asdict(cotrain.State(round=2, world="w"))))
    assert cotrain.load_state(config, tmp_path).round == 2
    with pytest.raises(ValueError, match="shaping"):
        cotrain.load_state(replace(config, shaping=0.5), tmp_path)


def test_the_reach_benchmark_trains_each_observation_in_the_real_env_and_reuses_a_finished_curve(tmp_path, monkeypatch):
    import argparse

    import bench.rt1_reach as bench
    from agents.robot import make_real_env

    monkeypatch.setattr(bench, "OUT", tmp_path)
    for observation, shape in (("state", (16,)), ("frame", (32, 32, 3))):
        venv = make_real_env("open_drawer", 50, shaping=0.2, reach=5.0, observation=observation,
                             num_envs=bench.REAL_ENVS)
        assert venv.num_envs == bench.REAL_ENVS and venv.reset().shape == (bench.REAL_ENVS, *shape)
        venv.close()
    args = argparse.Namespace(task="open_drawer", steps=1024, every=512, episodes=1, shaping=0.2, horizon=5)
    points = bench.run_arm("state", 5.0, 0, args)
    assert [p["steps"] for p in points] == [512, 1024] and all(0 <= p["real_success"] <= 1 for p in points)
    monkeypatch.setattr(bench, "PPO", None)  # a finished curve with the same settings is read, not trained again
    assert bench.run_arm("state", 5.0, 0, args) == points

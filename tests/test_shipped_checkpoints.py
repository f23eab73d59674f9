"""The world models shipped inside the package: present, small, documented, and what `gym.make` uses by default."""

import json
import warnings
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from packaging.version import Version

import rlvr_gym  # noqa: F401  (registers the env ids)
from envs.web import WebTaskEnv, browser_available, parse, task_done
from rlvr_gym.data.real_env_versions import (
    REAL_ENV_FILE,
    REAL_ENV_PACKAGES,
    check_real_env_versions,
    read_real_env_versions,
    write_real_env_versions,
)
from rlvr_gym.models.lm import SHIPPED_DIR
from rlvr_gym.models.robot_world_model import RobotWorldModel
from rlvr_gym.models.web_outcome import OUTCOME_DIR, OutcomeHead
from rlvr_gym.sim.web import WebWorldModel, load_start_pages


# rt1-dynamics carries rt1-rlvr's 9.9 MiB video model and 1.4 MiB of state dynamics; rt1-cotrained is its refit.
@pytest.mark.parametrize("name, budget_mib", [("rt1-mle", 10), ("rt1-rlvr", 10), ("rt1-dynamics", 12),
                                              ("rt1-cotrained", 12)])
def test_shipped_robot_world_models_are_small_and_carry_a_card(name, budget_mib):
    path = SHIPPED_DIR / name
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    assert size <= budget_mib * 1024 * 1024, f"{name} is {size / 2**20:.2f} MiB; the budget is {budget_mib} MiB"
    card = (path / "CARD.md").read_text()
    for section in ("## Data", "## Commands", "## Held-out metrics", "rlvr-gym eval rt1"):
        assert section in card
    world = RobotWorldModel.load(name)
    assert world.settings.context_steps >= 1


@pytest.mark.parametrize("name", ["rt1-dynamics", "rt1-cotrained"])
def test_rt1_dynamics_decides_success_from_the_state_it_predicts_from_true_start_states(name):
    from agents.robot import check_held_out, real_start_states
    from rlvr_gym.data.robot import load_initial_states

    world = RobotWorldModel.load(name)
    assert world.state_dynamics is not None and world.state_reader is None and world.settings.success_thresholds == {}
    assert np.isfinite(load_initial_states(SHIPPED_DIR / name).states).all()
    # The co-training loop started its simulator from its scorings' held-out starts too; none is shipped.
    check_held_out(name, real_start_states(64, "close_drawer"))
    env = gym.make("RLVRWorld-RT1-v0", checkpoint=name)
    check_env(env.unwrapped, skip_render_check=True)
    env.reset(seed=0)
    info = env.step(np.zeros(7, np.float32))[4]
    assert {"predicted_state", "state_disagreement"} <= set(info) and 0.0 <= info["success_prob"] <= 1.0


def test_the_learned_env_starts_where_an_agent_is_scored_in_the_real_env():
    from agents.robot import real_start_states
    from envs.robot import RealRT1Env
    from rlvr_gym.data.episodes import STATE_NAMES, info_state
    from rlvr_gym.data.robot import load_initial_states, real_initial_states
    from rlvr_gym.sim.robot import RT1WorldVectorEnv
    from rlvr_gym.train.state_dynamics import record_true_starts

    venv = RT1WorldVectorEnv(num_envs=2, checkpoint="rt1-dynamics", task="close_drawer")
    known = len(venv.sim.states)
    starts = real_start_states(2, "close_drawer", first=5)
    rows = venv.sim.add_starts(real_initial_states(starts))
    assert rows.tolist() == [known, known + 1] and len(venv.sim.states) == known + 2
    obs, infos = venv.reset(seed=0, options={"index": rows.tolist()})
    real = RealRT1Env(task="close_drawer")
    for i, (_, seed) in enumerate(starts):
        frame, info = real.reset(seed=seed)
        assert np.array_equal(obs[i], frame) and infos["initial_state"][i] == rows[i]
        predicted = [infos["predicted_state"][name][i] for name in STATE_NAMES]
        assert np.allclose(predicted, info_state(info), atol=1e-6), "the rollout starts from the true state"
    real.close()
    assert np.isfinite(venv.step(np.zeros((2, 7), np.float32))[4]["success_prob"]).all()
    venv.close()
    # The shipped start states' true states are the ones a reset at their seeds records.
    shipped = load_initial_states(SHIPPED_DIR / "rt1-dynamics").select(np.arange(3))
    recorded = record_true_starts(replace(shipped, states=None, targets=None))
    assert np.allclose(recorded.states, shipped.states, atol=1e-6) and np.allclose(recorded.targets, shipped.targets)


def test_gym_make_works_right_after_install_with_the_rlvr_model():
    env = gym.make("RLVRWorld-RT1-v0")
    check_env(env.unwrapped, skip_render_check=False)
    obs, info = env.reset(seed=3)
    assert obs.shape == (64, 64, 3) and obs.dtype == np.uint8
    frames = [env.step(np.zeros(7, np.float32))[0] for _ in range(2)]
    again = gym.make("RLVRWorld-RT1-v0")
    again.reset(seed=3)
    assert all(np.array_equal(a, again.step(np.zeros(7, np.float32))[0]) for a in frames), "same seed, same rollout"
    assert 0.0 <= env.step(np.zeros(7, np.float32))[4]["success_prob"] <= 1.0


@pytest.mark.parametrize("name", ["textgame-sft", "textgame-rlvr", "web-sft", "web-rlvr", "web-refit",
                                  "web-outcome"])
def test_shipped_language_world_models_are_small_fp16_with_start_states_and_a_card(name):
    path = SHIPPED_DIR / name
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    assert size <= 10 * 1024 * 1024, f"{name} is {size / 2**20:.2f} MiB; the budget is 10 MiB"
    card = (path / "CARD.md").read_text()
    for section in ("## Commands", "## Held-out metrics", "## Limits"):
        assert section in card
    starts = "textworld_start_states.json" if name.startswith("textgame") else "web_start_pages.json"
    assert (path / starts).is_file() and (path / "tokenizer.json").is_file()


@pytest.mark.parametrize("env_id", ["RLVRWorld-TextGame-v0", "RLVRWorld-Web-v0"])
def test_language_envs_work_right_after_install_with_the_rlvr_models(env_id):
    env = gym.make(env_id)
    obs, info = env.reset(seed=1)
    assert isinstance(obs, str) and obs and info["candidates"]
    steps = [env.step(info["candidates"][0])]
    again = gym.make(env_id)
    _, again_info = again.reset(seed=1)
    assert again.step(again_info["candidates"][0])[0] == steps[0][0], "same seed, same rollout"
    obs, reward, terminated, truncated, info = steps[0]
    assert isinstance(reward, float) and isinstance(terminated, bool) and "error" in info


@pytest.mark.parametrize("name", ["rt1-mle", "rt1-rlvr", "rt1-dynamics", "rt1-cotrained", "textgame-sft",
                                  "textgame-rlvr", "web-sft", "web-rlvr", "web-refit", "web-outcome"])
def test_every_shipped_checkpoint_records_its_real_env_and_loads_without_a_version_warning(name):
    domain = name.split("-")[0]
    record = read_real_env_versions(SHIPPED_DIR / name)
    assert record is not None and record["domain"] == domain
    assert set(record["trained_on"]) == set(REAL_ENV_PACKAGES[domain]) == set(record["scored_on"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the lock installs the major releases the shipped models learned
        check_real_env_versions(SHIPPED_DIR / name, domain)


def test_loading_a_checkpoint_of_another_major_release_warns_once(tmp_path):
    write_real_env_versions(tmp_path, "rt1")
    record = json.loads((tmp_path / REAL_ENV_FILE).read_text())
    installed = Version(record["trained_on"]["mujoco"])
    record["trained_on"]["mujoco"] = f"{installed.major + 1}.0.0"
    (tmp_path / REAL_ENV_FILE).write_text(json.dumps(record))
    with pytest.warns(RuntimeWarning, match=f"learned mujoco {installed.major + 1}.0.0.*requirements.lock"):
        check_real_env_versions(tmp_path, "rt1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_real_env_versions(tmp_path, "rt1")  # once per checkpoint
    (tmp_path / REAL_ENV_FILE).write_text("{corrupt")
    check_real_env_versions(tmp_path, "rt1")  # a checkpoint without a readable record loads as before


@pytest.mark.skipif(not browser_available(), reason="needs Debian's chromium and chromium-driver (make browser)")
def test_web_outcome_reads_which_button_click_button_asks_for():
    """Every button of web-outcome's click-button start pages clicked in real Chromium against the outcome its env
    takes from the shipped outcome head: the exploit probe's click-last-button among them."""
    head = OutcomeHead(SHIPPED_DIR / "web-outcome" / OUTCOME_DIR)
    assert head.model.dtype == torch.float32  # shipped in fp16, loaded in fp32
    assert WebWorldModel("web-outcome").outcome is not None and WebWorldModel("web-refit").outcome is None
    pages = [p for p in load_start_pages("web-outcome") if p.task == "click-button"]
    env = WebTaskEnv("click-button", max_steps=1)
    right, last_right = [], []
    try:
        for page in pages:
            buttons = [f"click [{n.id}]" for n in parse(page.tree) if n.role == "button"]
            predicted = head.predict(page.utterance, page.tree, buttons)
            for action, outcome in zip(buttons, predicted):
                utterance, tree, _ = env.reset(seed=page.seed)
                assert (utterance, tree) == (page.utterance, page.tree)
                _, reward, terminated, _ = env.step(action)[:4]
                right.append((outcome.done, task_done(outcome.reward)) == (terminated, task_done(reward)))
            last_right.append(right[-1])
    finally:
        env.close()
    assert all(last_right), last_right
    assert np.mean(right) >= 0.9, f"{sum(right)} of {len(right)} clicks"


def test_replayed_success_calls_of_a_world_with_state_dynamics_need_no_frame(tmp_path):
    from rlvr_gym.data.episodes import CollectConfig, collect, load_episodes
    from rlvr_gym.sim.robot import _Simulator, replay_success_scores, success_agreement

    data = collect(CollectConfig(out=str(tmp_path / "real"), episodes=4, seed=31, horizon=12,
                                 tasks=("open_drawer", "close_drawer"), skills=(1.0,), random_fraction=0.5))
    episodes = load_episodes(data)
    drawn, undrawn = (replay_success_scores(_Simulator.load("rt1-dynamics", None, 0.0, observation=observation),
                                            episodes) for observation in ("frame", "state"))
    assert np.allclose(drawn, undrawn, atol=1e-6), "success comes from the predicted state alone"
    calls = success_agreement("rt1-dynamics", episodes)
    assert sorted(calls) == ["close_drawer", "open_drawer"]
    assert sum(c["episodes"] for c in calls.values()) == 4
    assert sum(c["real_successes"] for c in calls.values()) == sum(e.succeeded for e in episodes)

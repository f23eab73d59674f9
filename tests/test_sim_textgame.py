import json
import shutil
import warnings
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import rlvr_gym  # noqa: F401  (registers the env ids)
from agents.textgame import RealTextWorldDiscreteEnv, evaluate_in_real, make_sim_env
from envs.textworld import TextWorldGame, in_uuid_order, make_game
from rlvr_gym.data.textgame import train_tokenizer
from rlvr_gym.domains.textgame import format_prompt, format_target, make_diff, parse_diff, rebuild, states_match
from rlvr_gym.files import content_fingerprint
from rlvr_gym.models.lm import CheckpointError, LlamaSize, build_llama
from rlvr_gym.sim.textgame import (
    CHARSET,
    COMMAND_VERBS,
    HELD_OUT_SEED,
    NOOP_COMMAND,
    SLOT_FEATURES,
    START_STATES,
    TextGameDiscreteEnv,
    TextGameDiscreteVectorEnv,
    TextGameWorldEnv,
    candidate_commands,
    command_features,
    command_for,
    discrete_spaces,
    encode_observation,
    load_start_states,
    open_real_game,
    render_state,
    write_start_states,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SEEDS = (HELD_OUT_SEED, HELD_OUT_SEED + 1)
SIZE = dict(nb_rooms=3, nb_objects=5, quest_length=3)


@pytest.fixture(scope="module")
def game_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("textworld_games")


@pytest.fixture(scope="module")
def start_file(tmp_path_factory, game_dir) -> Path:
    return write_start_states(tmp_path_factory.mktemp("starts"), SEEDS, **SIZE, game_dir=game_dir)


WIN_TARGET = '{"s":{"s":1,"g":true,"w":true}}'
"""The diff of a step that wins a game from score 0."""


def make_checkpoint(directory: Path, start_file: Path, train_steps: int = 0, target: str = "{}") -> Path:
    """A real, tiny Llama with a BPE tokenizer trained on the start states' prompts, beside the start states.

    Untrained (train_steps=0) it writes garbage; trained for a few steps on "{}" it predicts "no change", on
    WIN_TARGET that every step wins.
    """
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(start_file, directory / START_STATES)
    starts = json.loads(start_file.read_text())["start_states"]
    pairs = [(format_prompt(s["state"], c, s["objective"]), target)
             for s in starts for c in candidate_commands(s["state"])]
    tokenizer = train_tokenizer([p for p, _ in pairs] + [target] * 50, 1024)  # the target in a few tokens
    torch.manual_seed(0)
    model = build_llama(len(tokenizer), LlamaSize(hidden_size=32, layers=2, heads=2, intermediate_size=64, max_positions=1024), tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(train_steps):
        prompt, target = pairs[step % len(pairs)]
        p = [tokenizer.bos_token_id] + tokenizer(prompt, add_special_tokens=False)["input_ids"]
        y = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        loss = model(input_ids=torch.tensor([p + y]), labels=torch.tensor([[-100] * len(p) + y])).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def garbage_checkpoint(tmp_path_factory, start_file) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("garbage"), start_file)


@pytest.fixture(scope="module")
def no_change_checkpoint(tmp_path_factory, start_file) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("no_change"), start_file, train_steps=40)


@pytest.fixture(scope="module")
def always_win_checkpoint(tmp_path_factory, start_file) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("always_win"), start_file, train_steps=150, target=WIN_TARGET)


def quiet_check_env(env) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)


# ---------------------------------------------------------------------------------------------------- start states


def test_start_states_round_trip_to_the_real_games(start_file, garbage_checkpoint, game_dir):
    starts = load_start_states(garbage_checkpoint)
    assert [s.seed for s in starts] == list(SEEDS)
    for start in starts:
        assert (start.nb_rooms, start.nb_objects, start.quest_length) == tuple(SIZE.values())
        game = open_real_game(start, game_dir)
        try:
            assert states_match(game.state, start.state) and game.objective == start.objective
            for command in start.walkthrough:
                game.step(command)
            assert game.won and game.score == start.max_score > 0
        finally:
            game.close()


def test_missing_or_corrupt_start_states_raise_a_checkpoint_error(tmp_path, garbage_checkpoint):
    bare = tmp_path / "bare"
    shutil.copytree(garbage_checkpoint, bare)
    (bare / START_STATES).unlink()
    with pytest.raises(CheckpointError, match="write_start_states"):
        load_start_states(bare)
    (bare / START_STATES).write_text('{"start_states": [{"seed": 1}]}')
    with pytest.raises(CheckpointError, match="corrupt"):
        load_start_states(bare)


def test_open_real_game_refuses_a_game_that_differs_from_the_record(tmp_path, garbage_checkpoint, game_dir):
    start = load_start_states(garbage_checkpoint)[0]
    cached, other = (make_game(seed, game_dir, **SIZE) for seed in SEEDS)
    for suffix in (".z8", ".json"):  # a stale cache: another game under this start's file name
        shutil.copy(other.with_suffix(suffix), tmp_path / cached.with_suffix(suffix).name)
    with pytest.raises(RuntimeError, match="another game"):
        open_real_game(start, tmp_path)

# ---------------------------------------------------------------------------------------------------- candidates and views


def test_candidates_are_the_admissible_commands_along_real_episodes(game_dir):
    rng = np.random.default_rng(0)
    for seed in SEEDS:
        game = TextWorldGame(make_game(seed, game_dir, **SIZE))
        try:
            state = game.reset()
            for _ in range(20):
                assert candidate_commands(state) == sorted(set(game.admissible_commands))
                state, _, done = game.step(game.admissible_commands[rng.integers(len(game.admissible_commands))])
                if done:
                    break
        finally:
            game.close()


def test_candidates_follow_the_predicted_state(start_file):
    state = json.loads(start_file.read_text())["start_states"][0]["state"]
    agent = state["objects"][0]
    room = next(o for o in state["objects"] if agent["name"] in o["contains"])
    key = next(o for o in state["objects"] if o["type"] == "Key")
    box = next(o for o in state["objects"] if o["name"] == key["properties"]["unlocks"])
    label = key["name"].split(" (ID")[0]
    assert not any(label in c for c in candidate_commands(state) if c.startswith(("drop", "unlock")))

    # A predicted state in which the agent holds the key in the box's room: drop and unlock become possible.
    for o in state["objects"]:
        o["contains"] = [n for n in o["contains"] if n not in (key["name"], agent["name"], box["name"])]
    agent["contains"].append(key["name"])
    room["contains"] += [agent["name"], box["name"]]
    commands = candidate_commands(state)
    assert f"drop {label}" in commands
    assert f"unlock {box['name'].split(' (ID')[0]} with {label}" in commands
    assert candidate_commands({**state, "objects": [o for o in state["objects"] if o["type"] != "Agent"]}) == ["inventory", "look"]
    room["properties"]["connects"] = {"north": ["a list"], "up": room["name"]}  # what a model might write
    assert not any(c.startswith("go ") for c in candidate_commands(state))


def test_rendering_stays_in_the_observation_space_for_any_predicted_text(start_file):
    state = json.loads(start_file.read_text())["start_states"][0]["state"]
    state["objects"][1]["name"] = "caf\u00e9\tbox (ID: 1)"
    state["objects"][1]["properties"]["notes"] = "x" * 10_000
    text = render_state(state, "win \u2603")
    space = gym.spaces.Text(8192, min_length=0, charset=CHARSET)
    assert space.contains(text) and text.endswith("...")
    assert "caf?" in text and "win ?" in text


def test_observation_encoding_marks_candidates_and_tells_states_apart(start_file):
    first, second = (s["state"] for s in json.loads(start_file.read_text())["start_states"])
    a = encode_observation(first, "goal", candidate_commands(first), 0.5, obs_dim=384, max_candidates=16)
    b = encode_observation(second, "goal", candidate_commands(second), 0.5, obs_dim=384, max_candidates=16)
    bag = 384 - 16 * SLOT_FEATURES - 1
    assert a.shape == (384,) and a.dtype == np.float32 and a.min() >= 0 and a.max() <= 1
    slots = a[bag:-1].reshape(16, SLOT_FEATURES)
    assert slots[:, 0].sum() == min(len(candidate_commands(first)), 16) and a[-1] == 0.5
    assert not np.array_equal(a[:bag], b[:bag])
    np.testing.assert_array_equal(a, encode_observation(first, "goal", candidate_commands(first), 0.5, 384, 16))
    # Each slot says its command's verb and how its words meet the objective's.
    words = "first go east then take the red key from the table".split()
    east, key, look = (command_features(c, words) for c in ("go east", "take red key from table", "look"))
    assert east[1 + COMMAND_VERBS.index("go")] == 1 and east[-3] == 1.0 and east[-2] == words.index("east") / len(words)
    assert key[1 + COMMAND_VERBS.index("take")] == 1 and key[-3] == 1.0 and key[-2] == words.index("red") / len(words)
    assert look[-3] == 0.0 and look[-2] == 1.0 and look[-1] == 0.0
    # Commands sent before in the episode are marked, so a policy can tell a loop from progress.
    commands = candidate_commands(first)
    c = encode_observation(first, "goal", commands, 0.5, 384, 16, sent={commands[1]})
    marked = c[bag:-1].reshape(16, SLOT_FEATURES)[:, -1]
    assert marked[1] == 1 and marked.sum() == sum(commands[i % len(commands)] == commands[1] for i in range(16))
    with pytest.raises(ValueError, match="candidate slots"):
        discrete_spaces(max_candidates=16, obs_dim=16 * SLOT_FEATURES + 1)


# ---------------------------------------------------------------------------------------------------- learned env


def test_raw_env_passes_gymnasium_check_env(no_change_checkpoint):
    quiet_check_env(TextGameWorldEnv(no_change_checkpoint, max_steps=5))


def test_discrete_env_passes_gymnasium_and_sb3_check_env(no_change_checkpoint):
    env = TextGameDiscreteEnv(TextGameWorldEnv(no_change_checkpoint, max_steps=5), max_candidates=16, obs_dim=384)
    quiet_check_env(env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb3_check_env(env)


def test_gym_make_with_a_checkpoint_directory_renders_the_observation(no_change_checkpoint):
    env = gym.make("RLVRWorld-TextGame-v0", checkpoint=str(no_change_checkpoint), render_mode="ansi")
    obs, info = env.reset(seed=0, options={"index": 1})
    assert obs.startswith("Objective: ") and env.render() == obs
    assert info["game_seed"] == SEEDS[1] and info["start_index"] == 1
    with pytest.raises(ValueError, match="index"):
        env.reset(options={"index": 2})


def test_no_change_model_steps_candidates_until_max_steps(no_change_checkpoint):
    env = TextGameWorldEnv(no_change_checkpoint, max_steps=3)
    obs, info = env.reset(seed=0)
    start = info["state"]
    for step in range(1, 4):
        obs, reward, terminated, truncated, info = env.step(info["candidates"][step])
        assert info["error"] is None and info["completion"] == "{}" and reward == 0.0 and not terminated
        assert truncated == (step == 3) and info["step"] == step
        assert info["state"] == start and info["candidates"] == candidate_commands(start)


def test_uncertainty_is_the_least_likely_token_and_the_guard_halts_or_charges_for_it(no_change_checkpoint):
    env = TextGameWorldEnv(no_change_checkpoint)
    _, info = env.reset(seed=0)
    command = info["candidates"][0]
    _, reward, terminated, truncated, info = env.step(command)
    # The same number from the model's own forward pass over prompt and completion ("{}" and eos).
    sim = env.sim
    prompt = [sim.tokenizer.bos_token_id] + sim.tokenizer(
        format_prompt(env.rollout.start.state, command, env.rollout.start.objective), add_special_tokens=False)["input_ids"]
    completion = sim.tokenizer("{}", add_special_tokens=False)["input_ids"] + [sim.tokenizer.eos_token_id]
    with torch.no_grad():
        logits = sim.model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    surprisal = -logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
    assert info["uncertainty"] == pytest.approx(float(surprisal.max()), abs=1e-4) and info["uncertainty"] > 0
    assert not info["halted"] and reward == 0.0 and not terminated and not truncated
    u = info["uncertainty"]
    for halt, halted in ((u / 2, True), (2 * u + 1, False)):
        guarded = TextGameWorldEnv(no_change_checkpoint, halt_uncertainty=halt)
        _, info = guarded.reset(seed=0)
        _, reward, terminated, truncated, info = guarded.step(command)
        assert info["halted"] == halted and truncated == halted and not terminated and not info["is_success"]
    charged = TextGameWorldEnv(no_change_checkpoint, uncertainty_penalty=0.5)
    charged.reset(seed=0)
    assert charged.step(command)[1] == pytest.approx(-0.5 * u)
    vector = TextGameDiscreteVectorEnv(2, no_change_checkpoint, halt_uncertainty=u / 2)
    vector.reset(seed=[0, 0])
    *_, terminated, truncated, infos = vector.step(np.zeros(2, dtype=np.int64))
    assert infos["halted"].all() and truncated.all() and not terminated.any() and infos["uncertainty"].min() > 0
    for bad in (dict(uncertainty_penalty=-1.0), dict(halt_uncertainty=0.0)):
        with pytest.raises(ValueError, match="uncertainty"):
            TextGameWorldEnv(no_change_checkpoint, **bad)


def test_a_win_check_model_that_does_not_predict_the_win_halts_the_episode_unpaid(always_win_checkpoint,
                                                                                    no_change_checkpoint):
    env = TextGameWorldEnv(always_win_checkpoint)
    _, info = env.reset(seed=0)
    command = info["candidates"][0]
    _, reward, terminated, truncated, info = env.step(command)
    assert info["completion"] == WIN_TARGET and info["is_success"] and terminated and reward == 1.0
    # A second model that predicts the same win lets it stand; one that predicts no change ends the episode unpaid.
    for checker, stands in ((always_win_checkpoint, True), (no_change_checkpoint, False)):
        checked = TextGameWorldEnv(always_win_checkpoint, win_check=checker)
        checked.reset(seed=0)
        _, reward, terminated, truncated, info = checked.step(command)
        assert info["is_success"] == terminated == stands and info["halted"] == truncated == (not stands)
        assert reward == float(stands)
    # A step the first model does not call a win never asks the second.
    quiet = TextGameWorldEnv(no_change_checkpoint, win_check=always_win_checkpoint)
    quiet.reset(seed=0)
    quiet.sim.check_wins = lambda claimed: pytest.fail(f"asked the second model about {claimed}")
    assert not quiet.step(command)[4]["halted"]
    vector = TextGameDiscreteVectorEnv(2, always_win_checkpoint, win_check=no_change_checkpoint)
    vector.reset(seed=[0, 1])
    _, reward, terminated, truncated, infos = vector.step(np.zeros(2, dtype=np.int64))
    assert infos["halted"].all() and truncated.all() and not terminated.any() and (reward == 0).all()


def test_unparsable_output_truncates_with_the_error_and_keeps_the_state(garbage_checkpoint):
    env = TextGameWorldEnv(garbage_checkpoint, max_steps=30, max_new_tokens=16)
    obs, info = env.reset(seed=0)
    next_obs, reward, terminated, truncated, next_info = env.step(info["candidates"][0])
    assert truncated and not terminated and reward == 0.0
    assert isinstance(next_info["error"], str) and next_info["completion"] != ""
    assert next_info["state"] == info["state"] and next_obs == obs


def test_state_too_long_for_the_context_truncates(no_change_checkpoint):
    env = TextGameWorldEnv(no_change_checkpoint, max_new_tokens=1000)
    _, info = env.reset(seed=0)
    *_, terminated, truncated, info = env.step("look")
    assert truncated and not terminated and "context" in info["error"]


def test_same_seed_gives_the_same_sampled_rollout(garbage_checkpoint):
    def first_completion(seed: int) -> tuple[str, str]:
        env = TextGameWorldEnv(garbage_checkpoint, temperature=1.0, max_new_tokens=24)
        _, info = env.reset(seed=seed)
        obs, *_, info = env.step("go east")
        return obs, info["completion"]

    assert first_completion(3) == first_completion(3)
    assert len({first_completion(seed)[1] for seed in range(4)}) > 1


def test_discrete_actions_past_the_candidate_list_wrap_around(no_change_checkpoint):
    env = TextGameDiscreteEnv(TextGameWorldEnv(no_change_checkpoint, max_steps=5), max_candidates=32)
    obs, info = env.reset(seed=0)
    n = len(info["candidates"])
    assert env.action_masks().tolist() == [True] * n + [False] * (32 - n)
    # The slot of a wrapped-around index describes the command it sends, marked as a repeat.
    slots = obs[-1 - 32 * SLOT_FEATURES : -1].reshape(32, SLOT_FEATURES)
    np.testing.assert_array_equal(slots[n, 1:], slots[0, 1:])
    assert slots[n, 0] == 0 and slots[0, 0] == 1
    obs, *_, info = env.step(n + 1)
    assert info["command"] == info["candidates"][1]
    sent = obs[-1 - 32 * SLOT_FEATURES : -1].reshape(32, SLOT_FEATURES)[:, -1]
    assert sent[1] == 1 and sent[0] == 0  # the no-change model keeps the state, so slot 1 is the command just sent
    *_, info = env.step(0)
    assert info["command"] == info["candidates"][0]
    assert command_for(5, [], env.action_space) == NOOP_COMMAND
    with pytest.raises(ValueError, match="action"):
        env.step(32)


@pytest.mark.parametrize("checkpoint", ["no_change_checkpoint", "garbage_checkpoint"])
def test_vector_env_steps_as_the_single_envs_do(checkpoint, request):
    checkpoint = request.getfixturevalue(checkpoint)
    kwargs = dict(max_candidates=16, obs_dim=384)
    venv = TextGameDiscreteVectorEnv(3, checkpoint, max_steps=2, max_new_tokens=16, **kwargs)
    singles = [TextGameDiscreteEnv(TextGameWorldEnv(checkpoint, max_steps=2, max_new_tokens=16), **kwargs) for _ in range(3)]
    obs, infos = venv.reset(seed=5)
    firsts = [env.reset(seed=5 + i) for i, env in enumerate(singles)]
    np.testing.assert_array_equal(obs, np.stack([o for o, _ in firsts]))
    assert infos["start_index"].tolist() == [info["start_index"] for _, info in firsts]
    for actions in ([0, 1, 20 % 16], [2, 0, 1]):
        obs, rewards, terminated, truncated, infos = venv.step(np.array(actions))
        steps = [env.step(a) for env, a in zip(singles, actions)]
        np.testing.assert_array_equal(obs, np.stack([s[0] for s in steps]))
        assert rewards.tolist() == [s[1] for s in steps]
        assert terminated.tolist() == [s[2] for s in steps] and truncated.tolist() == [s[3] for s in steps]
        assert list(infos["error"]) == [s[4]["error"] for s in steps]
        if truncated.all():
            break
    assert truncated.all()  # max_steps (no change) or an unparsable output (garbage)
    obs, rewards, *_ = venv.step(np.zeros(3, dtype=np.int64))  # NEXT_STEP: the ended sub-envs start over
    assert (obs[:, -1] == 0).all() and not rewards.any()
    assert venv.action_masks().shape == (3, 16)
    with pytest.raises(ValueError, match="ints in"):
        venv.step(np.array([0, 1, 16]))


def test_an_sb3_model_trains_in_the_vector_env(no_change_checkpoint):
    from gymnasium.vector import AutoresetMode
    from stable_baselines3 import DQN

    from rlvr_gym.sim.sb3 import SB3VecEnv

    venv = SB3VecEnv(TextGameDiscreteVectorEnv(4, no_change_checkpoint, max_steps=3, autoreset_mode=AutoresetMode.DISABLED))
    model = DQN("MlpPolicy", venv, learning_starts=8, buffer_size=64, train_freq=2, seed=0).learn(24)
    assert model.num_timesteps >= 24


# ---------------------------------------------------------------------------------------------------- real counterpart


def test_a_correct_prediction_gives_the_model_the_real_next_prompt(game_dir):
    # The simulator rebuilds each next state from the model's diff; a diff that is right must leave the next prompt
    # exactly as the real game's, contents order included, or later steps are predicted from prompts unlike any real one.
    rng = np.random.default_rng(1)
    reordered = 0
    for seed in SEEDS:
        game = TextWorldGame(make_game(seed, game_dir, **SIZE))
        try:
            state = game.reset()
            for _ in range(25):
                command = game.admissible_commands[rng.integers(len(game.admissible_commands))]
                next_state, _, done = game.step(command)
                diff, error = parse_diff(format_target(make_diff(state, next_state)), state)
                assert error is None
                rebuilt = rebuild(state, diff)
                reordered += rebuilt != next_state
                assert in_uuid_order(rebuilt) == next_state
                assert format_prompt(in_uuid_order(rebuilt), "look", "q") == format_prompt(next_state, "look", "q")
                state = next_state
                if done:
                    break
        finally:
            game.close()
    assert reordered  # taking and dropping things reorders contents, so the walk has exercised the ordering


def test_real_env_starts_where_the_sim_does_and_plays_the_walkthrough(no_change_checkpoint, game_dir):
    real = RealTextWorldDiscreteEnv(no_change_checkpoint, max_steps=10, game_dir=game_dir)
    sim = make_sim_env(no_change_checkpoint, seed=0)
    try:
        for seed in range(3):
            _, real_info = real.reset(seed=seed)
            _, sim_info = sim.reset(seed=seed)
            assert real_info["start_index"] == sim_info["start_index"]
            assert states_match(real_info["state"], sim_info["state"])
        obs, info = real.reset(options={"index": 0})
        sim_obs, _ = sim.reset(options={"index": 0})
        np.testing.assert_array_equal(obs, sim_obs)  # one encoding for both envs
        total, terminated = 0.0, False
        for command in real.starts[0].walkthrough:
            assert not terminated
            obs, reward, terminated, truncated, info = real.step(info["candidates"].index(command))
            assert info["command"] == command and obs in real.observation_space
            total += reward
        assert terminated and not truncated and info["is_success"] and total == real.starts[0].max_score
    finally:
        real.close()


def test_evaluate_in_real_scores_the_walkthrough_and_a_do_nothing_policy(no_change_checkpoint, game_dir):
    starts = load_start_states(no_change_checkpoint)

    def walkthrough(obs, info) -> int:
        plan = starts[info["start_index"]].walkthrough
        return info["candidates"].index(plan[info["step"]])

    result = evaluate_in_real(walkthrough, no_change_checkpoint, episodes=2, seed=0, game_dir=game_dir)
    order = np.random.default_rng(0).permutation(len(starts))[:2]
    assert result == {"success_rate": 1.0, "mean_return": np.mean([s.max_score for s in starts]),
                      "mean_length": np.mean([len(starts[i].walkthrough) for i in order]), "episodes": 2}
    idle = evaluate_in_real(lambda obs, info: 31, no_change_checkpoint, episodes=1, seed=0, max_steps=3, game_dir=game_dir)
    assert idle == {"success_rate": 0.0, "mean_return": 0.0, "mean_length": 3.0, "episodes": 1}


def test_an_sb3_model_trained_in_the_sim_is_scored_in_real(no_change_checkpoint, game_dir):
    from stable_baselines3 import DQN

    env = make_sim_env(no_change_checkpoint, seed=0, max_steps=4)
    model = DQN("MlpPolicy", env, learning_starts=8, buffer_size=64, train_freq=4, seed=0).learn(24)
    result = evaluate_in_real(model, no_change_checkpoint, episodes=2, seed=0, max_steps=4, game_dir=game_dir)
    assert result["episodes"] == 2 and 0.0 <= result["success_rate"] <= 1.0 and result["mean_return"] >= 0.0


def test_cotraining_in_the_text_game_refits_on_the_agents_real_transitions(no_change_checkpoint, tmp_path,
                                                                             monkeypatch):
    import gzip

    from agents import cotrain
    from rlvr_gym.models.lm import load_model

    monkeypatch.chdir(tmp_path)  # the real games compile into ./runs/textworld_games
    config = cotrain.CoTrainConfig(out=str(tmp_path / "run"), env=cotrain.TEXT_ENV, algo="dqn",
                                   checkpoint=str(no_change_checkpoint), rounds=1, real_steps=6, eval_episodes=2,
                                   sim_steps=16, num_envs=2, horizon=3, mle_steps=2, grpo_steps=1, real_updates=True)
    first = cotrain.run_cotrain(config)
    with gzip.open(tmp_path / "run" / "round_00" / "real" / "transitions.jsonl.gz", "rt") as f:
        records = [json.loads(line) for line in f]
    assert len(records) >= 6 and all({"current_state", "action_state", "next_score_state"} <= set(r) for r in records)
    # The same steps as the agent saw them, which it learned from too (`real_updates`).
    seen = np.load(tmp_path / "run" / "round_00" / "real" / cotrain.AGENT_TRANSITIONS)
    assert len(seen["action"]) == len(records) and seen["obs"].shape == seen["next_obs"].shape
    starts = load_start_states(no_change_checkpoint)
    assert {r["current_state"]["taskDesc"] for r in records} <= {s.objective for s in starts}
    assert len(records) < first["real_steps_total"] <= len(records) + 2 * 3  # the two scoring episodes count too
    assert 0 <= first["real_success"] <= 1 and 0 <= first["learned_success"] <= 1 and first["agent_steps"] >= 16
    # The refitted world model (SFT then GRPO) moved, and its simulator starts from the same real games.
    assert load_start_states(first["world"]) == starts and "rlvr" in first["world"]
    before, after = load_model(no_change_checkpoint)[0].state_dict(), load_model(first["world"])[0].state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert (tmp_path / "run" / "replay_buffer.pkl").is_file()
    second = cotrain.run_cotrain(replace(config, rounds=2))  # resumed: the agent and its replay buffer reloaded
    assert second["round"] == 1 and second["agent_steps"] >= 32 and second["real_steps_total"] > first["real_steps_total"]
    with pytest.raises(ValueError, match="does not fit"):
        cotrain.run_cotrain(cotrain.CoTrainConfig(out=str(tmp_path / "x"), env=cotrain.RT1_ENV, algo="dqn"))
    with pytest.raises(ValueError, match="text games takes --algo dqn"):
        cotrain.run_cotrain(cotrain.CoTrainConfig(out=str(tmp_path / "x"), env=cotrain.TEXT_ENV, algo="ppo",
                                                  real_updates=True))


def test_pretraining_in_the_starting_sim_takes_no_real_steps_and_a_kill_after_it_keeps_it(no_change_checkpoint,
                                                                                          tmp_path, monkeypatch):
    from agents import cotrain

    monkeypatch.chdir(tmp_path)
    config = cotrain.CoTrainConfig(out=str(tmp_path / "run"), env=cotrain.TEXT_ENV, algo="dqn",
                                   checkpoint=str(no_change_checkpoint), rounds=1, real_steps=4, eval_episodes=1,
                                   sim_steps=16, num_envs=2, horizon=3, mle_steps=1, grpo_steps=0, pretrain_steps=24)

    def killed(*_):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(cotrain, "collect_text", killed)
        with pytest.raises(KeyboardInterrupt):
            cotrain.run_cotrain(config)
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["phase"] == "collect" and state["real_steps_total"] == 0
    assert (tmp_path / "run" / "pretrain" / "agent.zip").is_file()
    record = cotrain.run_cotrain(config)  # resumed after the pretraining, which is not run again
    assert record["agent_steps"] == 24 + 16
    with pytest.raises(ValueError, match="pretrain-steps"):
        cotrain.run_cotrain(replace(config, out=str(tmp_path / "x"), pretrain_steps=-1))


def test_pretraining_in_another_simulator_then_the_loop_goes_on_in_the_starting_one(no_change_checkpoint, tmp_path,
                                                                                    monkeypatch):
    from agents import cotrain

    monkeypatch.chdir(tmp_path)
    other = shutil.copytree(no_change_checkpoint, tmp_path / "other")
    made = []
    make_sim_env = cotrain.make_sim_env
    monkeypatch.setattr(cotrain, "make_sim_env", lambda config, world: made.append(world) or make_sim_env(config, world))
    config = cotrain.CoTrainConfig(out=str(tmp_path / "run"), env=cotrain.TEXT_ENV, algo="dqn",
                                   checkpoint=str(no_change_checkpoint), rounds=1, real_steps=4, eval_episodes=1,
                                   sim_steps=16, num_envs=2, horizon=3, mle_steps=1, grpo_steps=0, pretrain_steps=24,
                                   pretrain_checkpoint=str(other))
    record = cotrain.run_cotrain(config)
    # the agent's env, the pretraining's, then the round's refitted model's
    assert made[:2] == [str(no_change_checkpoint), str(other)] and "round_00" in made[2]
    assert record["agent_steps"] == 24 + 16
    with pytest.raises(ValueError, match="give --pretrain-steps"):
        cotrain.run_cotrain(replace(config, out=str(tmp_path / "x"), pretrain_steps=0))
    with pytest.raises(CheckpointError, match="neither a directory nor a shipped name"):
        cotrain.run_cotrain(replace(config, out=str(tmp_path / "y"), pretrain_checkpoint=str(tmp_path / "missing")))
    assert not (tmp_path / "y" / "state.json").exists()


def test_score_data_scores_before_round_0_and_every_scoring_feeds_the_next_refit(no_change_checkpoint, tmp_path,
                                                                                 monkeypatch):
    import gzip

    from stable_baselines3 import DQN

    from agents import cotrain

    monkeypatch.chdir(tmp_path)
    config = cotrain.CoTrainConfig(out=str(tmp_path / "run"), env=cotrain.TEXT_ENV, algo="dqn",
                                   checkpoint=str(no_change_checkpoint), rounds=1, real_steps=0, eval_episodes=2,
                                   sim_steps=16, num_envs=2, horizon=3, mle_steps=1, grpo_steps=1, real_updates=True,
                                   score_data=True)
    last = cotrain.run_cotrain(config)

    def records(path: Path) -> list[dict]:
        with gzip.open(path / "transitions.jsonl.gz", "rt") as f:
            return [json.loads(line) for line in f]

    run = tmp_path / "run"
    start, round_0 = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    assert (start["round"], round_0["round"]) == (-1, 0) and round_0 == last
    scored = records(run / "start" / "score")
    # Scoring takes the only real steps (none collected), each recorded, and round 0's refit fitted them all.
    assert len(scored) == start["real_steps_total"] and records(run / "round_00" / "real") == []
    assert records(run / "round_00" / "seen") == scored == records(run / "round_00" / "newest")
    assert last["real_steps_total"] == start["real_steps_total"] + len(records(run / "round_00" / "score"))
    assert len(np.load(run / "start" / "score" / cotrain.AGENT_TRANSITIONS)["action"]) == len(scored)
    # A recorded scoring plays the very episodes `score_in_real` plays.
    agent = DQN.load(run / "agent.zip", device="cpu")
    assert cotrain.score_text(agent, config, last["world"], tmp_path / "again") == \
        cotrain.score_in_real(agent, config, last["world"])
    with pytest.raises(ValueError, match="real-steps"):
        cotrain.run_cotrain(replace(config, out=str(tmp_path / "x"), score_data=False))


def test_with_score_data_the_real_env_dqn_learns_from_its_scorings_too(no_change_checkpoint, tmp_path, monkeypatch):
    from agents import cotrain
    from bench.sim_to_real import RealScoring, real_env

    monkeypatch.chdir(tmp_path)
    config = cotrain.CoTrainConfig(env=cotrain.TEXT_ENV, algo="dqn", checkpoint=str(no_change_checkpoint),
                                   eval_episodes=2, sim_steps=16, horizon=3, score_data=True)
    agent = cotrain.new_agent(config, real_env(config))
    scoring = RealScoring(every=4, config=config, agents=tmp_path / "agents")
    agent.learn(8, callback=scoring)
    scoring_steps = scoring.points[-1]["real_steps_total"] - 8
    assert len(scoring.points) == 2 and scoring_steps >= 2
    # Its replay buffer holds its own 8 steps and every scoring step.
    assert agent.replay_buffer.size() == 8 + scoring_steps
    # Each point keeps the agent it scored: the last one before it learned from that scoring's episodes.
    from stable_baselines3 import DQN

    scored = DQN.load(tmp_path / "agents" / "point1.zip", device="cpu")
    assert (tmp_path / "agents" / "point0.zip").is_file()
    assert scored.num_timesteps == 8 and 0 < scored._n_updates < agent._n_updates


def test_the_text_refit_repeats_the_steps_that_win_up_to_win_share():
    from agents import cotrain
    from rlvr_gym.domains.textgame import wins
    from rlvr_gym.train.textgame import weight_toward

    def record(won_before: bool, won_after: bool) -> dict:
        return {"current_score_state": {"score": 0, "gameOver": won_before, "gameWon": won_before},
                "next_score_state": {"score": 1, "gameOver": won_after, "gameWon": won_after}}

    def record_wins(r: dict) -> bool:  # as the refit reads a record
        return wins(r["current_score_state"], r["next_score_state"])

    records = [record(False, True)] + [record(False, False)] * 18 + [record(True, True)]  # the last: won already
    assert [record_wins(r) for r in records] == [True] + [False] * 19
    mix = weight_toward(records, [record_wins(r) for r in records], 0.2)
    assert sum(map(record_wins, mix)) / len(mix) >= 0.2 and sum(map(record_wins, mix)) == 5
    with pytest.raises(ValueError, match="win-share"):
        cotrain.run_cotrain(cotrain.CoTrainConfig(env=cotrain.TEXT_ENV, algo="dqn", win_share=1.0))


def test_real_updates_put_the_real_transitions_in_the_replay_buffer_and_train_on_them(no_change_checkpoint, tmp_path):
    from stable_baselines3 import DQN

    from agents import cotrain
    from agents.textgame import SlotDQNPolicy

    env = make_sim_env(no_change_checkpoint, seed=0, max_steps=4)
    agent = DQN(SlotDQNPolicy, env, learning_starts=8, buffer_size=64, batch_size=4, seed=0)
    obs_dim = env.observation_space.shape[0]
    rng = np.random.default_rng(0)
    n = 7
    path = tmp_path / cotrain.AGENT_TRANSITIONS
    np.savez(path, obs=rng.random((n, obs_dim), dtype=np.float32), next_obs=rng.random((n, obs_dim), dtype=np.float32),
             action=rng.integers(0, env.action_space.n, n), reward=rng.random(n), terminated=np.arange(n) == 3,
             truncated=np.arange(n) == 6)
    before = {k: v.clone() for k, v in agent.q_net.state_dict().items()}
    assert cotrain.learn_from_real(agent, path) == n
    assert agent.replay_buffer.size() == n
    # An episode cut by the time limit ends, and is bootstrapped: SB3 keeps it as a timeout.
    np.testing.assert_array_equal(agent.replay_buffer.dones[:n, 0], np.isin(np.arange(n), [3, 6]))
    np.testing.assert_array_equal(agent.replay_buffer.timeouts[:n, 0], np.arange(n) == 6)
    after = agent.q_net.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(after[k], agent.q_net_target.state_dict()[k]) for k in after)


def test_slot_q_network_scores_every_action_slot_with_the_same_weights(no_change_checkpoint):
    from stable_baselines3 import DQN

    from agents.textgame import SlotDQNPolicy, SlotScorer

    scorer = SlotScorer(features_dim=384, slots=16, width=8)
    x = torch.rand(2, 384)
    q = scorer(x)
    assert q.shape == (2, 16)
    # Swapping two slots' features swaps their Q-values: the score depends on what a slot says, not where it is.
    bag = 384 - 16 * SLOT_FEATURES - 1
    swapped = x.clone()
    first, third = slice(bag, bag + SLOT_FEATURES), slice(bag + 2 * SLOT_FEATURES, bag + 3 * SLOT_FEATURES)
    swapped[:, first], swapped[:, third] = x[:, third], x[:, first]
    torch.testing.assert_close(scorer(swapped)[:, [2, 1, 0]], q[:, :3])
    with pytest.raises(ValueError, match="no room"):
        SlotScorer(features_dim=16 * SLOT_FEATURES + 1, slots=16, width=8)
    env = make_sim_env(no_change_checkpoint, seed=0, max_steps=4)
    model = DQN(SlotDQNPolicy, env, learning_starts=8, buffer_size=64, train_freq=4, seed=0).learn(16)
    assert isinstance(model.q_net.q_net, SlotScorer) and model.predict(env.reset()[0])[0] in range(32)


def test_slot_actor_critic_ranks_slots_by_what_they_say_and_values_the_state_alone(no_change_checkpoint, tmp_path):
    from stable_baselines3 import PPO

    from agents.textgame import SlotActorCriticPolicy, SlotScorer

    env = make_sim_env(no_change_checkpoint, seed=0, max_steps=4)
    model = PPO(SlotActorCriticPolicy, env, n_steps=16, batch_size=16, n_epochs=2, seed=0, device="cpu")
    policy = model.policy
    assert isinstance(policy.action_net, SlotScorer)
    x = torch.as_tensor(np.stack([env.reset(seed=s)[0] for s in (0, 1)]))
    n, bag = env.action_space.n, x.shape[1] - env.action_space.n * SLOT_FEATURES - 1
    swapped = x.clone()
    first, third = slice(bag, bag + SLOT_FEATURES), slice(bag + 2 * SLOT_FEATURES, bag + 3 * SLOT_FEATURES)
    swapped[:, first], swapped[:, third] = x[:, third], x[:, first]
    with torch.no_grad():
        probs = policy.get_distribution(x).distribution.probs
        probs_swapped = policy.get_distribution(swapped).distribution.probs
        # A fresh policy is near uniform over the slots, as SB3's own is.
        assert probs.shape == (2, n) and float((probs - 1 / n).abs().max()) < 0.02
        torch.testing.assert_close(probs_swapped[:, [2, 1, 0]], probs[:, :3])
        torch.testing.assert_close(policy.predict_values(swapped), policy.predict_values(x))
    before = [p.clone() for p in policy.action_net.parameters()]
    model.learn(32)
    assert any(not torch.equal(b, p) for b, p in zip(before, policy.action_net.parameters()))
    model.save(tmp_path / "agent.zip")
    loaded = PPO.load(tmp_path / "agent.zip", device="cpu")
    assert isinstance(loaded.policy, SlotActorCriticPolicy)
    obs = x[0].numpy()
    assert loaded.predict(obs, deterministic=True)[0] == model.predict(obs, deterministic=True)[0]
    # Every text PPO agent gets it: the co-training loop's and train_sb3's; the tabletop keeps SB3's MlpPolicy.
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents import cotrain, train_sb3

    text_loop = cotrain.CoTrainConfig(env=cotrain.TEXT_ENV, algo="ppo", n_steps=16, sim_steps=16)
    assert isinstance(cotrain.new_agent(text_loop, DummyVecEnv([lambda: env])).policy, SlotActorCriticPolicy)
    assert cotrain.ppo_policy(cotrain.RT1_ENV) == "MlpPolicy"
    args = train_sb3.Args(env=train_sb3.TEXT_ENV, algo="ppo", n_steps=16, batch_size=16)
    assert isinstance(train_sb3.make_model(args, env).policy, SlotActorCriticPolicy)


def test_record_play_writes_each_agents_real_games_as_refit_data_and_resumes(no_change_checkpoint, tmp_path,
                                                                            monkeypatch):
    import gzip

    from stable_baselines3 import DQN

    from agents import cotrain

    monkeypatch.chdir(tmp_path)  # the real games compile into ./runs/textworld_games
    env = make_sim_env(no_change_checkpoint, seed=0, max_steps=3)
    paths = []
    for seed in (0, 1):
        DQN("MlpPolicy", env, learning_starts=8, buffer_size=64, seed=seed).learn(8).save(tmp_path / f"a{seed}.zip")
        paths.append(str(tmp_path / f"a{seed}.zip"))
    config = cotrain.RecordPlayConfig(agents=tuple(paths), out=str(tmp_path / "play"), world=str(no_change_checkpoint),
                                      episodes_per_game=2, exploration=0.5, horizon=3)
    result = cotrain.record_play(config)
    with gzip.open(tmp_path / "play" / "transitions.jsonl.gz", "rt") as f:
        records = [json.loads(line) for line in f]
    starts = load_start_states(no_change_checkpoint)
    # Two agents x two episodes x each game, at most three steps each; every record from one of the real games.
    assert result["transitions"] == len(records) and 2 * 2 * len(starts) <= len(records) <= 2 * 2 * len(starts) * 3
    assert {r["current_state"]["taskDesc"] for r in records} == {s.objective for s in starts}
    assert all({"current_state", "action_state", "next_score_state"} <= set(r) for r in records)
    assert len(result["win_rate"]) == 2 and all(0 <= w <= 1 for w in result["win_rate"])
    # A rerun reads the recorded agents instead of playing them again.
    stamp = (tmp_path / "play" / "agent_00" / "transitions.jsonl.gz").stat().st_mtime_ns
    assert cotrain.record_play(config) == result
    assert (tmp_path / "play" / "agent_00" / "transitions.jsonl.gz").stat().st_mtime_ns == stamp
    # Other settings play again.
    assert cotrain.record_play(replace(config, episodes_per_game=1))["transitions"] < len(records)
    with pytest.raises(FileNotFoundError, match="no saved agent"):
        cotrain.record_play(replace(config, agents=(str(tmp_path / "missing.zip"),)))
    # `random` plays uniformly random candidates without a saved agent, whatever the exploration asked.
    random_play = replace(config, agents=("random",), out=str(tmp_path / "random"), exploration=0.0)
    assert cotrain.record_play(random_play)["transitions"] >= len(starts) * 2
    assert json.loads((tmp_path / "random" / "agent_00" / "wins.json").read_text())["exploration"] == 1.0
    with gzip.open(tmp_path / "random" / "transitions.jsonl.gz", "rt") as f:
        commands = {json.loads(line)["action_state"]["lastAction"] for line in f}
    assert len(commands) > 1
    with pytest.raises(ValueError, match="at least one"):
        cotrain.record_play(replace(config, agents=()))


def test_the_paid_bench_scores_agents_in_the_real_games_and_each_simulator_and_caches(no_change_checkpoint, tmp_path,
                                                                                     monkeypatch):
    from stable_baselines3 import DQN

    from bench import text_agents_paid

    monkeypatch.chdir(tmp_path)
    env = make_sim_env(no_change_checkpoint, seed=0, max_steps=3)
    agent = tmp_path / "a.zip"
    DQN("MlpPolicy", env, learning_starts=8, buffer_size=64, seed=0).learn(8).save(agent)
    other = tmp_path / "copy"
    shutil.copytree(no_change_checkpoint, other)
    names = [str(no_change_checkpoint), str(other)]
    result = text_agents_paid.paid([agent], names, episodes=2, seed=0, cache=tmp_path / "cache")
    row = result["rows"][0]
    real = evaluate_in_real(DQN.load(agent), no_change_checkpoint, episodes=2, seed=0)["success_rate"]
    # A do-nothing world model never predicts a win; the two copies of it pay the same.
    assert row["real"] == real and row[names[0]] == row[names[1]] == 0.0
    summary = {s["simulator"]: s for s in result["summary"]}
    assert summary[names[0]]["learned - real"] == -real and summary[names[0]]["within 10 points"].endswith("of 1")
    # Cached: a rerun plays nothing; a changed simulator is played again.
    monkeypatch.setattr(text_agents_paid, "learned_success", lambda *a: pytest.fail("replayed a cached simulator"))
    assert text_agents_paid.paid([agent], names, 2, 0, tmp_path / "cache")["rows"] == result["rows"]
    # A copy elsewhere (a fresh clone: new paths and mtimes) is the same simulator; new weights are not.
    moved = tmp_path / "moved"
    shutil.copytree(other, moved)
    assert content_fingerprint(moved) == content_fingerprint(other)
    (moved / "CARD.md").write_text("# An edited card\n")
    assert content_fingerprint(moved) == content_fingerprint(other), "the card is prose, not the simulator"
    weights = next(other.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 1]))
    monkeypatch.setattr(text_agents_paid, "learned_success", lambda *a: 0.5)
    assert text_agents_paid.paid([agent], names, 2, 0, tmp_path / "cache")["rows"][0][names[1]] == 0.5
    text_agents_paid.write_report(result, names, tmp_path)
    assert "learned - real" in (tmp_path / "text_agents_paid.md").read_text()

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_sim_textgame import game_dir, garbage_checkpoint, no_change_checkpoint, start_file  # noqa: F401

from envs.textworld import make_game, play_episode, walkthrough
from rlvr_gym.data.textgame import train_tokenizer
from rlvr_gym.domains.textgame import format_prompt, format_target, make_diff
from rlvr_gym.evaluation.textgame_policies import (
    PlanPolicy,
    TextGamePolicyEvalConfig,
    policy_name,
    run_textgame_policy_eval,
)
from rlvr_gym.models.lm import LlamaSize, build_llama
from rlvr_gym.models.sampler import sample_texts
from rlvr_gym.sim.textgame import HELD_OUT_SEED, NOOP_COMMAND, candidate_commands, write_start_states

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# A one-room game whose quest is one command ("drop hat").
ONE_STEP_GAME = dict(seed=HELD_OUT_SEED + 1, nb_rooms=1, nb_objects=2, quest_length=1)


@pytest.fixture(scope="module")
def winning_checkpoint(tmp_path_factory, game_dir) -> Path:
    """A tiny Llama that memorised the one-step game's winning transition for every candidate command: from the
    start state it predicts the win whatever the policy does."""
    size = {k: v for k, v in ONE_STEP_GAME.items() if k != "seed"}
    directory = tmp_path_factory.mktemp("winning")
    start_file = write_start_states(directory, [ONE_STEP_GAME["seed"]], **size, game_dir=game_dir)
    t = next(play_episode(make_game(ONE_STEP_GAME["seed"], game_dir, **size), walkthrough, 0, 1))
    assert t.won
    target = format_target(make_diff(t.state, t.next_state))
    objective = json.loads(start_file.read_text())["start_states"][0]["objective"]
    prompts = [format_prompt(t.state, c, objective) for c in candidate_commands(t.state)]
    tokenizer = train_tokenizer(prompts + [target], 1024)
    torch.manual_seed(0)
    model = build_llama(len(tokenizer), LlamaSize(hidden_size=32, layers=2, heads=2, intermediate_size=64, max_positions=1024), tokenizer)
    p = [[tokenizer.bos_token_id] + ids for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    y = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    width = max(map(len, p)) + len(y)
    ids = torch.tensor([x + y + [0] * (width - len(x) - len(y)) for x in p])
    labels = torch.tensor([[-100] * len(x) + y + [-100] * (width - len(x) - len(y)) for x in p])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(300):
        loss = model(input_ids=ids, attention_mask=(labels != -100) | (torch.arange(width) < torch.tensor([[len(x)] for x in p])),
                     labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 9:
            model.eval()
            if all(out == [target] for out in sample_texts(model, tokenizer, p, max_new_tokens=len(y) + 8)):
                break
            model.train()
    else:
        pytest.fail("the tiny model did not memorise the winning transition in 300 steps")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_plan_policy_follows_the_plan_then_picks_candidates():
    rng = np.random.default_rng(0)
    policy = PlanPolicy(["go east", "take key"], 0.0, rng)
    assert [policy(["look", "wait"]) for _ in range(2)] == ["go east", "take key"]
    assert {policy(["look", "wait"]) for _ in range(20)} == {"look", "wait"}
    assert policy([]) == NOOP_COMMAND
    random = PlanPolicy(["go east"], 1.0, np.random.default_rng(0))
    assert "go east" not in {random(["look", "wait"]) for _ in range(20)}
    assert [policy_name(p) for p in (0.0, 0.4, 1.0)] == ["walkthrough", "noisy-walkthrough-0.4", "random"]


def test_two_policy_ladder_scores_real_and_learned_envs(no_change_checkpoint, game_dir):
    config = TextGamePolicyEvalConfig(checkpoint=str(no_change_checkpoint), episodes=1, noise_levels=(0.0, 1.0),
                                      max_steps=4, game_dir=str(game_dir))
    result = run_textgame_policy_eval(config)
    assert result["policies"] == ["walkthrough", "random"]
    assert result["real_success"][0] == 1.0 and result["real_return"][0] > 0
    # A model that always predicts "no change" never sees the game won, and never fails to parse.
    assert result["sim_success"] == [0.0, 0.0] and result["sim_return"] == [0.0, 0.0]
    assert result["sim_error_rate"] == [0.0, 0.0]
    assert result["mae"] == pytest.approx(np.mean(result["real_success"]))
    assert {"pearson", "mmrv"} <= result.keys()


def test_success_in_the_learned_env_is_the_predicted_win(winning_checkpoint, game_dir):
    config = TextGamePolicyEvalConfig(checkpoint=str(winning_checkpoint), episodes=2, noise_levels=(0.0, 1.0),
                                      max_steps=1, game_dir=str(game_dir))
    result = run_textgame_policy_eval(config)
    # The model predicts the win after any first command; the real game is won by the quest's command only.
    assert result["sim_success"] == [1.0, 1.0] and result["sim_return"] == [1.0, 1.0]
    assert result["real_success"][0] == 1.0
    assert result["mae"] == pytest.approx(np.mean([1.0 - r for r in result["real_success"]]))


def test_unparsable_predictions_count_as_errors_and_failures(garbage_checkpoint, game_dir):
    config = TextGamePolicyEvalConfig(checkpoint=str(garbage_checkpoint), episodes=2, noise_levels=(0.0, 0.5),
                                      max_steps=4, max_new_tokens=8, game_dir=str(game_dir))
    result = run_textgame_policy_eval(config)
    assert result["sim_error_rate"] == [1.0, 1.0] and result["sim_success"] == [0.0, 0.0]


def test_a_ladder_needs_two_noise_levels_in_range():
    with pytest.raises(ValueError, match="noise_levels"):
        run_textgame_policy_eval(TextGamePolicyEvalConfig(noise_levels=(0.0,)))
    with pytest.raises(ValueError, match="noise_levels"):
        run_textgame_policy_eval(TextGamePolicyEvalConfig(noise_levels=(0.0, 1.5)))


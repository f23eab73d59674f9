import math

import pytest
import torch

from rlvr_gym.models.lm import LlamaSize, build_llama
from rlvr_gym.train.batch import pack_batch, token_logprobs
from rlvr_gym.train.grpo import aggregate, group_advantages, k3_kl, policy_loss_terms, score_completions


def test_group_advantages_normalise_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, group_size=4)
    std = torch.tensor([1.0, 0.0, 0.0, 0.0]).std()
    torch.testing.assert_close(adv[:4], (torch.tensor([1.0, 0, 0, 0]) - 0.25) / (std + 1e-4))
    assert adv[4:].abs().max() == 0, "a group with equal rewards carries no signal"
    torch.testing.assert_close(group_advantages(rewards, 4, scale=False)[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(rewards, 3)


def test_a_greedy_baseline_replaces_the_group_mean():
    rewards = torch.tensor([1.0, 0.0, 2.0, 2.0])
    baseline = torch.tensor([1.0, 0.0])  # the greedy completion's reward, one per group
    diffs = torch.tensor([0.0, -1.0, 2.0, 2.0])
    torch.testing.assert_close(group_advantages(rewards, 2, scale=False, baseline=baseline), diffs)
    # The second group's samples tie but beat greedy: the batch-wide std keeps their advantage finite and positive.
    torch.testing.assert_close(group_advantages(rewards, 2, baseline=baseline), diffs / (diffs.std() + 1e-4))
    with pytest.raises(ValueError, match="one value per group"):
        group_advantages(rewards, 2, baseline=torch.zeros(3))


def test_k3_is_zero_at_equal_policies_and_positive_otherwise():
    logp = torch.tensor([-1.0, -2.0])
    assert torch.equal(k3_kl(logp, logp), torch.zeros(2))
    ref = torch.tensor([-1.5, -1.0])
    d = ref - logp
    torch.testing.assert_close(k3_kl(logp, ref), d.exp() - d - 1)
    assert (k3_kl(logp, ref) > 0).all()


def test_clipping_follows_the_sign_of_the_advantage():
    old = torch.zeros(2, 1)
    logp = torch.log(torch.tensor([[1.5], [0.5]]))  # ratios 1.5 and 0.5
    loss, clipped = policy_loss_terms(logp, old, torch.tensor([1.0, -1.0]), epsilon=0.2, epsilon_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.28], [0.8]]))
    assert clipped.tolist() == [[True], [True]]
    loss, clipped = policy_loss_terms(logp, old, torch.tensor([-1.0, 1.0]), epsilon=0.2, epsilon_high=0.0)
    torch.testing.assert_close(loss, torch.tensor([[1.5], [-0.5]]))  # pessimistic side is unclipped
    assert clipped.tolist() == [[False], [False]]


def test_aggregations_match_their_definitions():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "grpo", 2, 4, 3).item() == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(per_token, mask, "dapo", 2, 4, 3).item() == pytest.approx(10.0 / 4)
    assert aggregate(per_token, mask, "dr_grpo", 2, 4, 3).item() == pytest.approx(10.0 / 6)
    with pytest.raises(ValueError, match="unknown loss_type"):
        aggregate(per_token, mask, "ppo", 2, 4, 3)


def test_reward_contract_counts_failures_and_zeroes_bad_scores():
    def reward(completions, completion_ids, answer, **_):
        out = []
        for c, a in zip(completions, answer):
            if c == "bad":
                out.append({"score": 0.0, "error": "unparsable"})
            elif c == "nan":
                out.append({"score": math.nan})
            else:
                out.append({"score": float(c == a), "exact": float(c == a)})
        return out

    scored = score_completions(reward, ["1", "bad", "nan", "2"], [[1], [2], [3], [4]], {"answer": ["1", "1", "1", "1"]})
    assert scored["scores"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert scored["parse_failure_rate"] == 0.25
    assert scored["invalid_reward_rate"] == 0.25
    assert scored["components"] == {"exact": 0.5}


def test_prompt_column_reaches_the_reward_as_prompts_like_trl():
    seen = {}

    def reward(prompts, completions, **_):
        seen["prompts"] = prompts
        return [{"score": 0.0}] * len(completions)

    score_completions(reward, ["a", "b"], [[1], [2]], {"prompt": ["p", "p"]})
    assert seen["prompts"] == ["p", "p"]


@pytest.mark.parametrize(
    "returned, message",
    [(0.5, "must return a list"), ([{"score": 1.0}], "must return a list of 2"), ([1.0, 2.0], "'score' entry")],
)
def test_a_reward_that_breaks_the_contract_raises(returned, message):
    with pytest.raises(TypeError, match=message):
        score_completions(lambda **_: returned, ["a", "b"], [[1], [2]], {})


def test_logprobs_score_completions_at_the_sampling_temperature():
    torch.manual_seed(0)
    model = build_llama(32, LlamaSize(hidden_size=16, layers=1, heads=2, intermediate_size=32, max_positions=16)).eval()
    batch = pack_batch([[1, 2, 3], [4, 5]], [[6, 7], [8, 9]], pad_token_id=0)
    with torch.no_grad():
        plain, _ = token_logprobs(model, batch)
        cooled, _ = token_logprobs(model, batch, temperature=0.5)
        logits = model(input_ids=torch.tensor([[1, 2, 3, 6, 7]])).logits[0, 2:4]
    expected = torch.log_softmax(logits / 0.5, -1).gather(-1, torch.tensor([[6], [7]])).squeeze(-1)
    torch.testing.assert_close(cooled[0], expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(plain[0], cooled[0])

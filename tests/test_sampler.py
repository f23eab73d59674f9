import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlvr_gym.models.sampler import LlamaDecoder, SamplingConfig, filter_logits, make_decoder, sample

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9]]


def tiny_llama(**kw):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kw.pop("kv", 4), **kw)
    return LlamaForCausalLM(config).eval()


def tiny_qwen2():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=False)
    return Qwen2ForCausalLM(config).eval()


def greedy_reference(model, prompt, n):
    ids = torch.tensor([prompt])
    for _ in range(n):
        nxt = model(ids).logits[0, -1].argmax()
        ids = torch.cat([ids, nxt.view(1, 1)], 1)
    return ids[0, len(prompt):].tolist()


@pytest.mark.parametrize("make", [tiny_llama, lambda: tiny_llama(kv=2), tiny_qwen2], ids=["llama", "llama-gqa", "qwen2"])
def test_fast_decoder_matches_the_model_forward(make):
    model = make()
    assert LlamaDecoder.supports(model)
    # Prefill logits with left padding equal the model's own forward on each unpadded prompt.
    decoder = LlamaDecoder(model, PROMPTS, max_len=16, device=torch.device("cpu"))
    logits = decoder.prefill()
    for i, p in enumerate(PROMPTS):
        torch.testing.assert_close(logits[i], model(torch.tensor([p])).logits[0, -1], atol=1e-4, rtol=1e-4)
    # Then a multi-token forward and a one-token one over the cache (the prefill went in row chunks).
    decoder = LlamaDecoder(model, PROMPTS, max_len=16, device=torch.device("cpu"))
    decoder.prefill(rows_per_pass=2)
    more = torch.tensor([[10, 11], [12, 13], [14, 15]])
    logits = decoder.forward(more)
    last = decoder.step(torch.tensor([20, 21, 22]))
    for i, p in enumerate(PROMPTS):
        full = model(torch.tensor([p + more[i].tolist() + [20 + i]])).logits[0]
        torch.testing.assert_close(logits[i], full[-2], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(last[i], full[-1], atol=1e-4, rtol=1e-4)
    rollout = sample(model, PROMPTS, SamplingConfig(max_new_tokens=8, temperature=0), num_samples=2)
    for i, p in enumerate(PROMPTS):
        expected = greedy_reference(model, p, 8)
        assert rollout.completion_ids[2 * i].tolist() == expected
        assert rollout.completion_ids[2 * i + 1].tolist() == expected


def test_generic_decoder_serves_other_architectures():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)).eval()
    assert not LlamaDecoder.supports(model)
    rollout = sample(model, PROMPTS, SamplingConfig(max_new_tokens=6, temperature=0))
    for i, p in enumerate(PROMPTS):
        assert rollout.completion_ids[i].tolist() == greedy_reference(model, p, 6)


def test_forced_tokens_are_placed_and_marked():
    model = tiny_llama()
    forced = [{0: 11, 3: 12}, {}, {5: 13}]
    rollout = sample(model, PROMPTS, SamplingConfig(max_new_tokens=6), num_samples=3, forced=forced,
                     generator=torch.Generator().manual_seed(0))
    for i, f in enumerate(forced):
        for row in range(3 * i, 3 * i + 3):
            for pos, tok in f.items():
                assert rollout.completion_ids[row, pos] == tok
            assert rollout.forced_mask[row].nonzero().flatten().tolist() == sorted(f)
    assert rollout.sampled_masks()[0] == [False, True, True, False, True, True]


def test_rows_end_at_a_stop_token_and_ended_rows_are_padded():
    model = tiny_llama()
    rollout = sample(model, PROMPTS, SamplingConfig(max_new_tokens=30, temperature=1.0, stop_token_ids=(3, 4, 5, 6)),
                     num_samples=8, pad_token_id=0, generator=torch.Generator().manual_seed(1))
    lengths = rollout.lengths
    assert min(lengths) < 30, "with four stop tokens out of 50 some rows should stop early"
    for row, n in zip(rollout.completion_ids, lengths):
        if n < 30:
            assert row[n - 1].item() in (3, 4, 5, 6)
            assert (row[n:] == 0).all()
        assert not any(t in (3, 4, 5, 6) for t in row[: n - 1].tolist())


def test_sampling_is_reproducible_with_a_seeded_generator():
    model = tiny_llama()
    config = SamplingConfig(max_new_tokens=10, temperature=1.0, top_k=20, top_p=0.9)
    a = sample(model, PROMPTS, config, num_samples=4, generator=torch.Generator().manual_seed(5))
    b = sample(model, PROMPTS, config, num_samples=4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.completion_ids, b.completion_ids)


def test_filters_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.85)).tolist() == [[False, False, False, True]]
    assert not torch.isinf(filter_logits(logits, top_p=0.01))[0, 0]


def test_bad_requests_raise_clear_errors():
    model = tiny_llama()
    with pytest.raises(ValueError, match="at least one token"):
        sample(model, [[]], SamplingConfig())
    with pytest.raises(ValueError, match="outside the completion"):
        sample(model, [[1]], SamplingConfig(max_new_tokens=4), forced=[{9: 1}])
    with pytest.raises(ValueError, match="forced has"):
        sample(model, [[1], [2]], SamplingConfig(), forced=[{}])


def test_sampled_tokens_follow_the_model_distribution():
    from rlvr_gym.models.sampler import next_tokens

    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    logits = probs.log().repeat(20_000, 1)
    tokens = next_tokens(logits, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)
    assert freq[3] == 0, "a token of probability 0 is never drawn"


@pytest.mark.parametrize("make", [tiny_llama, lambda: GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2,
                                                                                   n_head=2)).eval()],
                         ids=["llama", "gpt2"])
def test_bfloat16_products_stay_close_to_float32_and_leave_the_weights(make):
    torch.manual_seed(0)
    model = make()
    full = make_decoder(model, PROMPTS, 16, torch.device("cpu")).prefill()
    half = make_decoder(model, PROMPTS, 16, torch.device("cpu"), matmul_dtype=torch.bfloat16).prefill()
    assert half.dtype == torch.float32 and not torch.equal(half, full)  # the products did run in bfloat16
    torch.testing.assert_close(half, full, atol=0.05, rtol=0.05)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    rollout = sample(model, PROMPTS, SamplingConfig(max_new_tokens=4, temperature=0), matmul_dtype=torch.bfloat16)
    assert rollout.completion_ids.shape == (3, 4)

"""Batched autoregressive sampling with a KV cache, shared by the GRPO trainer and the learned simulators.

Why not `model.generate`: on a small model on CPU, Python overhead per token dominates, and GRPO spends most
of its time here. This loop
- prefills each distinct prompt once and copies its cache to the G samples of its group,
- runs Llama-family models (llama, qwen2) through a lean decoder over the model's own weights with a
  preallocated cache (logits equal to the model's forward, checked in the tests); other causal LMs go through
  their own forward with a `DynamicCache`,
- drops finished rows from the batch, so one long completion does not make the whole batch pay,
- takes *forced tokens* at given completion positions (video rollouts splice the real action tokens between
  generated frames); the rollout marks them so the trainer leaves them out of the loss.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class SamplingConfig:
    max_new_tokens: int = 64
    """Completion length limit, forced tokens included."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_k: int = 0
    """Keep only the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches p (1: all)."""
    stop_token_ids: tuple[int, ...] = ()
    """A row ends after sampling one of these (the stop token is part of the completion)."""


@dataclass
class Rollout:
    """Completions of a batch of prompts, `num_samples` consecutive rows per prompt."""

    prompt_ids: list[list[int]]
    """The prompt of each row."""
    completion_ids: torch.Tensor
    """(rows, max_new_tokens) long, padded with `pad_token_id` after a row ended."""
    completion_mask: torch.Tensor
    """(rows, max_new_tokens) bool: the positions that belong to the completion (stop token included)."""
    forced_mask: torch.Tensor
    """(rows, max_new_tokens) bool: positions whose token was forced rather than sampled."""
    tracked_probs: torch.Tensor | None = None
    """(rows, max_new_tokens, len(track_token_ids)): the model's probability (temperature 1) of each tracked
    token at each position, e.g. a success flag's probability as a success head."""
    token_logprobs: torch.Tensor | None = None
    """(rows, max_new_tokens) with `track_logprobs`: the log-probability (temperature 1, within `allowed_tokens`) of
    the token each position took; 0 where forced or past the end. A model's confidence in what it generated."""

    @property
    def lengths(self) -> list[int]:
        return self.completion_mask.sum(1).tolist()

    def completions(self) -> list[list[int]]:
        return [row[mask].tolist() for row, mask in zip(self.completion_ids, self.completion_mask)]

    def sampled_masks(self) -> list[list[bool]]:
        """For each row's completion tokens: True where sampled, False where forced (left out of the loss)."""
        return [(~forced)[mask].tolist() for forced, mask in zip(self.forced_mask, self.completion_mask)]


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set the logits outside the top-k / top-p set to -inf."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p; the most likely token always stays.
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_tokens(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    if config.temperature == 0:
        return logits.argmax(-1)
    logits = filter_logits(logits.float() / config.temperature, config.top_k, config.top_p)
    # Inverse-CDF sampling: one uniform per row. torch.multinomial drew an exponential per vocabulary entry and took
    # ~1 ms per step for 8 x 4096 on this CPU, 12% of a decode step; this takes ~0.07 ms.
    cdf = logits.softmax(-1).cumsum(-1)
    # Drawn where the generator lives (a CPU stream can drive GPU sampling, and gives the same draws on both).
    u = torch.rand(len(cdf), 1, generator=generator, device=generator.device if generator else cdf.device)
    u = u.to(cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    config: SamplingConfig,
    *,
    num_samples: int = 1,
    forced: Sequence[Mapping[int, int]] | None = None,
    pad_token_id: int = 0,
    generator: torch.Generator | None = None,
    track_token_ids: Sequence[int] = (),
    allowed_tokens: torch.Tensor | None = None,
    track_logprobs: bool = False,
    matmul_dtype: torch.dtype | None = None,
) -> Rollout:
    """Sample `num_samples` completions for each prompt (token ids).

    `forced[i]` maps completion positions to the token that prompt i's samples must take there;
    `track_token_ids` asks for the model's probability of these tokens at every position;
    `track_logprobs` for the log-probability of each token taken (`Rollout.token_logprobs`);
    `allowed_tokens` (max_new_tokens, vocab) bool restricts each completion position to a fixed layout's tokens
    (e.g. frame codes, then a success flag), so that every sample can be parsed;
    `matmul_dtype` (e.g. torch.bfloat16) runs the weight matrix products in that type, the rest in the model's own
    (None: everything in the model's own; see `LlamaDecoder`).
    """
    model = getattr(model, "module", model)  # DDP
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("sample() needs at least one prompt, and every prompt needs at least one token")
    if forced is not None and len(forced) != len(prompts):
        raise ValueError(f"forced has {len(forced)} entries for {len(prompts)} prompts")
    T = config.max_new_tokens
    rows = len(prompts) * num_samples
    device = next(model.parameters()).device
    forced_ids = torch.full((rows, T), -1, dtype=torch.long, device=device)
    if forced is not None:
        for i, positions in enumerate(forced):
            for pos, tok in positions.items():
                if not 0 <= pos < T:
                    raise ValueError(f"forced position {pos} is outside the completion (max_new_tokens={T})")
                forced_ids[i * num_samples : (i + 1) * num_samples, pos] = tok
    stop = torch.tensor(sorted(config.stop_token_ids), dtype=torch.long, device=device)
    if allowed_tokens is not None and (allowed_tokens.shape[0] < T or not allowed_tokens.any(-1)[:T].all()):
        raise ValueError(f"allowed_tokens needs a row with at least one allowed token for each of the {T} positions")
    if allowed_tokens is not None:
        allowed_tokens = allowed_tokens.to(device)  # a layout mask is built on the CPU; the logits may be on a GPU

    decoder = make_decoder(model, prompts, max_len=max(map(len, prompts)) + T, device=device, matmul_dtype=matmul_dtype)
    logits = decoder.prefill()
    decoder.repeat(num_samples)
    logits = logits.repeat_interleave(num_samples, 0)

    out = torch.full((rows, T), pad_token_id, dtype=torch.long, device=device)
    in_completion = torch.zeros((rows, T), dtype=torch.bool, device=device)
    tracked = torch.as_tensor(list(track_token_ids), dtype=torch.long, device=device)
    tracked_probs = torch.zeros((rows, T, len(tracked)), device=device) if len(tracked) else None
    token_logprobs = torch.zeros((rows, T), device=device) if track_logprobs else None
    batch_rows = torch.arange(rows, device=device)  # the output row of each row in the running batch
    alive = torch.ones(rows, dtype=torch.bool, device=device)
    any_forced, any_stop = bool((forced_ids >= 0).any()), len(stop) > 0
    ended = 0  # rows of the running batch that have ended but not yet been dropped
    for t in range(T):
        if allowed_tokens is not None:
            logits = logits.masked_fill(~allowed_tokens[t], float("-inf"))
        if tracked_probs is not None:
            tracked_probs[batch_rows[alive], t] = logits[alive].softmax(-1)[:, tracked]
        tokens = next_tokens(logits, config, generator)
        # Per-token Python work is what a decode step of a small model costs: skip what this batch does not need.
        if any_forced:
            forced_now = forced_ids[batch_rows, t]
            tokens = torch.where(forced_now >= 0, forced_now, tokens)
        rows_now = batch_rows[alive] if ended else batch_rows
        out[rows_now, t] = tokens[alive] if ended else tokens
        if token_logprobs is not None:
            taken = logits.float().log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
            if any_forced:
                taken = torch.where(forced_now >= 0, torch.zeros_like(taken), taken)
            token_logprobs[rows_now, t] = taken[alive] if ended else taken
        in_completion[rows_now, t] = True
        if t == T - 1:
            break
        if any_stop:
            stopped = torch.isin(tokens, stop)
            if any_forced:
                stopped &= forced_now < 0
            alive &= ~stopped
            ended = int((~alive).sum())
            if ended == len(alive):
                break
            # Copying the cache costs about as much as a few decode steps: drop ended rows once a quarter have ended.
            if ended * 4 >= len(alive):
                keep = alive.nonzero().squeeze(-1)
                decoder.select(keep)
                tokens, batch_rows, alive, ended = tokens[keep], batch_rows[keep], alive[keep], 0
        logits = decoder.step(tokens)
    prompt_rows = [list(p) for p in prompts for _ in range(num_samples)]
    return Rollout(prompt_rows, out, in_completion, in_completion & (forced_ids >= 0), tracked_probs, token_logprobs)


def sample_texts(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    batch_size: int = 16,
    max_new_tokens: int = 512,
    num_samples: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[list[str]]:
    """`num_samples` decoded completions per prompt (greedy at temperature 0, stopping at eos), in the prompts' order."""
    return [[text for text, _ in row] for row in _sample(model, tokenizer, prompts, batch_size, max_new_tokens,
                                                         num_samples, temperature, seed, track_logprobs=False)]


def sample_scored_texts(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    batch_size: int = 16,
    max_new_tokens: int = 512,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[tuple[str, np.ndarray]]:
    """One completion per prompt, as `sample_texts` draws it, with the log-probability (temperature 1) of each token
    the model took: how sure it was of what it wrote."""
    return [row[0] for row in _sample(model, tokenizer, prompts, batch_size, max_new_tokens, 1, temperature, seed,
                                      track_logprobs=True)]


def _sample(model, tokenizer, prompts, batch_size, max_new_tokens, num_samples, temperature, seed, track_logprobs):
    # Prompts of similar length share a batch: less padding in the prefill.
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    config = SamplingConfig(max_new_tokens, temperature, stop_token_ids=(tokenizer.eos_token_id,))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    out: list[list[tuple[str, np.ndarray | None]]] = [[] for _ in prompts]
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        rollout = sample(model, [prompts[i] for i in rows], config, num_samples=num_samples, pad_token_id=pad_id,
                         generator=torch.Generator(device).manual_seed(seed * 1_000_003 + start),
                         track_logprobs=track_logprobs)
        texts = [tokenizer.decode(c, skip_special_tokens=True) for c in rollout.completions()]
        logprobs = [rollout.token_logprobs[k][rollout.completion_mask[k]].cpu().numpy() if track_logprobs else None
                    for k in range(len(texts))]
        scored = list(zip(texts, logprobs))
        for j, i in enumerate(rows):
            out[i] = scored[j * num_samples : (j + 1) * num_samples]
    return out


def make_decoder(model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_len: int, device: torch.device,
                 matmul_dtype: torch.dtype | None = None):
    if LlamaDecoder.supports(model):
        return LlamaDecoder(model, prompts, max_len, device, matmul_dtype)
    return HFDecoder(model, prompts, max_len, device, matmul_dtype)


def left_pad(prompts: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and the mask of real tokens, so that every row's last prompt token is at the same index."""
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) :] = True
    return ids, mask


class LlamaDecoder:
    """Runs a Llama-family Hugging Face model's weights with a preallocated KV cache and few Python ops per step.

    With a `matmul_dtype` other than the model's, the weight matrices are cast to it once and every product with them
    runs in it, while the residual stream, the norms, the KV cache and attention stay in the model's own type: on a
    CPU with AVX-512 BF16 the bfloat16 products run about 4x faster than float32 ones, whereas attention over the
    cache (memory-bound at decode) runs no faster in bfloat16 than in float32 there.

    The cache keeps keys and values with the position axis last, (layers, rows, kv heads, head dim, positions): a
    decoded token's query reads each row's whole cache, and both of its products then run over contiguous memory,
    about 2x faster on a CPU than `scaled_dot_product_attention` over (positions, head dim) caches (64 rows of 180
    positions, 4 heads of 64). The prompt's own attention, at prefill, goes through that kernel on the fresh keys.
    """

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        config = getattr(model, "config", None)
        if getattr(config, "model_type", None) not in ("llama", "qwen2"):
            return False
        return (
            config.hidden_act == "silu"
            and not getattr(config, "mlp_bias", False)
            and getattr(config, "sliding_window", None) is None
            and not model.training
        )

    def __init__(self, model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_len: int, device: torch.device,
                 matmul_dtype: torch.dtype | None = None):
        config = model.config
        self.model = model
        self.layers = model.model.layers
        self.n_heads = config.num_attention_heads
        self.n_kv = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self.ids, self.key_valid = left_pad(prompts, device)
        self.prompt_width = self.ids.shape[1]
        self.has_padding = not bool(self.key_valid.all())
        self.key_valid = F.pad(self.key_valid, (0, max_len - self.prompt_width), value=True)
        positions = torch.arange(max_len, device=device)
        self.positions = (positions - (~self.key_valid[:, : self.prompt_width]).sum(1, keepdim=True)).clamp(min=0)
        dtype = model.model.embed_tokens.weight.dtype
        cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=dtype, device=device), positions[None])
        self.cos_table, self.sin_table = cos[0], sin[0]
        self.matmul_dtype = matmul_dtype or dtype
        self.weights = [self.fuse(layer, self.matmul_dtype) for layer in self.layers]
        head = model.lm_head
        self.head = (head.weight.to(self.matmul_dtype), None if head.bias is None else head.bias.to(self.matmul_dtype))
        shape = (len(self.layers), len(prompts), self.n_kv, self.head_dim, max_len)
        # Never read past what a forward wrote: a query reads its row's positions up to its own.
        self.k_cache = torch.empty(shape, dtype=dtype, device=device)
        self.v_cache = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0

    @staticmethod
    def fuse(layer, matmul_dtype: torch.dtype) -> dict:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        cast = lambda t: None if t is None else t.to(matmul_dtype)  # noqa: E731
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat([p.bias for p in projections])
        return {
            "qkv": cast(torch.cat([p.weight for p in projections])),
            "qkv_bias": cast(bias),
            "o": cast(attn.o_proj.weight),
            "o_bias": cast(attn.o_proj.bias),
            "gate_up": cast(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
            "down": cast(mlp.down_proj.weight),
            "norm1": layer.input_layernorm.weight,
            "norm2": layer.post_attention_layernorm.weight,
        }

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if weight.dtype == x.dtype:
            return F.linear(x, weight, bias)
        return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, ids: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """Logits after `ids` (the cache's `rows`), whose keys and values join the cache at its current length."""
        B, q_len = ids.shape
        start, end = self.length, self.length + q_len
        positions = self.positions[rows, start:end]
        key_valid = self.key_valid[rows]
        cos, sin = self.cos_table[positions][:, None], self.sin_table[positions][:, None]
        if q_len > 1:  # a single query's mask is `attend_one`'s
            causal = torch.ones(q_len, end, dtype=torch.bool, device=ids.device).tril(start)
            # A padding query attends to itself so that no softmax row is empty (an empty row gives NaN).
            itself = F.pad(torch.eye(q_len, dtype=torch.bool, device=ids.device), (start, 0))
            mask = (causal & key_valid[:, None, :end]) | itself
            mask = mask[:, None]
        x = self.model.model.embed_tokens(ids)
        gqa = self.n_kv != self.n_heads
        for i, w in enumerate(self.weights):
            h = self.rms_norm(x, w["norm1"])
            qkv = self.linear(h, w["qkv"], w["qkv_bias"])
            q, k, v = qkv.split([self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim], -1)
            # Queries and keys rotate together: one set of elementwise ops instead of two.
            qk = self.rotate(qkv[..., : (self.n_heads + self.n_kv) * self.head_dim]
                             .view(B, q_len, self.n_heads + self.n_kv, self.head_dim).transpose(1, 2), cos, sin)
            q, k = qk[:, : self.n_heads], qk[:, self.n_heads :]
            v = v.view(B, q_len, self.n_kv, self.head_dim).transpose(1, 2)
            k_cache, v_cache = self.k_cache[i, rows], self.v_cache[i, rows]
            k_cache[..., start:end] = k.transpose(-1, -2)
            v_cache[..., start:end] = v.transpose(-1, -2)
            if q_len == 1:
                a = self.attend_one(q, k_cache[..., :end], v_cache[..., :end], key_valid[:, :end])
            else:
                if start:  # a second multi-token forward attends to the cache too
                    k, v = k_cache[..., :end].transpose(-1, -2), v_cache[..., :end].transpose(-1, -2)
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
            x = x + self.linear(a.transpose(1, 2).reshape(B, q_len, -1), w["o"], w["o_bias"])
            gate, up = self.linear(self.rms_norm(x, w["norm2"]), w["gate_up"]).chunk(2, -1)
            x = x + self.linear(F.silu(gate) * up, w["down"])
        if rows == slice(None):
            self.length = end
        return self.linear(self.rms_norm(x[:, -1], self.model.model.norm.weight), *self.head).float()

    def attend_one(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_valid: torch.Tensor
                   ) -> torch.Tensor:
        """Attention of each row's one new query (rows, heads, 1, head dim) over its cached keys and values (rows,
        kv heads, head dim, positions); the heads that share a key/value head (GQA) are that head's rows of one
        product."""
        # Batched products over (rows x kv heads): a 4-d matmul's own reshapes cost a one-row batch 7% of its speed.
        B, group = len(q), self.n_heads // self.n_kv
        scores = torch.bmm(q.reshape(B * self.n_kv, group, self.head_dim), keys.flatten(0, 1)).mul_(self.scale)
        if self.has_padding:
            scores = scores.view(B, self.n_heads, -1).masked_fill_(~key_valid[:, None], float("-inf")).view_as(scores)
        weights = scores.softmax(-1, dtype=torch.float32).to(q.dtype)
        out = torch.bmm(values.flatten(0, 1), weights.transpose(1, 2))  # (rows x kv heads, head dim, group)
        return out.transpose(1, 2).reshape(B, self.n_heads, 1, self.head_dim)

    def prefill(self, rows_per_pass: int | None = None) -> torch.Tensor:
        """The prompts' logits, `rows_per_pass` prompts at a time (default: 8 on a CPU, all on a GPU). On a CPU a
        whole batch's activations (64 prompts of 145 tokens: 38 MB per tensor) are freshly mapped memory for every
        op, and the page faults cost more than the products; a few rows' stay in the allocator's heap and the core's
        cache. A GPU's caching allocator has no such cost, and one pass keeps it busy."""
        rows_per_pass = rows_per_pass or (8 if self.ids.device.type == "cpu" else len(self.ids))
        logits = [self.forward(self.ids[r : r + rows_per_pass], slice(r, r + rows_per_pass))
                  for r in range(0, len(self.ids), rows_per_pass)]
        self.length = self.prompt_width
        return torch.cat(logits)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward(tokens[:, None])

    def repeat(self, n: int) -> None:
        if n == 1:
            return
        self.k_cache = self.k_cache.repeat_interleave(n, 1)
        self.v_cache = self.v_cache.repeat_interleave(n, 1)
        self.key_valid = self.key_valid.repeat_interleave(n, 0)
        self.positions = self.positions.repeat_interleave(n, 0)

    def select(self, rows: torch.Tensor) -> None:
        self.k_cache = self.k_cache[:, rows]
        self.v_cache = self.v_cache[:, rows]
        self.key_valid = self.key_valid[rows]
        self.positions = self.positions[rows]


class HFDecoder:
    """Any causal LM through its own forward with a `DynamicCache` (the general path); a `matmul_dtype` other than
    the model's runs its forward under autocast to that type."""

    def __init__(self, model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_len: int, device: torch.device,
                 matmul_dtype: torch.dtype | None = None):
        from transformers import DynamicCache

        self.model = model
        dtype = next(model.parameters()).dtype
        self.autocast = torch.autocast(device.type, dtype=matmul_dtype, enabled=matmul_dtype not in (None, dtype))
        self.ids, self.attention_mask = left_pad(prompts, device)
        self.cache = DynamicCache()
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.positions = (self.attention_mask.long().cumsum(1) - 1).clamp(min=0)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with self.autocast:
            out = self.model(
                input_ids=ids,
                attention_mask=self.attention_mask.long(),
                position_ids=positions,
                use_cache=True,
                **{self.cache_arg: self.cache},
            )
        return out.logits[:, -1].float()

    def prefill(self) -> torch.Tensor:
        return self.forward(self.ids, self.positions)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.positions = self.positions[:, -1:] + 1
        self.attention_mask = F.pad(self.attention_mask, (0, 1), value=True)
        return self.forward(tokens[:, None], self.positions)

    def repeat(self, n: int) -> None:
        if n == 1:
            return
        self.cache.batch_repeat_interleave(n)
        self.attention_mask = self.attention_mask.repeat_interleave(n, 0)
        self.positions = self.positions.repeat_interleave(n, 0)

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attention_mask = self.attention_mask[rows]
        self.positions = self.positions[rows]

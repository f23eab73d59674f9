"""The trainer's own proof: a verifiable toy task (sort the digits of the prompt) that SFT starts and GRPO improves.

Not a world model: it exercises SFT, sampling, rewards, GRPO, checkpoints and resume end to end in about a
minute on a CPU, and `rlvr-gym demo` / the tests use it to show that GRPO moves an exact-match reward.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlvr_gym.models.lm import LlamaSize, build_llama, load_model
from rlvr_gym.models.sampler import SamplingConfig, sample
from rlvr_gym.train.grpo import GRPOConfig, train_grpo
from rlvr_gym.train.run import barrier, final_dir, set_by_command, setup_processes
from rlvr_gym.train.sft import SFTConfig, train_sft

log = logging.getLogger("rlvr_gym")

DIGITS = "0123456789"
SEPARATOR = "="


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of the task's alphabet, in the Hugging Face format (saved with checkpoints)."""
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>", "<unk>", *DIGITS, SEPARATOR])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def make_examples(n: int, seed: int, min_len: int, max_len: int, tokenizer) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        digits = "".join(rng.choice(DIGITS) for _ in range(rng.randint(min_len, max_len)))
        prompt, answer = digits + SEPARATOR, "".join(sorted(digits))
        out.append(
            {
                "prompt": prompt,
                "answer": answer,
                "prompt_ids": tokenizer.encode(prompt, add_special_tokens=False),
                "target_ids": tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id],
            }
        )
    return out


def sorted_digits_reward(completions: list[str], answer: list[str], **_) -> list[dict]:
    """Exact match of the completion with the sorted digits; anything but digits is a parse failure."""
    results = []
    for completion, gold in zip(completions, answer):
        text = completion.strip()
        if not text.isdigit():
            results.append({"score": 0.0, "error": f"not a digit string: {text[:20]!r}"})
            continue
        exact = float(text == gold)
        results.append({"score": exact, "exact": exact, "length_ok": float(len(text) == len(gold))})
    return results


@torch.no_grad()
def exact_match(model, tokenizer, examples: list[dict], temperature: float = 0.0, batch: int = 128) -> float:
    """Held-out exact-match rate (greedy by default)."""
    config = SamplingConfig(max_new_tokens=max(len(e["answer"]) for e in examples) + 2, temperature=temperature,
                            stop_token_ids=(tokenizer.eos_token_id,))
    correct = 0
    for i in range(0, len(examples), batch):
        part = examples[i : i + batch]
        rollout = sample(model, [e["prompt_ids"] for e in part], config, pad_token_id=tokenizer.pad_token_id,
                         generator=torch.Generator().manual_seed(i))
        texts = [tokenizer.decode(c, skip_special_tokens=True) for c in rollout.completions()]
        correct += sum(r["score"] for r in sorted_digits_reward(texts, [e["answer"] for e in part]))
    return correct / len(examples)


@dataclass
class DemoConfig:
    run_dir: str = "runs/demo"
    """Where the SFT and GRPO runs go (sft/, grpo/, init/, summary.json)."""
    min_len: int = 5
    """Fewest digits in a prompt."""
    max_len: int = 8
    """Most digits in a prompt."""
    train_examples: int = 4000
    """Training prompts."""
    eval_examples: int = 300
    """Held-out prompts (a different seed) for exact match."""
    size: LlamaSize = field(default_factory=lambda: LlamaSize(hidden_size=64, layers=2, heads=4, intermediate_size=176, max_positions=64))
    """Model shape (trained from scratch)."""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=150, lr=3e-3, batch_size=32, save_every=50, warmup_steps=10))
    """The brief SFT stage (run_dir and model are set by the demo)."""
    grpo: GRPOConfig = field(
        default_factory=lambda: GRPOConfig(
            steps=100, lr=3e-4, prompts_per_step=16, group_size=8, max_new_tokens=10, beta=0.0, save_every=20, eval_every=20
        )
    )
    """The GRPO stage (run_dir and model are set by the demo)."""
    seed: int = 0
    """Seed of the data and the model initialisation."""
    resume: bool = False
    """Resume both stages from their newest checkpoints."""


def run_demo(config: DemoConfig) -> dict:
    """Train a tiny model by SFT, then GRPO on the exact-match reward; returns held-out exact match before/after."""
    root = Path(config.run_dir)
    tokenizer = char_tokenizer()
    train = make_examples(config.train_examples, config.seed, config.min_len, config.max_len, tokenizer)
    held_out = make_examples(config.eval_examples, config.seed + 10_000, config.min_len, config.max_len, tokenizer)
    d = setup_processes(config.sft.threads)
    init = root / "init"
    if d.is_main and not (init / "config.json").is_file():
        torch.manual_seed(config.seed)
        model = build_llama(len(tokenizer), config.size, tokenizer)
        model.save_pretrained(init)
        tokenizer.save_pretrained(init)
    barrier(d)

    def accuracy(model) -> dict[str, float]:
        return {"exact_match": exact_match(model, tokenizer, held_out)}

    sft = set_by_command(config.sft, "sft", run_dir=str(root / "sft"), model=str(init), resume=config.resume)
    # GRPO starts from the SFT run's final model; its settings are checked here, before SFT spends its minutes.
    grpo = set_by_command(config.grpo, "grpo", run_dir=str(root / "grpo"), model=str(final_dir(sft.run_dir)),
                          resume=config.resume)
    sft_model_dir = train_sft(sft, train, eval_examples=held_out, eval_fn=accuracy)
    grpo_model_dir = train_grpo(grpo, sorted_digits_reward, train, eval_fn=accuracy)
    before = accuracy(load_model(sft_model_dir)[0].eval())["exact_match"]
    after = accuracy(load_model(grpo_model_dir)[0].eval())["exact_match"]
    summary = {"exact_match_sft": before, "exact_match_grpo": after, "sft_model": str(sft_model_dir), "grpo_model": str(grpo_model_dir)}
    if d.is_main:
        (root / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary

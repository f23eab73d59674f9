"""Web outcome head: a small classifier that says whether an action ends a MiniWoB episode, and with what reward.

The web world model writes the reward and done after the page diff, two tokens among hundreds, and a 3.7M LM trained
on that text does not learn that clicking a button on click-button pays only when its label is the one the task
names (the web-refit card's Limits: more data, the element's line in the prompt and GRPO weighted toward the
outcome each left it at chance). DIAMOND learns reward and termination with a separate model; so does this one: a
classifier over (page, task, action), trained with cross-entropy on real outcomes only. It reads the page first and
ends on the task, the action and the line of the element the action names, so the comparison the outcome turns on
sits beside the position the class is read from.

A web checkpoint that has it holds it in CHECKPOINT/outcome/ (a Hugging Face `LlamaForSequenceClassification` and
the LM's tokenizer); `rlvr_gym.sim.web.WebWorldModel` then takes the reward and done from it, and the page from the
LM.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerBase

from envs.web import InvalidAction, parse_action
from rlvr_gym.files import CheckpointError

OUTCOME_DIR = "outcome"
CLASSES = ("continue", "success", "failure")
"""The episode goes on; it ends with the task done (MiniWoB raw reward 1); it ends otherwise (reward below 1: a
failure, or click-checkboxes' partial credit)."""
REWARD_LOGIT = len(CLASSES)
"""Index of the regressed reward of an episode that ends without the task done (tanh of that logit)."""
SUCCESS_REWARD = 1.0
MAX_FAILURE_REWARD = 0.99
"""A regressed reward is kept below success, which is MiniWoB's 1 exactly."""


@dataclass
class OutcomeSize:
    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    intermediate_size: int = 384
    max_tokens: int = 768
    """Tokens read per example: the tail (task, action, element) whole, the page cut to what is left."""


def build_outcome_model(tokenizer: PreTrainedTokenizerBase, size: OutcomeSize) -> LlamaForSequenceClassification:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=size.hidden_size, intermediate_size=size.intermediate_size,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.heads,
        max_position_embeddings=size.max_tokens, num_labels=len(CLASSES) + 1, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return LlamaForSequenceClassification(config)


def element_line(tree: str, action: str) -> str:
    """The tree line (without indentation) of the element the action names, or '' when it names none."""
    try:
        _, node_id, _ = parse_action(action)
    except InvalidAction:
        return ""
    for line in tree.split("\n"):
        if line.lstrip("\t").startswith(f"[{node_id}] "):
            return line.lstrip("\t")
    return ""


def outcome_tail(utterance: str, tree: str, action: str) -> str:
    return f"\nTask: {utterance}\nAction: {action}\nElement: {element_line(tree, action)}"


def encode_outcome_inputs(tokenizer: PreTrainedTokenizerBase, utterances: Sequence[str], trees: Sequence[str],
                          actions: Sequence[str], max_tokens: int) -> list[list[int]]:  # fmt: skip
    """Token ids of each example: bos, the tree cut to fit, then its tail (task, action, element line) whole."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    heads = tokenizer(list(trees), add_special_tokens=False)["input_ids"]
    tails = tokenizer([outcome_tail(u, t, a) for u, t, a in zip(utterances, trees, actions)],
                      add_special_tokens=False)["input_ids"]  # fmt: skip
    out = []
    for head, tail in zip(heads, tails):
        tail = tail[-(max_tokens - len(bos)) :]
        out.append(bos + head[: max(0, max_tokens - len(bos) - len(tail))] + tail)
    return out


def outcome_label(reward: float, done: bool) -> int:
    """The class of a real transition's outcome."""
    if not done:
        return CLASSES.index("continue")
    return CLASSES.index("success" if reward >= SUCCESS_REWARD else "failure")


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and attention mask; the classifier reads each row's last real token."""
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return input_ids.to(device), mask.to(device)


def last_token_logits(model: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, len(CLASSES) + 1) logits read at each row's last token before the padding (`pad_batch`'s inputs hold no
    pad token before it). `model` may be wrapped in DDP."""
    return model(input_ids=input_ids, attention_mask=mask).logits


@dataclass
class Outcome:
    label: str
    """One of CLASSES."""
    reward: float
    done: bool
    confidence: float
    """The classifier's probability of `label`."""


def outcomes_of(logits: torch.Tensor) -> list[Outcome]:
    probs = logits[:, : len(CLASSES)].float().softmax(-1)
    rewards = torch.tanh(logits[:, REWARD_LOGIT].float()).clamp(max=MAX_FAILURE_REWARD)
    out = []
    for p, r in zip(probs.tolist(), rewards.tolist()):
        k = max(range(len(CLASSES)), key=p.__getitem__)
        label = CLASSES[k]
        reward = {"continue": 0.0, "success": SUCCESS_REWARD, "failure": r}[label]
        out.append(Outcome(label, reward, label != "continue", p[k]))
    return out


class OutcomeHead:
    """A trained outcome classifier with its tokenizer, predicting in batches."""

    def __init__(self, path: str | os.PathLike, batch_size: int = 32):
        path = Path(path)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path} holds no outcome head (config.json missing)")
        from rlvr_gym.models.lm import checked_tokenizer, load_tokenizer

        try:
            self.model = LlamaForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
        except Exception as error:
            raise CheckpointError(f"outcome head in {path} could not be loaded ({type(error).__name__}: {error})") from error
        if self.model.config.num_labels != len(CLASSES) + 1:
            raise CheckpointError(f"{path}: {self.model.config.num_labels} outputs, an outcome head has {len(CLASSES) + 1}")
        self.tokenizer = checked_tokenizer(load_tokenizer(path), path)
        self.max_tokens = self.model.config.max_position_embeddings
        self.batch_size = batch_size

    @torch.no_grad()
    def predict(self, utterance: str, tree: str, actions: Sequence[str]) -> list[Outcome]:
        ids = encode_outcome_inputs(self.tokenizer, [utterance] * len(actions), [tree] * len(actions), actions,
                                    self.max_tokens)  # fmt: skip
        out: list[Outcome] = []
        for start in range(0, len(ids), self.batch_size):
            input_ids, mask = pad_batch(ids[start : start + self.batch_size], self.tokenizer.pad_token_id, "cpu")
            out += outcomes_of(last_token_logits(self.model, input_ids, mask))
        return out

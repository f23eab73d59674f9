"""Web outcome head: a small classifier that says whether an action ends a MiniWoB episode, and with what reward.

The web world model writes the reward and done after the page diff, two tokens among hundreds, and a 3.7M LM trained
on that text does not learn that clicking a button on click-button pays only when its label is the one the task
names (the web-refit card's Limits: more data, the element's line in the prompt and GRPO weighted toward the
outcome each left it at chance). DIAMOND learns reward and termination with a separate model; so does this one: a
classifier over (page, task, action), trained with cross-entropy on real outcomes only. It reads the page first and
ends on the task, the action and the line of the element the action names, so the comparison the outcome turns on
sits beside the position the class is read from; tokens that also occur in the task line are flagged
(`OutcomeModel`: DrQA's exact-match feature). A head with `reads_typed` also reads, before the action, what the
episode typed where: a password box shows only bullets, so the page alone cannot say whether Login succeeds.

A web checkpoint that has it holds it in CHECKPOINT/outcome/ (a Hugging Face model, `OutcomeModel`, and the LM's
tokenizer); `rlvr_gym.sim.web.WebWorldModel` then takes the reward and done from it, and the page from the
LM.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch import nn
from transformers import AutoConfig, LlamaConfig, LlamaModel, PreTrainedModel, PreTrainedTokenizerBase

from envs.web import InvalidAction, parse_action, task_done
from rlvr_gym.data.web import TRAINING_RECORD, check_disjoint_episodes, read_training_record
from rlvr_gym.files import CheckpointError
from rlvr_gym.models.lm import checked_tokenizer, load_tokenizer

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


class OutcomeModelConfig(LlamaConfig):
    """A Llama's config with `reads_typed`: whether the head reads the episode's earlier type actions (heads saved
    before it existed do not)."""

    model_type = "rlvr_web_outcome"

    def __init__(self, reads_typed: bool = False, **kwargs):
        self.reads_typed = reads_typed
        super().__init__(**kwargs)


# Known to AutoConfig, so that AutoTokenizer, which reads the head's config.json, does not warn about its type.
AutoConfig.register(OutcomeModelConfig.model_type, OutcomeModelConfig, exist_ok=True)


class OutcomeModel(PreTrainedModel):
    """A small Llama read at the last token, with a learned embedding added to every token of the page and of the
    action lines whose id also occurs in the task line: DrQA's exact-match feature (Chen et al., 2017), which lets
    the classifier compare the element's label with the label the task names without learning string equality
    over every pair of tokens (click-button: 0.72-0.89 of fresh clicks right without it, 0.975-0.988 with it)."""

    config_class = OutcomeModelConfig
    base_model_prefix = "model"

    def __init__(self, config: OutcomeModelConfig):
        super().__init__(config)
        self.model = LlamaModel(config)
        self.match = nn.Embedding(2, config.hidden_size)
        self.score = nn.Linear(config.hidden_size, len(CLASSES) + 1, bias=False)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, match: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, len(CLASSES) + 1) logits at each row's last token before the right padding."""
        embeds = self.model.embed_tokens(input_ids) + self.match(match)
        hidden = self.model(inputs_embeds=embeds, attention_mask=attention_mask).last_hidden_state
        last = attention_mask.sum(1) - 1
        return self.score(hidden[torch.arange(len(last), device=hidden.device), last])


def build_outcome_model(tokenizer: PreTrainedTokenizerBase, size: OutcomeSize, reads_typed: bool = False
                        ) -> OutcomeModel:  # fmt: skip
    config = OutcomeModelConfig(
        reads_typed=reads_typed,
        vocab_size=len(tokenizer), hidden_size=size.hidden_size, intermediate_size=size.intermediate_size,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.heads,
        max_position_embeddings=size.max_tokens, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return OutcomeModel(config)


def element_line(tree: str, action: str) -> str:
    """The tree line (without indentation) of the element the action names, or '' when it names none."""
    try:
        _, node_id, _ = parse_action(action)
    except InvalidAction:
        return ""
    # domains.web keys lines by id too, but models sit below domains in the data flow (tests/test_layout.py).
    for line in tree.split("\n"):
        if line.lstrip("\t").startswith(f"[{node_id}] "):
            return line.lstrip("\t")
    return ""


MAX_TYPED = 4
"""Earlier type actions a head that reads them sees (the latest), enough for the longest form (book-flight's 3)."""


def typed_line(earlier: Sequence[str]) -> str:
    """The episode's earlier type actions as one line: what was typed where, which the page does not always show
    (a password box reads '••••')."""
    typed = []
    for action in earlier:
        try:
            kind, node_id, text = parse_action(action)
        except InvalidAction:
            continue
        if kind == "type":
            typed.append(f'[{node_id}] "{text}"')
    return "\nTyped: " + " ".join(typed[-MAX_TYPED:])


def outcome_tail(utterance: str, tree: str, action: str, earlier: Sequence[str] | None = None) -> tuple[str, str]:
    """The two parts read after the page: the task line, then (for a head that reads them, `earlier` given) the
    episode's earlier type actions, the action, and the line of the element it names."""
    typed = typed_line(earlier) if earlier is not None else ""
    return f"\nTask: {utterance}", f"{typed}\nAction: {action}\nElement: {element_line(tree, action)}"


def encode_outcome_inputs(tokenizer: PreTrainedTokenizerBase, utterances: Sequence[str], trees: Sequence[str],
                          actions: Sequence[str], max_tokens: int, earlier: Sequence[Sequence[str]] | None = None
                          ) -> list[tuple[list[int], list[int]]]:  # fmt: skip
    """Each example's token ids (bos, the tree cut to fit, then the task and action lines whole) and its match
    flags (1 where a token of the page or of the action lines also occurs in the task line). `earlier`: each
    example's earlier actions in its episode, for a head that reads them (`reads_typed`); None for one that does
    not."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    earlier = earlier if earlier is not None else [None] * len(actions)
    tails = [outcome_tail(u, t, a, e) for u, t, a, e in zip(utterances, trees, actions, earlier)]
    # The simulator asks about many actions on one page: each distinct page is tokenized once.
    distinct = list(dict.fromkeys(trees))
    page_ids = dict(zip(distinct, tokenizer(distinct, add_special_tokens=False)["input_ids"]))
    pages = [page_ids[tree] for tree in trees]
    tasks = tokenizer([task for task, _ in tails], add_special_tokens=False)["input_ids"]
    acts = tokenizer([act for _, act in tails], add_special_tokens=False)["input_ids"]
    out = []
    for page, task, act in zip(pages, tasks, acts):
        in_task = set(task)
        room = max(0, max_tokens - len(bos) - len(task) - len(act))
        ids = (bos + page[:room] + task + act)[-max_tokens:]
        match = ([0] * len(bos) + [int(t in in_task) for t in page[:room]] + [0] * len(task)
                 + [int(t in in_task) for t in act])[-max_tokens:]  # fmt: skip
        out.append((ids, match))
    return out


def outcome_label(reward: float, done: bool) -> int:
    """The class of a real transition's outcome."""
    if not done:
        return CLASSES.index("continue")
    return CLASSES.index("success" if task_done(reward) else "failure")


def pad_batch(examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int,
              device: torch.device | str) -> dict[str, torch.Tensor]:  # fmt: skip
    """Right-padded ids, match flags and attention mask of `encode_outcome_inputs`' examples (the model's inputs)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    match = torch.zeros((len(examples), width), dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (ids, flags) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        match[i, : len(ids)] = torch.tensor(flags)
        mask[i, : len(ids)] = 1
    return {"input_ids": input_ids.to(device), "match": match.to(device), "attention_mask": mask.to(device)}


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
        try:
            self.model = OutcomeModel.from_pretrained(path, dtype=torch.float32).eval()
        except Exception as error:
            raise CheckpointError(
                f"outcome head in {path} could not be loaded ({type(error).__name__}: {error})"
            ) from error
        self.tokenizer = checked_tokenizer(load_tokenizer(path), path)
        self.max_tokens = self.model.config.max_position_embeddings
        self.batch_size = batch_size

    @property
    def reads_typed(self) -> bool:
        return bool(getattr(self.model.config, "reads_typed", False))

    @torch.no_grad()
    def predict(self, utterance: str, tree: str, actions: Sequence[str], earlier: Sequence[str] = ()
                ) -> list[Outcome]:  # fmt: skip
        """The outcome of each action on one page, after the episode's `earlier` actions."""
        n = len(actions)
        return self.predict_each([utterance] * n, [tree] * n, actions, [earlier] * n)

    @torch.no_grad()
    def predict_each(self, utterances: Sequence[str], trees: Sequence[str], actions: Sequence[str],
                     earlier: Sequence[Sequence[str]] | None = None) -> list[Outcome]:  # fmt: skip
        """The outcome of each (utterance, tree, action, the episode's earlier actions), in batches. A head that
        reads the earlier type actions needs `earlier`; one that does not ignores it."""
        if self.reads_typed and earlier is None:
            raise ValueError("this outcome head reads the episode's earlier type actions: pass `earlier`")
        earlier = earlier if self.reads_typed else None
        ids = encode_outcome_inputs(self.tokenizer, utterances, trees, actions, self.max_tokens, earlier)
        out: list[Outcome] = []
        for start in range(0, len(ids), self.batch_size):
            out += outcomes_of(self.model(**pad_batch(ids[start : start + self.batch_size], self.tokenizer.pad_token_id,
                                                      "cpu")))  # fmt: skip
        return out


def save_outcome_head(head: str | os.PathLike, checkpoint_dir: str | os.PathLike,
                      dtype: torch.dtype = torch.float32) -> Path:  # fmt: skip
    """Write a trained head (its weights in `dtype`, tokenizer and web_training.json) as CHECKPOINT_DIR/outcome/,
    replacing any head there; a head that does not load is refused before anything is written."""
    loaded = OutcomeHead(head)
    dst = Path(checkpoint_dir) / OUTCOME_DIR
    tmp = dst.with_name(f".{OUTCOME_DIR}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    loaded.model.to(dtype).save_pretrained(tmp)
    loaded.tokenizer.save_pretrained(tmp)
    if (Path(head) / TRAINING_RECORD).is_file():
        shutil.copy(Path(head) / TRAINING_RECORD, tmp / TRAINING_RECORD)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
    return dst


def check_not_trained_on(checkpoint_dir: str | os.PathLike, episodes: dict[str, Sequence[int]], what: str,
                         name: str | None = None) -> dict | None:  # fmt: skip
    """Raise ValueError if the web world model in `checkpoint_dir` or its outcome head (outcome/) was trained on any
    of the episodes (task -> seeds); returns the world model's training record (None when it has none)."""
    name = name or str(checkpoint_dir)
    record = read_training_record(checkpoint_dir)
    head = read_training_record(Path(checkpoint_dir) / OUTCOME_DIR)
    for rec, whose in ((record, f"the training data of {name}"), (head, f"the training data of {name}'s outcome head")):
        if rec is not None:
            check_disjoint_episodes(rec["seeds"], episodes, whose, what)
    return record

"""The domain rewards as TRL reward functions: `f(prompts=None, completions=..., **columns) -> list[float]`.

TRL passes every dataset column as a list with one entry per completion. States may be dicts or the JSON strings
that `export` writes (a Hugging Face dataset cannot hold the games' free-form property dicts as columns). A
completion that does not parse scores 0.0, as in the domain reward (the video reward, at most 0, gives
`verl.RT1_PARSE_FAILURE` instead); conversational completions (lists of messages) are scored on the last message's
content.

    from rlvr_gym.integrations.trl import textgame_binary_reward
    GRPOTrainer(model=..., reward_funcs=textgame_binary_reward, train_dataset=load_from_disk("runs/export/textgame-trl"))

    model, tokenizer = rt1_policy("rt1-rlvr")
    GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=rt1_frame_reward,
                train_dataset=load_from_disk("runs/export/rt1-trl"))
"""

from __future__ import annotations

import json
from typing import Any

from rlvr_gym.data import video_tokens as V
from rlvr_gym.domains import textgame, web
from rlvr_gym.integrations.verl import rt1_frame_scores, rt1_tokenizer


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The text of a standard (string) or conversational (list of messages) completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"a completion must be a string or a list of chat messages, got {type(completion).__name__}")


def as_state(state: str | dict) -> dict:
    """A text-game state given as a dict or as its JSON string."""
    return json.loads(state) if isinstance(state, str) else state


def textgame_binary_reward(
    prompts: list | None = None, completions: list | None = None, current: list | None = None, next: list | None = None,
    **_: Any,
) -> list[float]:
    """1.0 when the completion's diff rebuilds the gold next state exactly, else 0.0 (`textgame.binary_reward`)."""
    return _textgame_scores(textgame.binary_reward, completions, current, next)


def textgame_task_reward(
    prompts: list | None = None, completions: list | None = None, current: list | None = None, next: list | None = None,
    **_: Any,
) -> list[float]:
    """`0.09·property + 0.01·score + 0.2·exact + changed-property accuracy` (`textgame.task_reward`)."""
    return _textgame_scores(textgame.task_reward, completions, current, next)


def web_reward(
    prompts: list | None = None, completions: list | None = None, tree_before: list | None = None,
    tree_after: list | None = None, reward: list | None = None, done: list | None = None, **_: Any,
) -> list[float]:
    """`0.8·item F1 + 0.1·reward right + 0.1·done right` (`web.web_reward`)."""
    _require("web_reward", completions=completions, tree_before=tree_before, tree_after=tree_after, reward=reward,
             done=done)  # fmt: skip
    texts = [completion_text(c) for c in completions]
    return [float(r["score"]) for r in web.web_reward(texts, tree_before, tree_after, reward, done)]


def rt1_frame_reward(
    prompts: list | None = None, completions: list | None = None, checkpoint: list | None = None,
    context_frame: list | None = None, next_frame: list | None = None, before_frame: list | None = None,
    last_frame: list | None = None, action: list | None = None, **_: Any,
) -> list[float]:
    """-(L1 + LPIPS) of the completion's decoded (and, with a motion refiner, refined) frame against the real next
    frame (`train rt1-rlvr`'s reward)."""
    _require("rt1_frame_reward", completions=completions, checkpoint=checkpoint, context_frame=context_frame,
             next_frame=next_frame)  # fmt: skip
    texts = [completion_text(c) for c in completions]
    scores = rt1_frame_scores(texts, checkpoint, context_frame, next_frame, before_frame, last_frame, action)
    return [float(r["score"]) for r in scores]


def rt1_policy(checkpoint: str = "rt1-rlvr") -> tuple[Any, Any]:
    """The world model's transformer as a policy for `GRPOTrainer`, and its tokenizer (`verl.rt1_tokenizer`).

    The transformer's config names ids 1 and 2 (frame codes in this layout) as bos and eos, and TRL stops
    generation at the model's eos: here bos is `<bos>` and generation ends only at `<pad>`.
    """
    from rlvr_gym.models.lm import load_model
    from rlvr_gym.models.robot_world_model import RobotWorldModel

    model, _ = load_model(RobotWorldModel.resolve(checkpoint) / "lm")
    for config in (model.config, model.generation_config):
        config.bos_token_id, config.eos_token_id, config.pad_token_id = V.BOS, V.PAD, V.PAD
    return model, rt1_tokenizer()


def _textgame_scores(fn, completions, current, next) -> list[float]:
    _require(fn.__name__, completions=completions, current=current, next=next)
    texts = [completion_text(c) for c in completions]
    rows = fn(texts, [as_state(s) for s in current], [as_state(s) for s in next])
    return [float(r["score"]) for r in rows]


def _require(name: str, **columns: list | None) -> None:
    if missing := [k for k, v in columns.items() if v is None]:
        raise ValueError(
            f"{name} needs the dataset columns {missing}: export the data with `rlvr-gym export --format trl`"
        )

"""The domain rewards as verl's custom reward function (`custom_reward_function.name=compute_score`).

verl's reward manager calls `compute_score(data_source, solution_str, ground_truth, extra_info)` once per response;
`ground_truth` is the JSON string that `export --format verl` writes into `reward_model.ground_truth`:
- rlvr_gym/textgame: `{"current": state, "next": state, "metric": "binary" | "task"}`;
- rlvr_gym/web: `{"tree_before": str, "tree_after": str, "reward": float, "done": bool}`;
- rlvr_gym/rt1: `{"checkpoint": str, "context_frame": base64 PNG, "next_frame": base64 PNG, "next_ids": [int],
  "before_frame": base64 PNG, "last_frame": base64 PNG, "action": [7 floats]}` (the last three: frames t-1 and t
  and action t, which a world model with a motion refiner reads).

The result is `{"score": float, "parsed": 1.0 | 0.0, components...}` with the same keys for every response of a
data source (verl stacks each key across the batch), components 0.0 when the response does not parse.

The video world model reads and writes ids of its own vocabulary (`rlvr_gym.domains.robot`'s layout), while TRL and
verl hand text between tokenizer and reward. So each id has a name (`<f17>` frame code 17, `<a200>` action bin 200,
`<running>` / `<success>` the success flag, `<bos>`, `<pad>`), and `rt1_tokenizer` is a tokenizer whose vocabulary
is exactly those names, in id order: the policy's token ids are the world model's.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import re
from types import SimpleNamespace

import numpy as np

from rlvr_gym.data import video_tokens as V
from rlvr_gym.domains import robot as R
from rlvr_gym.domains import textgame, web

TEXTGAME, WEB, RT1 = "rlvr_gym/textgame", "rlvr_gym/web", "rlvr_gym/rt1"
TEXTGAME_REWARDS = {"binary": textgame.binary_reward, "task": textgame.task_reward}
# Components per reward; a response that does not parse gets 0.0 for each, so every row has the same keys.
COMPONENTS = {
    "binary": (),
    "task": ("property_acc", "changed_property_acc", "score_acc", "exact"),
    "web": ("f1", "precision", "recall", "reward_ok", "done_ok"),
    "rt1": ("l1", "lpips"),
}
# -(L1 + LPIPS) is at most 0, so the 0.0 other domains give a parse failure would be the best score here. The worst
# frames measured against a real one (black, uniform noise, a checkerboard) score about -1.6; -2 ranks a completion
# that is not a frame below every frame.
RT1_PARSE_FAILURE = R.PARSE_FAILURE_REWARD
FRAME_SHAPE = (64, 64, 3)


def compute_score(data_source: str, solution_str: str, ground_truth: str | dict, extra_info: dict | None = None
                  ) -> dict[str, float]:
    """The domain reward of one response, with its components."""
    gold = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if data_source == TEXTGAME:
        metric = gold.get("metric", "binary")
        if metric not in TEXTGAME_REWARDS:
            raise ValueError(f"unknown text-game metric {metric!r} in ground_truth: use binary or task")
        row = TEXTGAME_REWARDS[metric]([solution_str], [gold["current"]], [gold["next"]])[0]
        keys = COMPONENTS[metric]
    elif data_source == WEB:
        row = web.web_reward([solution_str], [gold["tree_before"]], [gold["tree_after"]], [gold["reward"]],
                             [gold["done"]])[0]  # fmt: skip
        keys = COMPONENTS["web"]
    elif data_source == RT1:
        motion = {k + "s": [gold[k]] if k in gold else None for k in ("before_frame", "last_frame", "action")}
        row = rt1_frame_scores([solution_str], [gold["checkpoint"]], [gold["context_frame"]], [gold["next_frame"]],
                               **motion)[0]
        keys = COMPONENTS["rt1"]
    else:
        raise ValueError(f"unknown data_source {data_source!r}: rlvr_gym scores {TEXTGAME}, {WEB} and {RT1}")
    return {"score": float(row["score"]), "parsed": float("error" not in row), **{k: float(row.get(k, 0.0)) for k in keys}}


# ---------------------------------------------------------------------------------------------------- rt1


def _token_name(token_id: int) -> str:
    if token_id < V.CODEBOOK_SIZE:
        return f"<f{token_id}>"
    if token_id < V.ACTION_OFFSET + V.NUM_BINS:
        return f"<a{token_id - V.ACTION_OFFSET}>"
    return {V.FLAG_RUNNING: "<running>", V.FLAG_SUCCESS: "<success>", V.BOS: "<bos>", V.PAD: "<pad>"}[token_id]


RT1_TOKENS = [_token_name(i) for i in range(V.VOCAB_SIZE)]
"""The name of every world-model token id, in id order."""
RT1_IDS = {name: i for i, name in enumerate(RT1_TOKENS)}
TOKEN_PATTERN = re.compile(r"<[^<>\s]*>")


def rt1_token_text(ids) -> str:
    """World-model token ids as text, e.g. `<bos><f17>...<running><a200>...`."""
    return "".join(RT1_TOKENS[int(i)] for i in ids)


def rt1_token_ids(text: str) -> list[int]:
    """The ids named by `rt1_token_text`'s text; whitespace between names is ignored (decoders may add it)."""
    names = TOKEN_PATTERN.findall(text)
    if "".join(names) != "".join(text.split()):
        raise ValueError(f"text outside the token names: {TOKEN_PATTERN.sub('', text).strip()[:40]!r}")
    if unknown := [n for n in names if n not in RT1_IDS]:
        raise ValueError(f"{unknown[0]!r} is not a token of the rt1 world model")
    return [RT1_IDS[n] for n in names]


def rt1_tokenizer():
    """A `PreTrainedTokenizerFast` for the world model: vocabulary `RT1_TOKENS`, bos `<bos>`, eos and pad `<pad>`.

    Only `<bos>` and `<pad>` are special, so decoding with `skip_special_tokens=True` (as TRL and verl do) keeps
    every frame code and flag. Its chat template is the messages' content alone, so verl's chat rendering of an
    exported prompt tokenizes to exactly the world model's prompt ids. Text that is not token names is refused.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(RT1_IDS, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(TOKEN_PATTERN.pattern), behavior="isolated")]
    )
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<pad>", pad_token="<pad>")
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    return tokenizer


def encode_frame(frame: np.ndarray) -> bytes:
    """A uint8 (64, 64, 3) frame as PNG bytes (lossless; about a fifth of the raw size)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(frame, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def decode_frame(data: bytes | str) -> np.ndarray:
    """A frame from PNG bytes (TRL columns) or their base64 text (verl ground truth)."""
    from PIL import Image

    frame = np.asarray(Image.open(io.BytesIO(base64.b64decode(data) if isinstance(data, str) else data)).convert("RGB"))
    if frame.shape != FRAME_SHAPE:
        raise ValueError(
            f"frames must be {FRAME_SHAPE} RGB, got {frame.shape}: export the data with `rlvr-gym export --domain rt1`"
        )
    return frame


@functools.lru_cache(maxsize=4)
def rt1_world(checkpoint: str):
    """The robot world model (shipped name or directory) whose frame tokenizer decodes the completions."""
    from rlvr_gym.models.robot_world_model import RobotWorldModel

    return RobotWorldModel.load(checkpoint)


def rt1_frame_scores(
    completions: list[str], checkpoints: list[str], context_frames: list, next_frames: list,
    before_frames: list | None = None, last_frames: list | None = None, actions: list | None = None,
) -> list[dict]:
    """`train rt1-rlvr`'s reward, single step: the completion's frame codes decoded by the checkpoint's frame
    tokenizer (against the episode's first frame) and refined by its motion refiner if it has one (from the real
    frames t-1 and t and action t: `before_frames`, `last_frames`, `actions`), scored -(L1 + LPIPS) against the real
    next frame.

    Returns `{"score", "l1", "lpips"}` per completion, or `{"score": RT1_PARSE_FAILURE, "error"}`.
    """
    from rlvr_gym.domains.robot import frame_reward_fn

    results: list[dict] = [{}] * len(completions)
    ids = {}
    for i, text in enumerate(completions):
        try:
            ids[i] = rt1_token_ids(text)
        except ValueError as error:
            results[i] = {"score": RT1_PARSE_FAILURE, "error": str(error)}
    for checkpoint in dict.fromkeys(checkpoints[i] for i in ids):
        rows = [i for i in ids if checkpoints[i] == checkpoint]
        world = rt1_world(checkpoint)
        motion = before_frames is not None and last_frames is not None and actions is not None
        if world.refiner is not None and not motion:
            raise ValueError(f"{checkpoint} refines its frames by motion: the reward needs before_frame, last_frame "
                             "and action (frames t-1 and t and action t; `rlvr-gym export` writes them)")
        # frame_reward_fn reads an episode's frames t - 1, t (the motion refiner's), t + 1 (the real next frame) and
        # 0 (the tokenizer's context), and action t: here t = 2.
        episodes = []
        for i in rows:
            first = decode_frame(context_frames[i])
            before, last = (decode_frame(before_frames[i]), decode_frame(last_frames[i])) if motion else (first, first)
            action = np.zeros((3, 7), np.float32)
            if motion:
                action[2] = np.asarray(actions[i], dtype=np.float32)
            episodes.append(SimpleNamespace(frames=np.stack([first, before, last, decode_frame(next_frames[i])]),
                                            actions=action))
        reward = frame_reward_fn(world, episodes, horizon=1)
        for i, row in zip(rows, reward([ids[i] for i in rows], range(len(rows)), [2] * len(rows))):
            results[i] = {**row, "score": RT1_PARSE_FAILURE} if "error" in row else row
    return results

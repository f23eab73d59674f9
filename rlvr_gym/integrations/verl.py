"""The domain rewards as verl's custom reward function (`custom_reward_function.name=compute_score`).

verl's reward manager calls `compute_score(data_source, solution_str, ground_truth, extra_info)` once per response;
`ground_truth` is the JSON string that `export --format verl` writes into `reward_model.ground_truth`:
- rlvr_gym/textgame: `{"current": state, "next": state, "metric": "binary" | "task"}`;
- rlvr_gym/web: `{"tree_before": str, "tree_after": str, "reward": float, "done": bool}`.

The result is `{"score": float, "parsed": 1.0 | 0.0, components...}` with the same keys for every response of a
data source (verl stacks each key across the batch), components 0.0 when the response does not parse.
"""

from __future__ import annotations

import json

from rlvr_gym.domains import textgame, web

TEXTGAME, WEB = "rlvr_gym/textgame", "rlvr_gym/web"
TEXTGAME_REWARDS = {"binary": textgame.binary_reward, "task": textgame.task_reward}
# Components per reward; a response that does not parse gets 0.0 for each, so every row has the same keys.
COMPONENTS = {
    "binary": (),
    "task": ("property_acc", "changed_property_acc", "score_acc", "exact"),
    "web": ("f1", "precision", "recall", "reward_ok", "done_ok"),
}


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
    else:
        raise ValueError(f"unknown data_source {data_source!r}: rlvr_gym scores {TEXTGAME} and {WEB}")
    return {"score": float(row["score"]), "parsed": float("error" not in row), **{k: float(row.get(k, 0.0)) for k in keys}}

"""Real web episodes replayed on a world model's own pages: the outcome head's data for the pages it will read.

    rlvr-gym replay web --checkpoint web-refit --data runs/web/random15 --out runs/web/random15-on-web-refit

In `RLVRWorld-Web-v0` the outcome head reads the page the LM drew, not the real one: after a checkbox is toggled
twice, or a name typed twice into a box, the drawn page may show what the real one does not, and a head trained on
real pages alone pays the episode (the exploit probe's uniform-random play). Each recorded episode's actions are
played again from its real first page, open loop, on the pages the world model draws (greedy, as the env draws
them), and each step is written with the drawn page before it and the real reward and done after it: DAgger's
relabelling, with the real env as the expert. An episode stops early where the simulator would: an action that
names no element of the drawn page, or a prediction that fails.

The output is a web dataset (`rlvr_gym.data.web`) whose manifest says whose pages they are (`MODEL_PAGES`); the
outcome trainer takes it with `--data`, and the page trainers and `eval web` refuse it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from envs.web import task_done
from rlvr_gym.data.web import MANIFEST, MODEL_PAGES, episodes, load_web_data
from rlvr_gym.data.web_collect import command_line
from rlvr_gym.files import atomic_write_jsonl_gz, atomic_write_text, path_label
from rlvr_gym.sim.web import DEFAULT_CHECKPOINT, WebWorldModel

log = logging.getLogger("rlvr_gym")


@dataclass
class ReplayConfig:
    data: str = "runs/web/train"
    """A recorded web dataset (`rlvr-gym collect web`): the episodes whose actions are replayed."""
    checkpoint: str = DEFAULT_CHECKPOINT
    """The web world model that draws the pages (shipped name or directory); its outcome head is not used."""
    out: str = ""
    """Output directory; empty: DATA-on-CHECKPOINT."""
    batch_size: int = 32
    """Predictions per batched model call (one step of many episodes)."""
    max_new_tokens: int = 768
    """Tokens a predicted diff may take, as the env's `max_new_tokens`."""
    overwrite: bool = False


def replay_web(config: ReplayConfig) -> Path:
    """Write `config.data`'s episodes on the world model's pages; returns the output directory."""
    records, manifest = load_web_data(config.data)
    if MODEL_PAGES in manifest:
        raise ValueError(f"{config.data} is already a replay (on {manifest[MODEL_PAGES]['checkpoint']}): replay the "
                         "recorded dataset it came from")  # fmt: skip
    out = Path(config.out or f"{config.data.rstrip('/')}-on-{path_label(config.checkpoint)}")
    if (out / MANIFEST).exists() and not config.overwrite:
        raise FileExistsError(f"{out} already holds a web dataset ({MANIFEST}): pick another --out or pass --overwrite")
    world = WebWorldModel(config.checkpoint, max_new_tokens=config.max_new_tokens, batch_size=config.batch_size,
                          outcome_head=False)
    todo = episodes(records)
    pages = [steps[0]["tree_before"] for steps in todo]
    written: dict[str, list[dict]] = {task: [] for task in manifest["tasks"]}
    stopped = 0
    with tqdm(total=len(records), desc="replay web", unit="step") as bar:
        alive = list(range(len(todo)))
        step = 0
        while alive:
            current = [todo[i][step] for i in alive]
            predictions = world.predict_each([r["utterance"] for r in current], [pages[i] for i in alive],
                                             [r["action"] for r in current])  # fmt: skip
            still = []
            for i, record, prediction in zip(alive, current, predictions):
                if prediction.error is not None:  # the simulator truncates here, unpaid: no outcome to learn
                    stopped += 1
                    bar.update(len(todo[i]) - step)
                    continue
                written[record["task"]].append({**record, "tree_before": pages[i], "tree_after": prediction.tree})
                pages[i] = prediction.tree
                bar.update()
                if step + 1 < len(todo[i]):
                    still.append(i)
            alive, step = still, step + 1
    out.mkdir(parents=True, exist_ok=True)
    tasks = {}
    for task, entry in manifest["tasks"].items():
        atomic_write_jsonl_gz(out / entry["file"], written[task])
        # An episode stopped early keeps the steps before the stop, so its real success may not be among them.
        tasks[task] = {**entry, "transitions": len(written[task]),
                       "successes": sum(r["done"] and task_done(r["reward"]) for r in written[task])}
    total = sum(e["transitions"] for e in tasks.values())
    # The collection's own config stays; its timing does not describe this dataset.
    kept = {k: v for k, v in manifest.items() if k not in ("tasks", "transitions", "seconds", "transitions_per_s")}
    replayed = {**kept, "tasks": tasks,
                "transitions": total,
                MODEL_PAGES: {"checkpoint": str(config.checkpoint), "data": config.data,
                              "episodes_stopped_early": stopped},
                "command": command_line(["rlvr-gym", "replay", "web"], config)}  # fmt: skip
    atomic_write_text(out / MANIFEST, json.dumps(replayed, indent=1))
    log.info("wrote %d of %d transitions on %s's pages to %s (%d episodes stopped where the simulator would)",
             total, len(records), config.checkpoint, out, stopped)  # fmt: skip
    return out

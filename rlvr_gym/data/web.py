"""Web datasets: real MiniWoB++ transitions recorded in Chromium, the byte-level BPE trained on them, and the prompts
and targets a web world model reads and writes.

Collection (`rlvr_gym.data.web_collect`). `collect web` records (tree, action, next tree, reward, done) transitions with `envs.web`'s scripted
policies at several skills (a skill below 1 takes random actions that often), and with `--policies` the trivial
moves of `envs.web.solvers.TRIVIAL_POLICIES` (the exploit probe's), several browsers in parallel processes. Episode
i of a task in a collection with `--seed` s plays MiniWoB seed `s * 1_000_000 + i`, so sets collected with different
seeds share no page; the trainers and `eval web` check it from the manifests. By default the training set covers
11 of the 13 tasks and two are held out entirely (`HELDOUT_TASKS`):
- `enter-text` (type a word into a text field, press Submit): login-user types into text fields and presses a
  button, search-engine types into a search box;
- `click-collapsible-2` (expand sections, click a link in one): click-tab-2 reveals hidden panels, whose first line
  loses `hidden: true`, in the same way, and click-link / click-tab-2 click links inside text.
A dataset is one directory: `<task>.jsonl.gz` per task (one transition per line: utterance, tree_before, action,
tree_after, reward, done, task, seed, step, skill, policy, truncated) and `manifest.json` (tasks with their seeds and
counts, the config, the command, timing), written last.

Examples. An example is one transition: prompt = `format_prompt(utterance, tree, action)` after the bos token,
target = `format_target(diff, reward, done)` and the eos token. The from-scratch tokenizer is a byte-level BPE whose
pre-tokens keep an element id (`[12]`) and a state property (` hidden: true`) whole, so each can be one token.
Prompts and targets are never truncated (a cut tree makes the diff refer to lines the model never saw): examples
over the limits are dropped and counted (the default 1,536 / 768 tokens keep 8,103 of the 8,121 training transitions).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Regex, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from envs.web import TASKS
from envs.web.tree import normalise_tree
from rlvr_gym.data.textgame import length_stats, train_tokenizer
from rlvr_gym.domains.web import format_prompt, format_target, make_diff
from rlvr_gym.files import atomic_write_text

log = logging.getLogger(__name__)

FORMAT, FORMAT_VERSION = "rlvr-gym-web-transitions", 1
HELDOUT_TASKS = ("enter-text", "click-collapsible-2")
"""Tasks left out of the default training set (why these two: module docstring)."""
TRAIN_TASKS = tuple(t for t in TASKS if t not in HELDOUT_TASKS)
SEEDS_PER_RUN = 1_000_000
"""Episode i of a task in a collection with seed s plays MiniWoB seed s * SEEDS_PER_RUN + i."""
MANIFEST = "manifest.json"
TRAINING_RECORD = "web_training.json"
"""Written beside a trained model: the tasks and (task, seed) episodes it was trained on."""


def read_manifest(data_dir: str | os.PathLike) -> dict:
    """A web dataset's manifest, checked for format and version."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{data_dir}: no {MANIFEST}, so not a web dataset (or its collection was interrupted); "
            f"record one with `rlvr-gym collect web --out {data_dir}`"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); collect the dataset again") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: format {manifest.get('format')!r} version {manifest.get('version')!r}, this rlvr-gym reads "
            f"{FORMAT!r} version {FORMAT_VERSION}; collect the dataset again"
        )
    return manifest


def load_web_data(data_dir: str | os.PathLike) -> tuple[list[dict], dict]:
    """All transitions of a web dataset in task order, and its manifest."""
    manifest = read_manifest(data_dir)
    records = []
    for task, entry in manifest["tasks"].items():
        path = Path(data_dir) / entry["file"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: listed in {MANIFEST} but missing; copy the whole dataset directory")
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                part = [json.loads(line) for line in f if line.strip()]
        except (OSError, EOFError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: corrupt ({type(e).__name__}: {e}); collect the dataset again") from None
        if len(part) != entry["transitions"]:
            raise ValueError(f"{path}: holds {len(part)} transitions, {MANIFEST} says {entry['transitions']}")
        for record in part:  # datasets recorded before hidden subtrees were marked once read the same
            for key in ("tree_before", "tree_after"):
                record[key] = normalise_tree(record[key])
        records += part
    return records, manifest


MODEL_PAGES = "model_pages"
"""Manifest key of a dataset whose pages a world model drew (`rlvr-gym replay web`): its value names the model. Its
outcomes are real, its pages are not, so only an outcome head trains on it."""


def check_real_pages(manifest: dict, directory: str | os.PathLike, use: str) -> None:
    """Refuse a dataset of model-drawn pages for `use` (training or scoring a page predictor)."""
    if MODEL_PAGES in manifest:
        raise ValueError(
            f"{directory}: its pages were drawn by {manifest[MODEL_PAGES]['checkpoint']} (`rlvr-gym replay web`), "
            f"not recorded: only an outcome head trains on it, not {use}"
        )


def episodes_of(manifest: dict) -> dict[str, list[int]]:
    """task -> MiniWoB seeds of the episodes a dataset holds."""
    return {task: list(entry["seeds"]) for task, entry in manifest["tasks"].items()}


def episodes(records: Sequence[dict]) -> list[list[dict]]:
    """Records grouped by episode (task, seed), each in step order; a dataset holds each episode once, so its steps
    must not repeat."""
    grouped: dict[tuple[str, int], list[dict]] = {}
    for record in records:
        grouped.setdefault((record["task"], record["seed"]), []).append(record)
    out = [sorted(steps, key=lambda r: r["step"]) for steps in grouped.values()]
    for steps in out:
        for a, b in zip(steps, steps[1:]):
            if a["step"] == b["step"]:
                raise ValueError(f"{a['task']} seed {a['seed']} holds step {a['step']} twice: a dataset records each "
                                 "episode once")  # fmt: skip
    return out


def earlier_actions(records: Sequence[dict]) -> list[list[str]]:
    """For each record, the actions its episode took before it, in step order."""
    before: dict[int, list[str]] = {}
    for steps in episodes(records):
        for k, record in enumerate(steps):
            before[id(record)] = [r["action"] for r in steps[:k]]
    return [before[id(r)] for r in records]


def load_train_and_eval(
    data: Sequence[str], eval_data: str, model_pages: bool = False
) -> tuple[list[dict], list[tuple[str, dict]], list[dict], dict | None]:
    """Training records of one or more datasets with their (directory, manifest) pairs, and held-out records and
    manifest (none when eval_data is empty); no two of the sets share an episode. Datasets of model-drawn pages
    (`MODEL_PAGES`) are refused unless `model_pages`."""
    if isinstance(data, (str, os.PathLike)):
        data = [data]
    train: list[dict] = []
    manifests: list[tuple[str, dict]] = []
    for directory in data:
        records, manifest = load_web_data(directory)
        if not model_pages:
            check_real_pages(manifest, directory, "a world model's pages")
        for other, other_manifest in manifests:
            check_disjoint_episodes(episodes_of(other_manifest), episodes_of(manifest), other, str(directory))
        train += records
        manifests.append((str(directory), manifest))
    if not train:
        raise ValueError(f"{', '.join(map(str, data))} holds no transitions: collect more episodes")
    if not eval_data:
        return train, manifests, [], None
    held_out, eval_manifest = load_web_data(eval_data)
    if not model_pages:
        check_real_pages(eval_manifest, eval_data, "a world model's pages")
    for directory, manifest in manifests:
        check_disjoint_episodes(episodes_of(manifest), episodes_of(eval_manifest), directory, eval_data)
    return train, manifests, held_out, eval_manifest


# GPT-2's pre-tokenizer pattern, after two of ours: an element id `[12]` and a state property ` hidden: true` are
# single pre-tokens, so BPE can make each one token (GPT-2's pattern splits them into 3 and 4 pieces). On the
# held-out set this cuts prompt + target tokens by 25% at a 2,048-token vocabulary.
TREE_PRETOKENS = (
    r"\[\d+\]| [a-z]+: (?:true|false|\d+)"
    r"|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)


def train_web_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """`train_tokenizer` with tree ids and state properties as pre-tokens."""
    return train_tokenizer(texts, vocab_size, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TREE_PRETOKENS), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]))  # fmt: skip


def transition_texts(records: Sequence[dict]) -> Iterator[str]:
    for r in records:
        yield prompt_text(r)
        yield target_text(r)


def encode_examples(
    records: Sequence[dict], tokenizer: PreTrainedTokenizerBase, max_prompt_tokens: int, max_target_tokens: int
) -> tuple[list[dict], dict]:
    """Trainer examples (`prompt_ids`, `target_ids` ending in eos, and the columns `web_reward` reads), dropping
    those over the limits; and the length distribution before dropping, overall and per task."""
    prompts, targets = encode_prompts(tokenizer, records), encode_targets(tokenizer, records)
    examples, dropped = [], {}
    for r, p, y in zip(records, prompts, targets):
        if len(p) > max_prompt_tokens or len(y) > max_target_tokens:
            dropped[r["task"]] = dropped.get(r["task"], 0) + 1
            continue
        examples.append({
            "prompt_ids": p, "target_ids": y, "tree_before": r["tree_before"], "tree_after": r["tree_after"],
            "reward": r["reward"], "done": r["done"],
        })  # fmt: skip
    per_task = {}
    for task in dict.fromkeys(r["task"] for r in records):
        index = [i for i, r in enumerate(records) if r["task"] == task]
        per_task[task] = {
            "prompt_tokens": length_stats([len(prompts[i]) for i in index]),
            "target_tokens": length_stats([len(targets[i]) for i in index]),
            "dropped_too_long": dropped.get(task, 0),
        }
    stats = {
        "prompt_tokens": length_stats([len(p) for p in prompts]),
        "target_tokens": length_stats([len(y) for y in targets]),
        "max_prompt_tokens": max_prompt_tokens,
        "max_target_tokens": max_target_tokens,
        "dropped_too_long": sum(dropped.values()),
        "kept": len(examples),
        "per_task": per_task,
    }
    return examples, stats


def write_training_record(model_dir: Path, manifests: Sequence[tuple[str, dict]], base: dict | None = None) -> None:
    """web_training.json beside a trained model: the tasks and episodes of its data and of the model it started
    from."""
    seeds = {task: list(s) for task, s in (base or {}).get("seeds", {}).items()}
    for _, manifest in manifests:
        for task, task_seeds in episodes_of(manifest).items():
            seeds[task] = sorted(set(seeds.get(task, [])) | set(task_seeds))
    record = {
        "tasks": sorted(t for t, s in seeds.items() if s),
        "data": [*(base or {}).get("data", []), *(path for path, _ in manifests)],
        "seeds": seeds,
    }
    atomic_write_text(model_dir / TRAINING_RECORD, json.dumps(record))


def prompt_text(record: dict) -> str:
    """The model's input for a recorded transition: task, tree before, action."""
    return format_prompt(record["utterance"], record["tree_before"], record["action"])


def target_text(record: dict) -> str:
    """The gold output for a recorded transition: its diff, reward and done."""
    return format_target(make_diff(record["tree_before"], record["tree_after"]), record["reward"], record["done"])


def encode_prompts(tokenizer: PreTrainedTokenizerBase, records: Sequence[dict]) -> list[list[int]]:
    """Token ids of each transition's prompt, after the bos token when the tokenizer has one."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [bos + ids for ids in tokenizer([prompt_text(r) for r in records], add_special_tokens=False)["input_ids"]]


def encode_targets(tokenizer: PreTrainedTokenizerBase, records: Sequence[dict]) -> list[list[int]]:
    """Token ids of each transition's gold output, ending with the eos token the sampler stops on."""
    ids = tokenizer([target_text(r) for r in records], add_special_tokens=False)["input_ids"]
    return [y + [tokenizer.eos_token_id] for y in ids]


def subsample(records: Sequence[dict], limit: int, seed: int) -> list[dict]:
    """A seeded random `limit` of the records in their order (all when limit is 0)."""
    if limit <= 0 or limit >= len(records):
        return list(records)
    keep = sorted(random.Random(seed).sample(range(len(records)), limit))
    return [records[i] for i in keep]


def read_training_record(model_dir: str | os.PathLike) -> dict | None:
    """The tasks and episodes a model directory was trained on (`web_training.json` in it), or None."""
    path = Path(model_dir) / TRAINING_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); delete it and pass --seen-tasks") from None
    if not isinstance(record.get("tasks"), list) or not isinstance(record.get("seeds"), dict):
        raise ValueError(f"{path} lacks 'tasks' (a list) or 'seeds' (task -> seeds); delete it and pass --seen-tasks")
    return record


def check_disjoint_episodes(a: dict[str, Sequence[int]], b: dict[str, Sequence[int]], what_a: str, what_b: str) -> None:
    """Raise ValueError if two sets of episodes (task -> MiniWoB seeds) share a (task, seed): the same page."""
    shared = [(task, s) for task in sorted(set(a) & set(b)) for s in sorted(set(a[task]) & set(b[task]))]
    if shared:
        examples = ", ".join(f"{t} seed {s}" for t, s in shared[:3])
        raise ValueError(
            f"{what_a} and {what_b} share {len(shared)} episodes ({examples}): collect each set with its own --seed "
            "(held-out episodes must be new pages, and two training sets would repeat pages)"
        )

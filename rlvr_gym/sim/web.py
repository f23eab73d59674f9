"""The learned web simulator: a web world model (any HF causal LM trained by `train web-sft` / `web-rlvr`) as a
Gymnasium env over MiniWoB++ pages, and a wrapper that gives SB3 a discrete action over the page's elements.
(Longer than 500 lines: the start pages, the batched predictor, the env and its SB3 wrapper are one contract.)

A web checkpoint directory (HF model + tokenizer) also holds the real pages the simulator starts from, written by
`write_start_pages` from the real MiniWoB++ env (held-out seeds: neither the training nor the held-out set holds them):
    web_start_pages.json   {"format", "version", "pages": [{"task", "seed", "utterance", "tree"}, ...]}
    outcome/               optional: the outcome head the reward and done come from (`rlvr_gym.models.web_outcome`)

No browser runs here except in `write_start_pages`; the module still imports `envs.web` (and so selenium and
miniwob) for the tree and action formats it shares with the real env, as `rlvr_gym.evaluation.web` does for the
prompt encoding it shares with the trainer.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym
import numpy as np
import torch

from envs.web import TASKS, InvalidAction, WebTaskEnv, parse, parse_action
from envs.web.solvers import TEXT_FIELD_ROLES, candidate_actions
from envs.web.tree import normalise_tree
from rlvr_gym.data.real_env_versions import check_real_env_versions, write_real_env_versions
from rlvr_gym.data.web import encode_prompts
from rlvr_gym.domains.web import apply_diff, expand_diff, parse_target
from rlvr_gym.files import atomic_write_text
from rlvr_gym.models.lm import CheckpointError, checked_tokenizer, context_length, load_model, resolve_checkpoint
from rlvr_gym.models.sampler import sample_texts
from rlvr_gym.models.web_outcome import OUTCOME_DIR, Outcome, OutcomeHead
from rlvr_gym.sim.discrete import action_mask, stable_bucket

START_PAGES = "web_start_pages.json"
START_PAGES_FORMAT, START_PAGES_VERSION = "rlvr-gym-web-start-pages", 1
DEFAULT_CHECKPOINT = "web-outcome"
"""web-refit's LM (web-rlvr refit on the real outcomes of the exploit probe's moves) with an outcome head that reward
and done come from: the learned env whose outcomes match the real pages' on the probe's moves (its card)."""
START_SEEDS = tuple(range(2_000_000, 2_000_008))
"""MiniWoB seeds of the shipped start pages: collection seed 2's block (the training set used 0, the held-out set 1;
`eval web` collects fresh episodes from this block by default, which is harmless: start pages are not trained on)."""
MAX_TEXT_CHARS = 1 << 20
MAX_ACTION_CHARS = 1024
REPLACEMENT_CHAR = "\ufffd"
TEXT_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \t\n" + REPLACEMENT_CHAR
"""What MiniWoB++'s pages and utterances are written in (ASCII: the shipped start pages and every task's HTML hold no
other character), plus U+FFFD, which stands in for any other character a page or a decoded completion holds, so
observations always lie in the Text space."""
_WORD = re.compile(r"[a-z0-9]+")
_OUTSIDE_CHARSET = re.compile(f"[^{re.escape(TEXT_CHARSET)}]")


# ---------------------------------------------------------------------------------------------------- start pages


@dataclass
class StartPage:
    """A real MiniWoB page at the start of an episode."""

    task: str
    seed: int
    """The MiniWoB seed that generated it: `envs.web.WebTaskEnv(task).reset(seed=seed)` shows the same page."""
    utterance: str
    tree: str


def write_start_pages(
    checkpoint_dir: str | os.PathLike,
    tasks: Sequence[str] | None = None,
    seeds: Sequence[int] = START_SEEDS,
    env: WebTaskEnv | None = None,
) -> Path:
    """Reset the real MiniWoB env on every (task, seed) and store the pages as CHECKPOINT_DIR/web_start_pages.json.

    `tasks` defaults to all of `envs.web.TASKS`; pass `env` to use a browser you already have (it is left open).
    """
    tasks = list(TASKS if tasks is None else tasks)
    if not tasks or not seeds:
        raise ValueError(f"need at least one task and one seed, got tasks {tasks} and seeds {list(seeds)}")
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory: pass the checkpoint directory the pages go with")
    own_env = env is None
    env = WebTaskEnv(tasks[0]) if own_env else env
    pages = []
    try:
        for task in tasks:
            if env.task != task:
                env.load_task(task)
            for seed in seeds:
                utterance, tree, _ = env.reset(seed=int(seed))
                pages.append({"task": task, "seed": int(seed), "utterance": utterance, "tree": tree})
    finally:
        if own_env:
            env.close()
    path = directory / START_PAGES
    atomic_write_text(path, json.dumps({"format": START_PAGES_FORMAT, "version": START_PAGES_VERSION, "pages": pages}))
    write_real_env_versions(directory, "web")
    return path


def load_start_pages(checkpoint: str | os.PathLike) -> list[StartPage]:
    """The start pages shipped with a checkpoint (a shipped name or a directory)."""
    path = resolve_checkpoint(checkpoint) / START_PAGES
    fix = "write them with rlvr_gym.sim.web.write_start_pages(checkpoint_dir)"
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has no {START_PAGES}: the simulator has no real page to start from; {fix}")
    try:
        data = json.loads(path.read_text())
        if data.get("format") != START_PAGES_FORMAT or data.get("version") != START_PAGES_VERSION:
            raise ValueError(f"format {data.get('format')!r} version {data.get('version')!r}")
        pages = [
            StartPage(str(p["task"]), int(p["seed"]), str(p["utterance"]), normalise_tree(str(p["tree"])))
            for p in data["pages"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{path} is not a start-page file of this version ({error}): {fix}") from None
    if not pages:
        raise CheckpointError(f"{path} holds no pages: {fix}")
    check_real_env_versions(path.parent, "web")
    return pages


# ---------------------------------------------------------------------------------------------------- pages and actions


def in_charset(text: str) -> str:
    """`text` with every character outside `TEXT_CHARSET` replaced by U+FFFD."""
    return _OUTSIDE_CHARSET.sub(REPLACEMENT_CHAR, text)


def observation_text(utterance: str, tree: str) -> str:
    """The env's observation: the task line, then the tree (the model's prompt without the action)."""
    return in_charset(f"Task: {utterance}\n{tree}")


def check_action(action: str, tree: str) -> str | None:
    """Why the action cannot be taken on the page (it does not parse, or names an id not in the tree), or None."""
    try:
        _, node_id, _ = parse_action(action)
    except InvalidAction as error:
        return str(error)
    if node_id not in {node.id for node in parse(tree)}:
        return f"no element [{node_id}] in the current tree: use an id from its lines"
    return None


def words(text: str) -> set[str]:
    """Lower-case alphanumeric words."""
    return set(_WORD.findall(text.lower()))


def visible_words(tree: str) -> set[str]:
    """Words of the names and values of the tree's visible lines."""
    return set().union(*(words(f"{n.name} {n.props.get('value', '')}") for n in parse(tree) if not n.hidden))


# ---------------------------------------------------------------------------------------------------- the model


@dataclass
class Prediction:
    """What the world model says an action does to a page."""

    action: str
    tree: str
    """The next tree (the current one when there is an error)."""
    reward: float
    done: bool
    changed: int
    """Lines the predicted diff changes (new + deleted + updated, line by line: `expand_diff`)."""
    text: str
    """The model's completion ('' when the action was refused before the model ran)."""
    error: str | None = None


class WebWorldModel:
    """A web world model checkpoint: predicts, for a page and several actions, each action's next page, reward and
    done, with one batched `sample_texts` call. The reward and done come from the checkpoint's outcome head
    (CHECKPOINT/outcome/, `rlvr_gym.models.web_outcome`) when it has one and `outcome_head` is on, from the LM's own
    Reward and Done lines otherwise."""

    def __init__(self, checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT, temperature: float = 0.0,
                 max_new_tokens: int = 768, batch_size: int = 32, outcome_head: bool = True):  # fmt: skip
        if temperature < 0 or max_new_tokens < 1 or batch_size < 1:
            raise ValueError(
                f"temperature must be >= 0 (0 = greedy), max_new_tokens and batch_size >= 1; got {temperature}, "
                f"{max_new_tokens}, {batch_size}"
            )
        self.checkpoint = checkpoint
        model, tokenizer = load_model(checkpoint)
        self.tokenizer = checked_tokenizer(tokenizer, checkpoint)
        self.model = model.eval()
        head = resolve_checkpoint(checkpoint) / OUTCOME_DIR
        self.outcome = OutcomeHead(head, batch_size) if outcome_head and head.exists() else None
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        positions = context_length(model)
        self.max_prompt_tokens = positions - max_new_tokens
        if self.max_prompt_tokens < 1:
            raise ValueError(
                f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's {positions} positions: "
                "lower max_new_tokens"
            )

    def predict(self, utterance: str, tree: str, actions: Sequence[str], seed: int = 0, earlier: Sequence[str] = ()
                ) -> list[Prediction]:  # fmt: skip
        """One prediction per action on one page, after the episode's `earlier` actions: see `predict_each`."""
        n = len(actions)
        return self.predict_each([utterance] * n, [tree] * n, actions, seed, [earlier] * n)

    @torch.no_grad()
    def predict_each(self, utterances: Sequence[str], trees: Sequence[str], actions: Sequence[str], seed: int = 0,
                     earlier: Sequence[Sequence[str]] | None = None) -> list[Prediction]:  # fmt: skip
        """One prediction per (utterance, tree, action): the page from the LM, the reward and done from the outcome
        head when there is one. `earlier`: each one's episode's actions before it (none when not given), which a
        head that reads typed text needs. An action `check_action` refuses, a prompt longer than the model's
        context, and a completion that does not parse give an error instead."""
        earlier = earlier if earlier is not None else [()] * len(actions)
        out: list[Prediction | None] = []
        for action, tree in zip(actions, trees):
            error = check_action(action, tree)
            out.append(None if error is None else Prediction(action, tree, 0.0, False, 0, "", error))
        todo = [i for i, p in enumerate(out) if p is None]
        records = [{"utterance": utterances[i], "tree_before": trees[i], "action": actions[i]} for i in todo]
        prompts = encode_prompts(self.tokenizer, records) if records else []
        fits = []
        for i, prompt in zip(todo, prompts):
            if len(prompt) > self.max_prompt_tokens:
                out[i] = Prediction(actions[i], trees[i], 0.0, False, 0, "", f"the page is too long for the model: "
                                    f"{len(prompt)} prompt tokens, at most {self.max_prompt_tokens}")  # fmt: skip
            else:
                fits.append((i, prompt))
        if fits:
            completions = sample_texts(self.model, self.tokenizer, [p for _, p in fits], self.batch_size,
                                       self.max_new_tokens, temperature=self.temperature, seed=seed)  # fmt: skip
            rows = [i for i, _ in fits]
            heads = (self.outcome.predict_each([utterances[i] for i in rows], [trees[i] for i in rows],
                                               [actions[i] for i in rows], [earlier[i] for i in rows])
                     if self.outcome is not None else [None] * len(fits))  # fmt: skip
            for i, (text,), head in zip(rows, completions, heads):
                out[i] = self._outcome(actions[i], utterances[i], trees[i], text, head)
        return out  # type: ignore[return-value]

    @staticmethod
    def _outcome(action: str, utterance: str, tree: str, text: str, head: Outcome | None) -> Prediction:
        target, error = parse_target(text)
        if error is not None:
            return Prediction(action, tree, 0.0, False, 0, text, f"the model's output does not parse: {error}")
        next_tree = apply_diff(tree, target)
        if len(observation_text(utterance, next_tree)) > MAX_TEXT_CHARS:
            error = f"the predicted page exceeds the observation's {MAX_TEXT_CHARS} characters"
            return Prediction(action, tree, 0.0, False, 0, text, error)
        changed = sum(len(lines) for lines in expand_diff(tree, target).values())
        if head is not None:
            return Prediction(action, next_tree, head.reward, head.done, changed, text)
        return Prediction(action, next_tree, target["reward"], target["done"], changed, text)


def step_outcome(prediction: Prediction, steps: int, max_steps: int) -> tuple[float, bool, bool]:
    """(reward, terminated, truncated) of an env step the model predicted, `steps` steps into the episode.

    MiniWoB++ pays only when the episode ends, so a reward predicted without `Done: yes` is not paid: a page whose
    task is not over never pays out. A prediction that failed truncates the episode unpaid."""
    if prediction.error is not None:
        return 0.0, False, True
    terminated = prediction.done
    reward = float(np.clip(prediction.reward, -1.0, 1.0)) if terminated else 0.0
    return reward, terminated, not terminated and steps >= max_steps


# ---------------------------------------------------------------------------------------------------- the env


class WebWorldEnv(gym.Env):
    """MiniWoB++ pages (`envs.web.WebTaskEnv`) as a learned web world model predicts them.

    ## Description
    Each step asks the world model what the action does to the page: the predicted diff (new, deleted and updated
    lines) is applied to the current tree, and the predicted reward and done are the step's. No browser runs.

    ## Action Space
    `Text`: `click [id]` or `type [id] "text"` with an id from the current tree, as in the real env.
    `info["candidates"]` lists actions built from the page (clicks on visible elements of clickable roles; typing
    each quoted string of the utterance into each visible text field). An action that does not parse, or names an
    id that is not in the tree, is not passed to the model: the step does nothing (page unchanged, reward 0, the
    episode goes on; it counts towards `max_steps`) and `info["error"]` says why. (The real env raises
    `InvalidAction` there; ending the episode instead would fail gymnasium's `check_env`, which steps a random
    `Text` action and requires that it does not truncate.) A non-string action raises ValueError.

    ## Observation Space
    `Text(2**20, charset=TEXT_CHARSET)`: `Task: <utterance>` and the accessibility tree, one line per element
    (`[id] role 'name' props`, tab-indented), as the model's prompt shows them. The charset is printable ASCII, tab
    and newline (what MiniWoB++ pages are written in), and U+FFFD, which stands in for any other character.

    ## Rewards
    The predicted MiniWoB raw reward, clipped to [-1, 1] (the real env's range: 1 success, -1 failure, 0 before
    the end), paid only on the step the model predicts `Done: yes`: as in the real env, an episode that goes on
    pays nothing. Reward and done come from the checkpoint's outcome head when it has one (`outcome/`: a classifier
    trained on real outcomes alone, `rlvr-gym train web-outcome`; one trained with `--reads-typed` also reads what the
    episode has typed where, which a password box hides), otherwise from the LM's completion.

    ## Starting State
    A real page from the checkpoint's `web_start_pages.json`, drawn with `np_random` (only `task`'s pages when
    given); `reset(options={"index": i})` picks page i of that list.

    ## Episode End
    Terminated when the model predicts `Done: yes`. Truncated after `max_steps` steps, and (with reward 0, page
    unchanged, `info["error"]` set) when the model's output does not parse or the page outgrows the model's
    context: the simulation cannot go on from there.

    `info`: `tree` (the current tree), `candidates`, `error` (None, or why the action was refused or the episode
    cut), `task`, `seed` (the start page's MiniWoB seed), `step`, and after a step `prediction` (the completion).

    ## Arguments
    - `checkpoint`: a web world-model directory or shipped name (default "web-outcome").
    - `max_steps`: steps before truncation (default 10).
    - `temperature`: 0 for greedy predictions; > 0 samples them, seeded from `np_random` at reset, so the same
      reset seed gives the same rollout.
    - `task`: start only from this task's pages (default: all).
    - `max_new_tokens`: completion limit; a longer prediction does not parse.
    - `outcome_head`: take reward and done from the checkpoint's outcome head when it has one (default True);
      False reads them off the LM's completion.
    - `render_mode`: None or "ansi"; `render()` returns the observation text.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
        max_steps: int = 10,
        temperature: float = 0.0,
        task: str | None = None,
        max_new_tokens: int = 768,
        render_mode: str | None = None,
        outcome_head: bool = True,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be a positive number of steps, got {max_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        pages = load_start_pages(checkpoint)
        if task is not None and not any(p.task == task for p in pages):
            have = sorted({p.task for p in pages})
            raise ValueError(f"the checkpoint has no start pages of task {task!r}; it has {have}")
        self.pages = [p for p in pages if task is None or p.task == task]
        self.world = WebWorldModel(checkpoint, temperature, max_new_tokens, outcome_head=outcome_head)
        self.max_steps = max_steps
        self.temperature = temperature
        self.task = task
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Text(MAX_TEXT_CHARS, min_length=0, charset=TEXT_CHARSET)
        self.action_space = gym.spaces.Text(MAX_ACTION_CHARS, min_length=0, charset=TEXT_CHARSET)
        self.page: StartPage | None = None
        self.tree = ""
        self.steps = 0
        self.taken: list[str] = []
        """The episode's actions the model has predicted (refused ones left out: they change nothing)."""
        self._sample_seed = 0
        self._over = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        index = (options or {}).get("index")
        # Drawn even when an index is given or decoding is greedy, so a seed's rollout never depends on either.
        drawn = int(self.np_random.integers(len(self.pages)))
        self._sample_seed = int(self.np_random.integers(2**31 - 1))
        if index is None:
            index = drawn
        elif not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.pages):
            raise ValueError(f"options['index'] must be an int in [0, {len(self.pages)}), got {index!r}")
        self.page = self.pages[int(index)]
        self.tree = self.page.tree
        self.steps = 0
        self.taken = []
        self._over = False
        return self._observation(), self._info(None)

    def step(self, action: str):
        if self.page is None or self._over:
            raise RuntimeError("the episode is over (or never started): call reset() before step()")
        if not isinstance(action, str):
            raise ValueError(f'an action is a string, `click [id]` or `type [id] "text"`; got {type(action).__name__}')
        refused = check_action(action, self.tree)
        if refused is not None:
            return self.step_refused(refused)
        seed = self._sample_seed + self.steps
        prediction = self.world.predict(self.page.utterance, self.tree, [action], seed, self.taken)[0]
        self.steps += 1
        self.taken.append(action)
        self.tree = prediction.tree
        reward, terminated, truncated = step_outcome(prediction, self.steps, self.max_steps)
        self._over = terminated or truncated
        info = {**self._info(prediction.error), "prediction": prediction.text}
        return self._observation(), reward, terminated, truncated, info

    def step_refused(self, error: str):
        """A step that does nothing (the page unchanged, reward 0, `error` in info) without asking the model; it
        counts towards `max_steps`."""
        if self.page is None or self._over:
            raise RuntimeError("the episode is over (or never started): call reset() before step()")
        self.steps += 1
        truncated = self.steps >= self.max_steps
        self._over = truncated
        return self._observation(), 0.0, False, truncated, {**self._info(error), "prediction": ""}

    def render(self) -> str | None:
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode: make the env with render_mode='ansi'")
            return None
        return self._observation() if self.page is not None else ""

    @property
    def utterance(self) -> str:
        return self.page.utterance if self.page is not None else ""

    def _observation(self) -> str:
        return observation_text(self.page.utterance, self.tree)

    def _info(self, error: str | None) -> dict[str, Any]:
        return {
            "tree": self.tree,
            "candidates": candidate_actions(self.page.utterance, self.tree),
            "error": error,
            "task": self.page.task,
            "seed": self.page.seed,
            "step": self.steps,
        }


# ---------------------------------------------------------------------------------------------------- SB3 wrapper

_ROLE_GROUPS = (
    frozenset({"button", "link", "tab", "menuitem", "option", "listitem", "treeitem"}),
    frozenset({"checkbox", "radio", "switch"}),
    TEXT_FIELD_ROLES,
    frozenset({"StaticText", "heading", "cell", "gridcell"}),
)
CANDIDATE_FEATURES = 3 + len(_ROLE_GROUPS) + 1 + 3
"""present, is a type action, share of the element's name words in the utterance; one flag per role group and one
for any other role; checked/selected/expanded/pressed true, the field has a value, the field's value is the text."""


class WebDiscreteEnv(gym.Wrapper):
    """`WebWorldEnv` for SB3: a `Discrete(max_candidates)` action picks one of `info["candidates"]`, and the
    observation is a fixed-size vector.

    ## Action Space
    `Discrete(max_candidates)`: index i takes the i-th candidate of the current page (tree order; candidates past
    `max_candidates` are out of reach). An index with no candidate is a step that does nothing, with
    `info["error"]`, as the unwrapped env does for an id not in the tree. `action_masks()` marks the valid indices
    (sb3-contrib's MaskablePPO reads it).

    ## Observation Space
    `Box(0, 1, (2 * hash_dim + max_candidates * CANDIDATE_FEATURES + 1,), float32)`: the utterance's words and the
    visible tree's words, each hashed into `hash_dim` presence flags; for each candidate slot the features of
    `CANDIDATE_FEATURES`; the fraction of `max_steps` used.
    """

    def __init__(self, env: gym.Env, max_candidates: int = 32, hash_dim: int = 64):
        super().__init__(env)
        if max_candidates < 1 or hash_dim < 1:
            raise ValueError(f"max_candidates and hash_dim must be >= 1, got {max_candidates} and {hash_dim}")
        self.max_candidates = max_candidates
        self.hash_dim = hash_dim
        self.action_space = gym.spaces.Discrete(max_candidates)
        size = 2 * hash_dim + max_candidates * CANDIDATE_FEATURES + 1
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size,), np.float32)
        self.candidates: list[str] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = self.env.reset(seed=seed, options=options)
        return self._features(info), info

    def step(self, action):
        index = int(action)
        if 0 <= index < len(self.candidates):
            _, reward, terminated, truncated, info = self.env.step(self.candidates[index])
        else:
            error = f"no candidate {index}: the page has {len(self.candidates)} (see action_masks())"
            _, reward, terminated, truncated, info = self.env.unwrapped.step_refused(error)
        return self._features(info), reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        return action_mask(self.candidates, self.max_candidates)

    def _features(self, info: dict[str, Any]) -> np.ndarray:
        web = self.env.unwrapped
        self.candidates = info["candidates"][: self.max_candidates]
        utterance_words = words(web.utterance)
        x = np.zeros(self.observation_space.shape, np.float32)
        for word in utterance_words:
            x[stable_bucket(word, self.hash_dim)] = 1.0
        for word in visible_words(info["tree"]):
            x[self.hash_dim + stable_bucket(word, self.hash_dim)] = 1.0
        nodes = {node.id: node for node in parse(info["tree"])}
        base = 2 * self.hash_dim
        for i, action in enumerate(self.candidates):
            kind, node_id, text = parse_action(action)
            node = nodes[node_id]
            name_words = words(node.name)
            value = node.props.get("value", "")
            f = x[base + i * CANDIDATE_FEATURES : base + (i + 1) * CANDIDATE_FEATURES]
            f[0] = 1.0
            f[1] = float(kind == "type")
            f[2] = len(name_words & utterance_words) / len(name_words) if name_words else 0.0
            group = next((g for g, roles in enumerate(_ROLE_GROUPS) if node.role in roles), len(_ROLE_GROUPS))
            f[3 + group] = 1.0
            f[-3] = float(any(node.props.get(k) == "true" for k in ("checked", "selected", "expanded", "pressed")))
            f[-2] = float(bool(value))
            f[-1] = float(text is not None and value == text)
        x[-1] = web.steps / web.max_steps
        return x

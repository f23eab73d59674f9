"""A MiniWoB++ task in Chromium, observed as an accessibility tree and driven by text actions over tree ids."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import urllib3
from miniwob.action import ActionSpaceConfig, ActionTypes
from miniwob.reward import get_raw_reward
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.remote.webdriver import WebDriver

from envs.web import tree
from envs.web.browser import MiniWoBBrowserEnv

log = logging.getLogger(__name__)

TASKS = (
    "click-test-2",
    "click-button",
    "click-link",
    "focus-text",
    "enter-text",
    "login-user",
    "click-checkboxes",
    "click-tab-2",
    "click-collapsible-2",
    "search-engine",
    "email-inbox",
    "choose-date",
    "book-flight",
)
BROWSER_ERRORS = (WebDriverException, urllib3.exceptions.HTTPError, OSError)
_ACTION = re.compile(r'^\s*(click|type)\s*\[(\d+)\](?:\s+"(.*)")?\s*$', re.DOTALL)
_ACTIONS = ActionSpaceConfig.get_preset("all_supported").action_types
_FURNITURE_JS = ", ".join(f"'{i}'" for i in tree.FURNITURE_IDS)
# A hash of the page outside MiniWoB's furniture (form values and focus included), and whether anything is still
# moving: jQuery effects, CSS animations, or a jQuery UI autocomplete whose search has not yet run after typing.
_PAGE_STATE_JS = f"""
const skip = new Set([{_FURNITURE_JS}]);
let s = '';
for (const el of document.body.children) if (!skip.has(el.id)) s += el.outerHTML;
for (const el of document.querySelectorAll('input, textarea, select'))
  s += '|' + (el.type === 'checkbox' || el.type === 'radio' ? el.checked : el.value);
const active = document.activeElement;
if (active) s += '|' + active.tagName + '#' + active.id + '.' + active.className;
let h = 0;
for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
const $ = window.jQuery;
let busy = !!($ && $.timers && $.timers.length);
if (document.getAnimations) busy = busy || document.getAnimations().some(a => a.playState === 'running');
const ac = $ && active && $(active).data('ui-autocomplete');
if (ac) busy = busy || (ac.term !== active.value && active.value.length >= ac.options.minLength);
return [h, busy];
"""
_OBJECT_GROUP = "rlvr-gym"  # handles to elements we act on, released at each reset
# MiniWoB acts on elements by the ref its last DOM scan gave them; scan again so the ref is current.
_REF_JS = """function() {
  const el = this.nodeType === 1 ? this : this.parentElement;
  if (!el || typeof core === 'undefined') return null;
  core.getDOMInfo();
  for (const ref in core.previousDOMInfo) if (core.previousDOMInfo[ref] === el) return +ref;
  return null;
}"""


class InvalidAction(ValueError):
    """An action that is not `click [id]` / `type [id] "text"`, or names an id not in the current tree."""


class BrowserError(RuntimeError):
    """The browser died mid-episode and replaying the episode in a fresh one did not reach the same page."""


def click(node_id: int) -> str:
    """The action text that clicks tree element `node_id`."""
    return f"click [{node_id}]"


def type_text(node_id: int, text: str) -> str:
    """The action text that clicks tree element `node_id` and types `text` into it."""
    return f'type [{node_id}] "{text}"'


def parse_action(action: str) -> tuple[str, int, str | None]:
    """`(kind, id, text)` from `click [id]` or `type [id] "text"`; raises InvalidAction with the expected form."""
    m = _ACTION.match(action) if isinstance(action, str) else None
    if m is None or (m.group(1) == "type") != (m.group(3) is not None):
        raise InvalidAction(f'cannot parse action {action!r}: write `click [id]` or `type [id] "text"` with an id from the tree')
    return m.group(1), int(m.group(2)), m.group(3)


def task_done(raw_reward: float) -> bool:
    """Whether an episode's MiniWoB raw reward says its task was done: full marks, 1. Every task here pays 1 or -1
    but click-checkboxes, which pays the share of boxes set right (as 2 x share - 1): a Submit that leaves one of
    five boxes wrong gets 0.6, its task not done (MiniWoB's `get_binary_reward` reads it the same way)."""
    return raw_reward >= 1.0


class WebTaskEnv:
    """A MiniWoB++ task in headless Chromium, seen as its accessibility tree and acted on by text.

    ## Description
    Farama's `miniwob` pages (shipped in its wheel) run in Debian's Chromium via Selenium. The observation is the
    page's accessibility tree as text (see `envs.web.tree`); actions name tree ids.

    ## Action Space
    A string: `click [id]`, or `type [id] "text"` (clicks the element, then types the text as key presses,
    appending to what the field holds). Both map to MiniWoB's element actions (CLICK_ELEMENT,
    FOCUS_ELEMENT_AND_TYPE_TEXT); a StaticText line acts on the element holding the text. An action that does not
    parse, or an id that is not in the current tree, raises `InvalidAction` and does not step. An element that
    is hidden or has no box on screen (MiniWoB only acts on visible elements) is a no-op step:
    `info["action_error"]` says why, and the page's clock still runs.

    ## Observation Space
    `tree_text`: lines `[id] role 'name' props`, indented by depth. Ids are short and stable within an episode:
    they count up from 1 in tree order as nodes first appear, and a node keeps its id while it lives.
    `reset` also returns the task's utterance. Each capture waits for the page to settle: no jQuery effect, CSS
    animation or pending autocomplete search, and an unchanged page over `quiet_s` (at most `settle_timeout_s`;
    `info["settled"]` is False if that ran out).

    ## Rewards
    MiniWoB's raw reward, not scaled by elapsed time: 0 until the episode ends, then the task's score in
    [-1, 1]. The task is done only at 1 (`task_done`): click-checkboxes pays partial credit below it.
    `info["env_reward"]` has the time-scaled one.

    ## Starting State
    The task generated from the episode's seed: `seed`, `seed + 1`, ... for successive resets; `reset(seed=s)`
    plays seed `s` and the next reset plays `s + 1`.

    ## Episode End
    Terminated when the task ends the episode (success, failure, or its own time limit: 10-30 s of wall time).
    Truncated after `max_steps` steps. The final tree is read after the final action: the page is still there.

    ## Arguments
    `task` (one of `TASKS`, or any MiniWoB page shipped with miniwob except flight.*), `seed`, `max_steps`,
    `quiet_s`, `settle_timeout_s`.
    If the browser dies mid-episode, it is restarted and the episode replayed from its seed and actions; if the
    replay does not reach the same tree, `BrowserError` is raised and the next `reset` starts clean.
    """

    def __init__(self, task: str, seed: int = 0, max_steps: int = 30, quiet_s: float = 0.04, settle_timeout_s: float = 2.0):
        self.task = task
        self.max_steps = max_steps
        self.quiet_s = quiet_s
        self.settle_timeout_s = settle_timeout_s
        self._next_seed = seed
        self._env = MiniWoBBrowserEnv(subdomain=task, reward_processor=get_raw_reward)
        self.utterance = ""
        self.nodes: list[tree.Node] = []
        self.seed: int | None = None
        self._ids: dict[int, int] = {}
        self._backend_of: dict[int, int] = {}
        self._actions: list[str] = []
        self._tree_text = ""
        self._done = True

    @property
    def driver(self) -> WebDriver:
        """The Selenium driver of the current browser (it changes when the browser is restarted)."""
        return self._env.driver

    def reset(self, seed: int | None = None) -> tuple[str, str, dict[str, Any]]:
        """Start an episode: `(utterance, tree_text, info)`."""
        self.seed = self._next_seed if seed is None else seed
        self._next_seed = self.seed + 1
        try:
            info = self._start_episode()
        except BROWSER_ERRORS as e:
            log.warning("browser failed during reset of %s (%s); restarting it", self.task, type(e).__name__)
            self._env.restart()
            info = self._start_episode()
        self._actions = []
        self._done = False
        return self.utterance, self._tree_text, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply a text action: `(tree_text, reward, terminated, truncated, info)`."""
        if self._done:
            raise RuntimeError("the episode is over: call reset() before step()")
        kind, node_id, text = parse_action(action)
        if node_id not in self._backend_of:
            raise InvalidAction(f"no element [{node_id}] in the current tree: use an id from its lines")
        restarted = False
        try:
            reward, terminated, info = self._act(kind, node_id, text)
        except BROWSER_ERRORS as e:
            log.warning("browser failed during a step of %s (%s); restarting and replaying", self.task, type(e).__name__)
            self._replay()
            try:
                reward, terminated, info = self._act(kind, node_id, text)
            except BROWSER_ERRORS as again:
                self._done = True
                raise BrowserError(f"the browser of {self.task} failed twice on {action!r}; call reset()") from again
            restarted = True
        self._actions.append(action)
        truncated = not terminated and len(self._actions) >= self.max_steps
        self._done = terminated or truncated
        info.update(task=self.task, seed=self.seed, step=len(self._actions), restarted=restarted)
        return self._tree_text, reward, terminated, truncated, info

    def load_task(self, task: str) -> None:
        """Switch this browser to another task (cheaper than a new env); call `reset` next."""
        try:
            self._env.load_task(task)
        except BROWSER_ERRORS:
            self._env.restart()
            self._env.load_task(task)
        self.task = task
        self._done = True

    def close(self) -> None:
        """Quit the browser."""
        try:
            self._env.close()
        except BROWSER_ERRORS:
            log.warning("browser of %s was already gone at close", self.task)

    def _start_episode(self) -> dict[str, Any]:
        obs, _ = self._env.reset(seed=self.seed)
        self.driver.execute_cdp_cmd("Runtime.releaseObjectGroup", {"objectGroup": _OBJECT_GROUP})
        self.utterance = obs["utterance"]
        self._ids = {}
        settled = self._capture()
        return {"task": self.task, "seed": self.seed, "fields": dict(obs["fields"]), "settled": settled}

    def _act(self, kind: str, node_id: int, text: str | None) -> tuple[float, bool, dict[str, Any]]:
        ref = self._ref(self._backend_of[node_id])
        action_error = None
        if ref is None:
            action_error = f"element [{node_id}] is hidden or has no box on screen; nothing was done"
            action = {"action_type": _ACTIONS.index(ActionTypes.NONE)}
        elif kind == "click":
            action = {"action_type": _ACTIONS.index(ActionTypes.CLICK_ELEMENT), "ref": ref}
        else:
            action = {"action_type": _ACTIONS.index(ActionTypes.FOCUS_ELEMENT_AND_TYPE_TEXT), "ref": ref, "text": text}
        # MiniWoB's own step also scans the whole DOM for its observation; we only need the action and the outcome.
        instance = self._env.instance
        instance.perform(action, self._env.action_space_config)
        meta = instance.get_metadata()
        reward, terminated = get_raw_reward(meta), meta["done"]
        settled = self._capture()
        info = {
            "raw_reward": meta["raw_reward"],
            "env_reward": meta["env_reward"],
            "reason": meta["reason"],
            "settled": settled,
        }
        if action_error:
            info["action_error"] = action_error
        return float(reward), bool(terminated), info

    def _ref(self, backend_id: int) -> int | None:
        obj = self.driver.execute_cdp_cmd("DOM.resolveNode", {"backendNodeId": backend_id, "objectGroup": _OBJECT_GROUP})
        result = self.driver.execute_cdp_cmd(
            "Runtime.callFunctionOn",
            {"objectId": obj["object"]["objectId"], "functionDeclaration": _REF_JS, "returnByValue": True},
        )
        return result["result"].get("value")

    def _capture(self) -> bool:
        settled = self._settle()
        nodes = tree.capture(self.driver)
        for node in nodes:
            node.id = self._ids.setdefault(node.backend_id, len(self._ids) + 1)
        self.nodes = nodes
        self._backend_of = {n.id: n.backend_id for n in nodes}
        self._tree_text = tree.serialise(nodes)
        return settled

    def _settle(self) -> bool:
        deadline = time.monotonic() + self.settle_timeout_s
        previous = None
        while True:
            state, busy = self.driver.execute_script(_PAGE_STATE_JS)
            if not busy and state == previous:
                return True
            if time.monotonic() > deadline:
                return False
            previous = state
            time.sleep(self.quiet_s)

    def _replay(self) -> None:
        seen = self._tree_text
        self._env.restart()
        self._start_episode()
        for action in self._actions:
            kind, node_id, text = parse_action(action)
            if node_id not in self._backend_of:
                break
            self._act(kind, node_id, text)
        if self._tree_text != seen:
            self._done = True
            raise BrowserError(
                f"the browser died mid-episode of {self.task} (seed {self.seed}) and replaying its "
                f"{len(self._actions)} actions in a fresh browser reached a different page; call reset()"
            )

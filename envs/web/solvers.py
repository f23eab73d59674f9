"""Scripted policies for the MiniWoB++ tasks, reading only the utterance and the tree text.

A policy sees what a learned simulator would show it (utterance and tree text), so the same policy can be scored
in the real env and in a learned one. `skill` in [0, 1] is the probability of acting as the expert at each step;
otherwise it takes a random action on a visible line (clicks, and random words typed into text fields), which
also covers wrong choices. An expert that finds no move for a state its script does not cover (e.g. after random
actions left a field with the wrong text) also acts at random. The expert reads hidden lines too (the tree shows
collapsed content), as a user who knows the page would. Targets come from miniwob's own field extractors, which
parse the utterance.

Where a page does not show its state in the accessibility tree (search-engine's current result page), the
policy remembers what it did in the episode: make a new policy, or call `reset`, per episode.

The trivial policies (`trivial_policy`) do not try to do the task: clicking the last button, submitting with nothing
filled, always the first candidate action, a uniform random candidate. The exploit probe runs them in a learned
simulator and in the real env, and recording their real transitions shows a world model what a wrong move is paid.
`fill_swapped` (recorded, not probed) fills a form the wrong way round: each of the task's texts in another field.
"""

from __future__ import annotations

import calendar
import random
import re
from collections.abc import Callable

from miniwob.fields import get_field_extractor

from envs.web.env import click, type_text
from envs.web.tree import Node, parse

INTERACTIVE_ROLES = frozenset(
    {"button", "link", "textbox", "searchbox", "checkbox", "radio", "tab", "option", "menuitem", "listitem", "image", "combobox"}
)
TEXT_FIELD_ROLES = frozenset({"textbox", "searchbox", "combobox"})
CLICK_ROLES = frozenset({
    "button", "link", "textbox", "searchbox", "combobox", "checkbox", "radio", "tab", "option", "menuitem",
    "listitem", "image", "StaticText", "cell", "gridcell", "switch", "treeitem", "heading",
})  # fmt: skip
TRIVIAL_POLICIES = ("click-last-button", "submit-with-nothing-filled", "first-candidate", "uniform-random")
MISTAKE_POLICIES = ("fill-swapped",)
"""Moves recorded so that a world model sees what a form filled the wrong way round is paid (`collect web
--policies`); the probe does not run them. login-user's password box shows only bullets, so the page alone does not
show such a login."""
MONTHS = tuple(calendar.month_name)[1:]
_QUOTED = re.compile(r'"([^"]+)"')
_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "okay", "submit", "2016", "Anvik", "hello")


class ScriptedPolicy:
    """`act(utterance, tree_text) -> action` for one MiniWoB task; expert with probability `skill`, else random."""

    def __init__(self, task: str, skill: float = 1.0, seed: int = 0):
        if task not in EXPERTS:
            raise ValueError(f"no scripted solver for task {task!r}; solvers exist for: {', '.join(sorted(EXPERTS))}")
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"skill must be in [0, 1], got {skill}")
        self.task = task
        self.skill = skill
        self.rng = random.Random(seed)
        self.memory: dict = {}
        self._fields = get_field_extractor(task)

    def reset(self) -> None:
        """Forget what was done in the last episode."""
        self.memory = {}

    def act(self, utterance: str, tree_text: str) -> str:
        nodes = parse(tree_text)
        if self.rng.random() >= self.skill:
            return random_action(nodes, self.rng)
        fields = dict(self._fields(utterance))
        return EXPERTS[self.task](fields, nodes, self.memory) or random_action(nodes, self.rng)


def random_action(nodes: list[Node], rng: random.Random) -> str:
    """A click on a random visible line (interactive roles 4x as likely), or a random word typed into a text field."""
    visible = [n for n in nodes[1:] if not n.hidden] or nodes
    weights = [4.0 if n.role in INTERACTIVE_ROLES else 1.0 for n in visible]
    node = rng.choices(visible, weights)[0]
    if node.role in TEXT_FIELD_ROLES and rng.random() < 0.7:
        return type_text(node.id, rng.choice(_WORDS))
    return click(node.id)


def quoted_strings(utterance: str) -> list[str]:
    """The utterance's double-quoted strings, in order, each once: the texts an agent may type."""
    return list(dict.fromkeys(_QUOTED.findall(utterance)))


def candidate_actions(utterance: str, tree: str) -> list[str]:
    """Actions an agent may take on the page, in tree order: `click [id]` on each visible element of a clickable
    role, and after a text field's click, `type [id] "text"` for each quoted string of the utterance."""
    texts = quoted_strings(utterance)
    actions = []
    for node in parse(tree):
        if node.hidden or node.role not in CLICK_ROLES:
            continue
        actions.append(click(node.id))
        if node.role in TEXT_FIELD_ROLES:
            actions += [type_text(node.id, text) for text in texts]
    return actions


def last_button(tree: str, name: str | None = None) -> str | None:
    """`click [id]` on the last visible button of the page (named `name`, case-insensitively, when given)."""
    buttons = [n for n in parse(tree) if n.role == "button" and not n.hidden
               and (name is None or n.name.strip().lower() == name)]  # fmt: skip
    return click(buttons[-1].id) if buttons else None


TrivialPolicy = Callable[[str, str], str | None]
"""(utterance, tree) -> action, or None when the policy has nothing to do on the page (the episode stops there)."""


def trivial_policy(name: str, seed: int = 0) -> TrivialPolicy:
    """The trivial policy `name` (one of `TRIVIAL_POLICIES` or `MISTAKE_POLICIES`); `seed` seeds uniform-random's
    draws."""
    if name == "click-last-button":
        return lambda _utterance, tree: last_button(tree)
    if name == "submit-with-nothing-filled":
        return lambda _utterance, tree: last_button(tree, "submit") or last_button(tree)
    if name == "first-candidate":
        return lambda utterance, tree: next(iter(candidate_actions(utterance, tree)), None)
    if name == "uniform-random":
        rng = random.Random(seed)
        return lambda utterance, tree: rng.choice(candidate_actions(utterance, tree) or [None])
    if name == "fill-swapped":
        return fill_swapped
    raise ValueError(f"unknown trivial policy {name!r}: choose from {', '.join(TRIVIAL_POLICIES + MISTAKE_POLICIES)}")


def fill_swapped(utterance: str, tree: str) -> str | None:
    """The task's quoted texts typed each into another visible text field (field i gets text i + 1, rotating), one
    per step, then the last button clicked; None on a page with fewer than two such fields or texts."""
    texts = quoted_strings(utterance)
    fields = [n for n in parse(tree) if n.role in TEXT_FIELD_ROLES and not n.hidden]
    n = min(len(fields), len(texts))
    if n < 2:
        return None
    for i, field in enumerate(fields[:n]):
        text = texts[(i + 1) % n]
        if not shows_text(field, text):
            return type_text(field.id, text)
    return last_button(tree)


def shows_text(field: Node, text: str) -> bool:
    """Whether a text field holds `text`: Chromium shows a password field's value as bullets, one per character."""
    return field.props.get("value", "") in (text, "\u2022" * len(text))


def _visible(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if not n.hidden]


def _first(nodes: list[Node], role: str | None = None, name: str | None = None) -> Node | None:
    for n in nodes:
        if (role is None or n.role == role) and (name is None or n.name == name):
            return n
    return None


def _subtree(nodes: list[Node], node: Node) -> list[Node]:
    i = nodes.index(node) + 1
    j = i
    while j < len(nodes) and nodes[j].depth > node.depth:
        j += 1
    return nodes[i:j]


def _ancestor(nodes: list[Node], node: Node, role: str) -> Node | None:
    depth = node.depth
    for n in reversed(nodes[: nodes.index(node)]):
        if n.depth < depth:
            if n.role == role:
                return n
            depth = n.depth
    return None


def _click_button(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    target = _first(_visible(nodes), "button", fields["target"])
    return click(target.id) if target else None


def _click_link(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    visible = _visible(nodes)
    target = _first(visible, "link", fields["target"]) or _first(visible, "StaticText", fields["target"])
    return click(target.id) if target else None


def _focus_text(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    box = _first(_visible(nodes), "textbox")
    return click(box.id) if box else None


def _fill_then_submit(pairs: list[tuple[Node | None, str]], nodes: list[Node]) -> str | None:
    for box, text in pairs:
        if box is not None and box.props.get("value", "") != text:
            return type_text(box.id, text)
    button = _first(_visible(nodes), "button")
    return click(button.id) if button else None


def _enter_text(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    return _fill_then_submit([(_first(_visible(nodes), "textbox"), fields["target"])], nodes)


def _login_user(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    boxes = [n for n in _visible(nodes) if n.role == "textbox"] + [None, None]
    user, password = boxes[0], boxes[1]
    if password is not None and shows_text(password, fields["password"]):
        password.props["value"] = fields["password"]  # what _fill_then_submit compares with
    return _fill_then_submit([(user, fields["username"]), (password, fields["password"])], nodes)


def _click_checkboxes(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    targets = {v for k, v in fields.items() if k.startswith("target")}
    for box in _visible(nodes):
        if box.role == "checkbox" and (box.name in targets) != (box.props.get("checked") == "true"):
            return click(box.id)
    button = _first(_visible(nodes), "button", "Submit")
    return click(button.id) if button else None


def _reveal_and_click(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    """click-tab-2 / click-collapsible-2: open the panel holding the target word, then click the word."""
    for text in nodes:
        if text.role == "StaticText" and text.name == fields["target"]:
            if not text.hidden:
                return click(text.id)
            panel = _ancestor(nodes, text, "tabpanel")
            tab = panel and _first(_visible(nodes), "tab", panel.name)
            if tab:
                # jQuery UI tabs listen on the tab's link; accordion headers (also role tab) have none.
                link = _first(_subtree(nodes, tab), "link")
                return click((link or tab).id)
    return None


def _search_engine(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    visible = _visible(nodes)
    box = _first(visible, "textbox")
    if box and box.props.get("value", "") != fields["query"]:
        return type_text(box.id, fields["query"])
    pager = _first(visible, "list")
    page_links = [n for n in _subtree(nodes, pager) if n.role == "link"] if pager else []
    results = [n for n in visible if n.role == "link" and n not in page_links]
    if not results:
        button = _first(visible, "button", "Search")
        return click(button.id) if button else None
    rank = int(fields["rank"]) - 1
    page, index = rank // 3 + 1, rank % 3
    shown = frozenset(n.id for n in results)
    if page > 1 and memory.get("page") != page:
        link = _first(page_links, "link", str(page))
        if link is None:
            return None
        memory.update(page=page, before=shown)
        return click(link.id)
    if page > 1 and shown == memory.get("before"):
        return None
    return click(results[index].id) if index < len(results) else None


def _email_inbox(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    visible = _visible(nodes)
    task = fields["task"]
    boxes = [n for n in visible if n.role == "textbox" and n.name != "Search"]
    if boxes:
        # A reply form (one box: the message) or a forward form (recipient, then message); its images are the
        # close and send buttons, in that order.
        box, text = (boxes[-1], fields["message"]) if task == "reply" else (boxes[0], fields.get("to", ""))
        if task in ("reply", "forward") and box.props.get("value", "") != text:
            return type_text(box.id, text)
        images = [n for n in visible if n.role == "image"]
        return click(images[1].id) if len(images) > 1 else None
    opened = _first(visible, "StaticText", "Reply")
    if opened is not None:
        # The open email: its bar's images are close, trash and star.
        images = [n for n in visible if n.role == "image"]
        if task == "reply":
            return click(opened.id)
        if task == "forward":
            forward = _first(visible, "StaticText", "Forward")
            return click(forward.id) if forward else None
        return click(images[1 if task == "delete" else 2].id) if len(images) > 2 else None
    sender = _first(visible, "StaticText", fields["by"])
    if sender is None:
        return None
    if task in ("delete", "important"):
        after = visible[visible.index(sender) :]
        images = [n for n in after if n.role == "image"][:2]  # the thread's trash and star
        return click(images[0 if task == "delete" else 1].id) if len(images) == 2 else None
    return click(sender.id)


def _pick_date(month: int, day: int, year: int, field: Node | None, nodes: list[Node]) -> str | None:
    """Open the jQuery UI datepicker from `field`, walk to the month, click the day."""
    visible = _visible(nodes)
    table = _first(visible, "table")
    shown_month = next((MONTHS.index(n.name) + 1 for n in visible if n.role == "StaticText" and n.name in MONTHS), None)
    shown_year = next((int(n.name) for n in visible if n.role == "StaticText" and re.fullmatch(r"\d{4}", n.name)), None)
    if table is None or shown_month is None or shown_year is None:
        return click(field.id) if field else None
    delta = (year - shown_year) * 12 + (month - shown_month)
    if delta != 0:
        step = _first(visible, "link", "Next" if delta > 0 else "Prev")
        return click(step.id) if step else None
    link = _first(_subtree(nodes, table), "link", str(day))
    return click(link.id) if link else None


def _choose_date(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    month, day, year = int(fields["month"]), int(fields["day"]), int(fields["year"])
    visible = _visible(nodes)
    field = _first(visible, "textbox")
    if field and field.props.get("value") == f"{month:02d}/{day:02d}/{year}":
        submit = _first(visible, "button", "Submit")
        return click(submit.id) if submit else None
    return _pick_date(month, day, year, field, nodes)


def _airport_matches(option: str, wanted: str) -> bool:
    return option.startswith(wanted + " (") or option.endswith(f"({wanted})")


def _book_flight(fields: dict, nodes: list[Node], memory: dict) -> str | None:
    visible = _visible(nodes)
    prices = [n for n in visible if n.role == "button" and n.name.startswith("Book flight for $")]
    if prices:
        if fields["criterion"] == "cheapest":
            best = min(prices, key=lambda n: int(n.name.rsplit("$", 1)[1]))
        else:
            durations = [n for n in visible if n.role == "StaticText" and re.fullmatch(r"\d+h \d+m", n.name)]
            if len(durations) != len(prices):
                return None
            minutes = [int(h) * 60 + int(m) for h, m in (re.findall(r"\d+", n.name) for n in durations)]
            best = prices[minutes.index(min(minutes))]
        return click(best.id)
    boxes = [n for n in visible if n.role == "textbox"]
    if len(boxes) < 3:
        return None
    lists = [n for n in nodes if n.role == "list"]
    for box, wanted, menu in ((boxes[0], fields["from"], lists[:1]), (boxes[1], fields["to"], lists[1:2])):
        value = box.props.get("value", "")
        if _airport_matches(value, wanted):
            continue
        if menu and not menu[0].hidden:
            for option in _subtree(nodes, menu[0]):
                if option.role == "StaticText" and _airport_matches(option.name, wanted):
                    return click(option.id)
        if value == wanted:
            return None
        return type_text(box.id, wanted)
    month, day, year = (int(x) for x in fields["date"].split("/"))
    if boxes[2].props.get("value") != fields["date"]:
        return _pick_date(month, day, year, boxes[2], nodes)
    search = _first(visible, "button", "Search")
    return click(search.id) if search else None


Expert = Callable[[dict, list[Node], dict], "str | None"]
EXPERTS: dict[str, Expert] = {
    "click-test-2": _click_button,
    "click-button": _click_button,
    "click-link": _click_link,
    "focus-text": _focus_text,
    "enter-text": _enter_text,
    "login-user": _login_user,
    "click-checkboxes": _click_checkboxes,
    "click-tab-2": _reveal_and_click,
    "click-collapsible-2": _reveal_and_click,
    "search-engine": _search_engine,
    "email-inbox": _email_inbox,
    "choose-date": _choose_date,
    "book-flight": _book_flight,
}

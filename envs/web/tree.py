"""The page's accessibility tree, from the DevTools protocol, as WebArena-style text lines.

A line is `[id] role 'name'` followed by the properties that carry state, in a fixed order, indented with one tab
per depth:

    [1] RootWebArea 'Login User Task' focused: true
    \t[4] textbox '' value: 'karrie'
    \t[6] button 'Login'
    \t\t[7] StaticText 'Login'

What is kept: Chromium's full AX tree minus ignored nodes, `InlineTextBox` and `ListMarker`, nodes without a
name whose role only groups others (generic, paragraph, label text, ...: their children move up a level), text
that repeats its parent line's name (a button's label), the inside of text fields (it repeats their value), and
MiniWoB's page furniture (`#reward-display`, `#sync-task-cover`, `#click-canvas`, and `#query`, whose text is the
utterance). Names and values have whitespace collapsed.

Hidden content is in the tree, marked `hidden: true`: Chromium leaves `display: none` and `aria-hidden` subtrees
out of its AX tree, so for the capture we reveal them (inline `display: revert !important`, `aria-hidden` removed),
read the tree, and put the page back as it was within the same few milliseconds. Expanding a tab or a collapsible
section is then an update of lines that were there, not new lines. Content a page only creates when it is shown
(a datepicker's month, autocomplete suggestions) is still new. The text marks only the first line of a hidden
subtree; the lines under it are hidden with it (`parse` gives every node of the subtree `hidden`). Showing a
panel is then an update of its one line, not of every line in it: on MiniWoB's click-collapsible-2 and
click-tab-2 this halves the target (105 -> 42 and 86 -> 41 tokens on average), and a datepicker that closes
changes 6 lines instead of 85.

Hidden content inside a live region (roles `status`, `log`, `alert`, `marquee`, `timer`) is left out: it is
history no one sees or hears again, like the "No search results." messages jQuery UI's autocomplete adds to its
status region at every keystroke and hides at the next. On book-flight they had grown pages to 7,000 tokens (316
such lines); without them the longest recorded page is 1,477. `normalise_tree` brings text recorded before to this
form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from selenium import webdriver

FURNITURE_IDS = ("reward-display", "sync-task-cover", "click-canvas", "query")
SKIPPED_ROLES = frozenset({"InlineTextBox", "ListMarker"})
TEXT_FIELD_ROLES = frozenset({"textbox", "searchbox"})  # their children repeat the value as the editor's text
LIVE_REGION_ROLES = frozenset({"status", "log", "alert", "marquee", "timer"})  # hidden content inside is left out
GROUPING_ROLES = frozenset({"generic", "none", "paragraph", "LabelText", "LineBreak", "StaticText", "Section", "div"})
BOOLEAN_PROPS = ("focused", "disabled", "required")  # written only when true
STATE_PROPS = ("checked", "selected", "expanded", "pressed")  # written whenever the page sets them
PROP_ORDER = ("value", "level", *STATE_PROPS, *BOOLEAN_PROPS, "hidden")
_HIDDEN_MARK = "data-rlvr-hidden"
_NEVER_SHOWN = ("SCRIPT", "STYLE", "HEAD", "TEMPLATE", "META", "LINK", "TITLE", "NOSCRIPT", "DATALIST", "BASE")

_REVEAL_JS = f"""
const furniture = new Set({list(FURNITURE_IDS)!r});
const neverShown = new Set({list(_NEVER_SHOWN)!r});
function walk(el) {{
  if (furniture.has(el.id) || neverShown.has(el.tagName)) return;
  const hidden = getComputedStyle(el).display === 'none';
  const ariaHidden = el.getAttribute('aria-hidden');
  if (hidden || ariaHidden === 'true') {{
    el.setAttribute('{_HIDDEN_MARK}', JSON.stringify([
      hidden, el.style.getPropertyValue('display'), el.style.getPropertyPriority('display'), ariaHidden]));
    if (hidden) {{
      el.style.setProperty('display', 'revert', 'important');
      if (getComputedStyle(el).display === 'none') el.style.setProperty('display', 'block', 'important');
    }}
    if (ariaHidden === 'true') el.removeAttribute('aria-hidden');
  }}
  for (const child of el.children) walk(child);
}}
walk(document.documentElement);
"""
# Put back only what we changed: a page script that ran between reveal and restore keeps its own edits.
_RESTORE_JS = f"""
for (const el of document.querySelectorAll('[{_HIDDEN_MARK}]')) {{
  const [hidden, display, priority, ariaHidden] = JSON.parse(el.getAttribute('{_HIDDEN_MARK}'));
  el.removeAttribute('{_HIDDEN_MARK}');
  const ours = el.style.getPropertyPriority('display') === 'important' &&
    ['revert', 'block'].includes(el.style.getPropertyValue('display'));
  if (hidden && ours) {{
    if (display) el.style.setProperty('display', display, priority);
    else el.style.removeProperty('display');
  }}
  if (ariaHidden === 'true' && !el.hasAttribute('aria-hidden')) el.setAttribute('aria-hidden', 'true');
}}
"""
_LINE = re.compile(r"^(\t*)\[(\d+)\] (\S+) '(.*?)'(?: value: '(.*?)')?((?: [a-z]+: [A-Za-z0-9]+)*)$")
_SPACE = re.compile(r"\s+")
_HIDDEN_SUFFIX = " hidden: true"


@dataclass
class Node:
    """One line of the tree; `backend_id` is Chromium's backendDOMNodeId (None when parsed from text)."""

    id: int
    depth: int
    role: str
    name: str
    props: dict[str, str] = field(default_factory=dict)
    backend_id: int | None = None

    @property
    def hidden(self) -> bool:
        return self.props.get("hidden") == "true"

    def line(self) -> str:
        props = "".join(f" {k}: '{v}'" if k == "value" else f" {k}: {v}" for k, v in self.props.items())
        return f"{chr(9) * self.depth}[{self.id}] {self.role} '{self.name}'{props}"


def capture(driver: webdriver.Chrome) -> list[Node]:
    """The filtered AX tree of the current page in tree order, ids not yet assigned (0), hidden nodes marked."""
    driver.execute_script(_REVEAL_JS)
    try:
        ax_nodes = driver.execute_cdp_cmd("Accessibility.getFullAXTree", {})["nodes"]
        document = driver.execute_cdp_cmd("DOM.getDocument", {"depth": -1})["root"]
    finally:
        driver.execute_script(_RESTORE_JS)
    furniture, hidden = _dom_sets(document)
    by_id = {n["nodeId"]: n for n in ax_nodes}
    roots = [n for n in ax_nodes if n.get("parentId") not in by_id]
    out: list[Node] = []
    stack = [(n, 0, False, False, None) for n in reversed(roots)]
    while stack:
        ax, depth, in_hidden, in_live, parent_name = stack.pop()
        backend = ax.get("backendDOMNodeId")
        role = ax.get("role", {}).get("value", "")
        if backend in furniture or role in SKIPPED_ROLES:
            continue
        in_hidden = in_hidden or backend in hidden
        if in_hidden and in_live:
            continue
        name = _clean(ax.get("name", {}).get("value", ""))
        keep = (
            not ax.get("ignored")
            and backend is not None
            and not (not name and role in GROUPING_ROLES)
            and not (role == "StaticText" and name == parent_name)
        )
        if keep:
            out.append(Node(0, depth, role, name, _props(ax, in_hidden), backend))
            if role in TEXT_FIELD_ROLES:
                continue
        child_depth, child_parent = (depth + 1, name) if keep else (depth, parent_name)
        for child in reversed(ax.get("childIds", [])):
            if child in by_id:
                live = in_live or role in LIVE_REGION_ROLES
                stack.append((by_id[child], child_depth, in_hidden, live, child_parent))
    return out


def serialise(nodes: list[Node]) -> str:
    """The tree as text, one node per line, `hidden: true` only on the first line of a hidden subtree."""
    return normalise_tree("\n".join(n.line() for n in nodes))


def normalise_tree(text: str) -> str:
    """Tree text as `serialise` writes it now, from text recorded before (every hidden line marked, old live-region
    messages kept): `hidden: true` only where a hidden subtree starts, no hidden line inside a live region.
    Idempotent. Ids are kept, so an episode's ids may skip the dropped lines' numbers."""
    out = []
    above: list[tuple[int, bool, bool]] = []  # (depth, hidden, in a live region) of the lines above, innermost last
    for line in text.split("\n"):
        depth = len(line) - len(line.lstrip("\t"))
        while above and above[-1][0] >= depth:
            above.pop()
        under_hidden, in_live = (above[-1][1], above[-1][2]) if above else (False, False)
        marked = line.endswith(_HIDDEN_SUFFIX)
        hidden = marked or under_hidden
        if hidden and in_live:
            above.append((depth, True, True))  # its lines go with it
            continue
        if marked and under_hidden:
            line = line[: -len(_HIDDEN_SUFFIX)]
        role = line.lstrip("\t").split(" ", 2)[1] if " " in line.lstrip("\t") else ""
        above.append((depth, hidden, in_live or role in LIVE_REGION_ROLES))
        out.append(line)
    return "\n".join(out)


def parse(text: str) -> list[Node]:
    """Nodes from tree text (as `serialise` writes it); lines that are not tree lines are skipped. A node under a
    hidden node is hidden too (its props say so, as `capture`'s do)."""
    nodes: list[Node] = []
    hidden_at: list[tuple[int, bool]] = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        tabs, node_id, role, name, value, rest = m.groups()
        props = {} if value is None else {"value": value}
        for pair in rest.split(" ")[1:]:
            if pair.endswith(":"):
                key = pair[:-1]
            else:
                props[key] = pair
        while hidden_at and hidden_at[-1][0] >= len(tabs):
            hidden_at.pop()
        if hidden_at and hidden_at[-1][1]:
            props["hidden"] = "true"
        hidden_at.append((len(tabs), props.get("hidden") == "true"))
        nodes.append(Node(int(node_id), len(tabs), role, name, props))
    return nodes


def _props(ax: dict, hidden: bool) -> dict[str, str]:
    raw = {p["name"]: p["value"].get("value") for p in ax.get("properties", []) if p["name"] != "hidden"}
    value = ax.get("value", {}).get("value")
    if value not in (None, ""):
        raw["value"] = _clean(str(value))
    if hidden:
        raw["hidden"] = True
    props = {}
    for key in PROP_ORDER:
        v = raw.get(key)
        if v is None or (key in BOOLEAN_PROPS and v not in (True, "true")):
            continue
        props[key] = v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
    return props


def _dom_sets(document: dict) -> tuple[set[int], set[int]]:
    """Backend ids of furniture subtrees and of subtrees the reveal script marked hidden."""
    furniture: set[int] = set()
    hidden: set[int] = set()
    stack = [(document, False, False)]
    while stack:
        node, in_furniture, in_hidden = stack.pop()
        attrs = node.get("attributes", [])
        keys = attrs[0::2]
        if "id" in keys and attrs[2 * keys.index("id") + 1] in FURNITURE_IDS:
            in_furniture = True
        in_hidden = in_hidden or _HIDDEN_MARK in keys
        if in_furniture:
            furniture.add(node["backendNodeId"])
        if in_hidden:
            hidden.add(node["backendNodeId"])
        for child in node.get("children", []) + node.get("shadowRoots", []):
            stack.append((child, in_furniture, in_hidden))
    return furniture, hidden


def _clean(text: str) -> str:
    return _SPACE.sub(" ", text).strip()

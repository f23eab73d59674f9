"""Tree text without a browser: hidden subtrees marked once, live-region history left out, parse reads both."""

from envs.web.tree import Node, normalise_tree, parse, serialise

RECORDED = "\n".join([  # as recorded before: every hidden line marked, old autocomplete messages kept
    "[1] RootWebArea 'Book Flight Task' focused: true",
    "\t[2] table '' hidden: true",
    "\t\t[3] row '' hidden: true",
    "\t\t\t[4] link '1' hidden: true",
    "\t[5] button 'Search'",
    "\t[6] status ''",
    "\t\t[7] StaticText 'No search results.' hidden: true",
    "\t\t[8] StaticText '1 result is available.'",
    "\t\t[9] StaticText 'No search results.' hidden: true",
])
NOW = "\n".join([
    "[1] RootWebArea 'Book Flight Task' focused: true",
    "\t[2] table '' hidden: true",
    "\t\t[3] row ''",
    "\t\t\t[4] link '1'",
    "\t[5] button 'Search'",
    "\t[6] status ''",
    "\t\t[8] StaticText '1 result is available.'",
])


def test_normalise_marks_a_hidden_subtree_once_and_drops_live_region_history():
    assert normalise_tree(RECORDED) == NOW
    assert normalise_tree(NOW) == NOW


def test_parse_hides_the_lines_under_a_hidden_line():
    hidden = {n.id: n.hidden for n in parse(NOW)}
    assert hidden == {1: False, 2: True, 3: True, 4: True, 5: False, 6: False, 8: False}
    assert {n.id: n.hidden for n in parse(RECORDED)}.items() >= hidden.items()


def test_serialise_writes_what_parse_reads():
    nodes = parse(NOW)
    assert all(isinstance(n, Node) for n in nodes) and serialise(nodes) == NOW

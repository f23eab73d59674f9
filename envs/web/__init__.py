"""MiniWoB++ pages in Debian's Chromium: accessibility-tree observations, text actions, scripted solvers, recording."""

from envs.web.browser import browser_available
from envs.web.env import TASKS, BrowserError, InvalidAction, WebTaskEnv, click, parse_action, task_done, type_text
from envs.web.record import record_transitions
from envs.web.solvers import ScriptedPolicy, random_action
from envs.web.tree import Node, parse

__all__ = [
    "TASKS",
    "BrowserError",
    "InvalidAction",
    "Node",
    "ScriptedPolicy",
    "WebTaskEnv",
    "browser_available",
    "click",
    "parse",
    "parse_action",
    "random_action",
    "record_transitions",
    "task_done",
    "type_text",
]

"""MiniWoB++ pages in Debian's Chromium: accessibility-tree observations, text actions, scripted solvers, recording."""

from envs.web.env import TASKS, BrowserError, InvalidAction, WebTaskEnv, click, parse_action, type_text
from envs.web.tree import Node, parse

__all__ = ["TASKS", "BrowserError", "InvalidAction", "Node", "WebTaskEnv", "click", "parse", "parse_action", "type_text"]

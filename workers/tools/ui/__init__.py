"""Group ui: the browser (Playwright driving the system's Chromium), one session per job
session, pinned to the ui worker process that holds it."""

from typing import Any

from workers.tool import Tool
from workers.tools.ui.browser import Browser
from workers.tools.ui.canvas import Canvas

TOOLS: list[type[Tool[Any]]] = [Browser, Canvas]

__all__ = ["TOOLS", "Browser", "Canvas"]

"""Group automation: cron (scheduled agent jobs)."""

from typing import Any

from workers.tool import Tool
from workers.tools.automation.cron import Cron

TOOLS: list[type[Tool[Any]]] = [Cron]

__all__ = ["TOOLS", "Cron"]

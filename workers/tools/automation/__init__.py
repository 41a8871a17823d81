"""Group automation: cron (scheduled agent jobs) and gateway (the cluster and its live
configuration)."""

from typing import Any

from workers.tool import Tool
from workers.tools.automation.cron import Cron
from workers.tools.automation.gateway import Gateway

TOOLS: list[type[Tool[Any]]] = [Cron, Gateway]

__all__ = ["TOOLS", "Cron", "Gateway"]

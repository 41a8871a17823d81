"""Group web: reading pages and searching, every request through the egress client."""

from typing import Any

from workers.tool import Tool
from workers.tools.web.fetch import WebFetch
from workers.tools.web.search import WebSearch

TOOLS: list[type[Tool[Any]]] = [WebFetch, WebSearch]

__all__ = ["TOOLS", "WebFetch", "WebSearch"]

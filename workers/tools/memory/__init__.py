"""Group memory: memory_search and memory_get over what jobs wrote to MEMORY.md and
memory/** (routed to PostgreSQL by the fs tools), and the memory.index task."""

from typing import Any

from workers.tool import Tool
from workers.tools.memory.get import MemoryGet
from workers.tools.memory.search import MemorySearch

TOOLS: list[type[Tool[Any]]] = [MemorySearch, MemoryGet]

__all__ = ["TOOLS", "MemoryGet", "MemorySearch"]

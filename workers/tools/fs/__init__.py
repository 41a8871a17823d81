"""Group fs: files inside the job's workspace."""

from typing import Any

from workers.tool import Tool
from workers.tools.fs.edit import EditFile
from workers.tools.fs.find import Glob, ListFiles
from workers.tools.fs.read import ReadFile
from workers.tools.fs.search import Search
from workers.tools.fs.write import WriteFile

TOOLS: list[type[Tool[Any]]] = [ReadFile, WriteFile, EditFile, ListFiles, Search, Glob]

__all__ = ["TOOLS", "EditFile", "Glob", "ListFiles", "ReadFile", "Search", "WriteFile"]

"""Group fs: files inside the job's workspace."""

from workers.tools.fs.edit import EditFile
from workers.tools.fs.find import Glob, ListFiles
from workers.tools.fs.read import ReadFile
from workers.tools.fs.search import Search
from workers.tools.fs.write import WriteFile

TOOLS = [ReadFile, WriteFile, EditFile, ListFiles, Search, Glob]

__all__ = ["TOOLS", "EditFile", "Glob", "ListFiles", "ReadFile", "Search", "WriteFile"]

"""Group runtime: exec, background processes and their supervisor."""

from workers.tools.runtime import exec, process

TOOLS = [*exec.TOOLS, *process.TOOLS]

"""Group sessions: this session and others (sessions), results cut in the context
(results), subagents, and the cluster's nodes."""

from workers.tools.sessions import nodes, results, sessions, subagents

TOOLS = [*sessions.TOOLS, *results.TOOLS, *subagents.TOOLS, *nodes.TOOLS]

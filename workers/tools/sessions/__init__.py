"""Group sessions: this session and others (sessions), subagents, and the cluster's nodes."""

from workers.tools.sessions import nodes, sessions, subagents

TOOLS = [*sessions.TOOLS, *subagents.TOOLS, *nodes.TOOLS]

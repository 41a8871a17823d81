"""nodes: the hosts of the cluster as their heartbeats tell them (group sessions): per node
its queues, worker processes, orchestrators, load, confinement and versions, so an agent
can see them and aim `exec` at one (`exec` with `node`, under `exec(node:NAME)`)."""

from __future__ import annotations

from collections import defaultdict
from importlib import metadata
from typing import Any, Literal

from pydantic import Field

from broker.protocol import Group
from broker.redis.presence import live_processes, queues_of
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult


class NodesInput(ToolInput):
    action: Literal["list", "describe"] = "list"
    node: str | None = Field(None, description="describe: the node's name")


def _nodes(processes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in processes:
        grouped[str(p.get("host", "?"))].append(p)
    return dict(sorted(grouped.items()))


def _line(node: str, procs: list[dict[str, Any]]) -> str:
    workers = [p for p in procs if p.get("kind") == "worker"]
    queues = sorted({q for p in workers for q in queues_of(p)})
    orchestrators = sum(1 for p in procs if p.get("kind") == "orchestrator")
    load = max((float(p.get("load", 0)) for p in procs), default=0.0)
    confinement = sorted({str(p["confinement"]) for p in workers if p.get("confinement")})
    parts = [
        f"{node}: {len(workers)} worker processes ({', '.join(queues) or 'none'})",
        f"{orchestrators} orchestrators",
        f"load {load:.2f}",
    ]
    if confinement:
        parts.append(f"confinement {'; '.join(confinement)}")
    return ", ".join(parts)


class Nodes(Tool[NodesInput]):
    name = "nodes"
    description = (
        "The nodes (hosts) of the cluster: list them with their queues, worker processes, "
        "load and confinement, or describe one. exec can run on a node with node=NAME."
    )
    group = Group.sessions
    input_model = NodesInput
    side_effect = SideEffect.read
    default_permission = "allow"
    timeout_s = 10.0

    def concurrency_safe(self, args: NodesInput) -> bool:
        return True

    def run(self, args: NodesInput, ctx: ToolContext) -> ToolResult:
        if ctx.redis is None:
            raise ToolError("nodes needs Redis; none is configured here")
        nodes = _nodes(live_processes(ctx.redis))
        version = metadata.version("clawq")
        if args.action == "list":
            text = "\n".join(_line(n, p) for n, p in nodes.items()) or "no live nodes"
            return ToolResult(
                for_llm=f"{text}\n(clawq {version})",
                metadata={"nodes": sorted(nodes)},
            )
        if not args.node:
            raise ToolError("describe needs node; nodes list shows their names")
        procs = nodes.get(args.node)
        if not procs:
            known = ", ".join(nodes) or "none"
            raise ToolError(f"no live node {args.node}; live nodes: {known}")
        rows = [
            f"- {p.get('kind')} {p.get('id')} queue {p.get('queue')} pid {p.get('pid')}"
            + (f" confinement {p['confinement']}" if p.get("confinement") else "")
            for p in sorted(procs, key=lambda p: (str(p.get("kind")), str(p.get("queue"))))
        ]
        return ToolResult(
            for_llm=f"{_line(args.node, procs)} (clawq {version})\n" + "\n".join(rows),
            metadata={"processes": len(procs)},
        )


TOOLS: list[type[Tool[Any]]] = [Nodes]

"""Reads of a session's resources, kept until the server says they changed.

Where the server lets a client subscribe (`resources.subscribe`, protocols up to
2025-11-25), a read subscribes to its URI first, then reads, and the answer is kept: a
`notifications/resources/updated` for that URI drops it, a `list_changed` drops them all,
and so does the end of the session. A read that an update overtook is not kept (each URI
counts its updates). Elsewhere every read goes to the server.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

LIMIT = 256  # resources kept per session
SUBSCRIBING_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")


class ResourceCache:
    def __init__(self) -> None:
        self.kept: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.subscribed: set[str] = set()
        self.updates: Counter[str] = Counter()
        self.hits = 0

    def clear(self) -> None:
        """A new session: nothing read on the old one is known to be current."""
        self.kept.clear()
        self.subscribed.clear()

    async def on_message(self, message: Any) -> None:
        """The session's notifications (`Client(message_handler=...)`)."""
        import mcp_types

        if isinstance(message, mcp_types.ResourceUpdatedNotification):
            uri = str(message.params.uri)
            self.updates[uri] += 1
            self.kept.pop(uri, None)
        elif isinstance(message, mcp_types.ResourceListChangedNotification):
            self.updates.update(self.kept.keys())
            self.kept.clear()

    async def read(self, client: Any, uri: str) -> dict[str, Any]:
        """A `resources/read`, in the shape of a tool result (resource blocks)."""
        import mcp_types

        if uri in self.kept:
            self.kept.move_to_end(uri)
            self.hits += 1
            return self.kept[uri]
        caps = client.server_capabilities.resources
        keep = bool(caps and caps.subscribe) and client.protocol_version in SUBSCRIBING_VERSIONS
        if keep and uri not in self.subscribed:
            request = mcp_types.SubscribeRequest(params=mcp_types.SubscribeRequestParams(uri=uri))
            await client.session.send_request(request, mcp_types.EmptyResult)
            self.subscribed.add(uri)
        seen = self.updates[uri]
        read = await client.read_resource(uri, cache_mode="bypass")
        contents = [
            c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in read.contents
        ]
        result = {
            "content": [{"type": "resource", "resource": c} for c in contents],
            "isError": False,
        }
        if keep and self.updates[uri] == seen:  # not overtaken by an update meanwhile
            self.kept[uri] = result
            while len(self.kept) > LIMIT:
                self.kept.popitem(last=False)
        return result

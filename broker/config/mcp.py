"""MCP servers and grants as data: the `mcpServers` JSON other MCP clients use, the names
under which a server's tools are exposed, and what a set of grants lets through.

Pure: no `mcp` import here (orchestrators, the client and the CLI read these cheaply).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from broker.config.settings import Settings
from broker.errors import ConfigurationError

Transport = Literal["stdio", "sse", "streamable-http"]
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
SERVER_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")
TRANSPORT_ALIASES = {"http": "streamable-http", "streamableHttp": "streamable-http"}
# the catalog's built-in entries, by MCP method, and the names the model sees them under
BUILTINS = {
    "resources/list": "list_resources",
    "resources/read": "read_resource",
    "prompts/list": "list_prompts",
    "prompts/get": "get_prompt",
}


class McpConfigError(ConfigurationError, ValueError):
    """The MCP configuration is wrong; the message says where, `field` names it."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


# keys other clients write in their `mcpServers` entries, which mean nothing here (Cline's
# autoApprove, …): dropped, so a config pasted from them is taken, while a typo is refused
FOREIGN_KEYS = ("autoApprove", "alwaysAllow", "timeout", "transportType", "description")


class McpOAuth(BaseModel):
    """OAuth 2.1 for a remote server, as the MCP authorization spec has it: the authorization
    server is discovered from the server's protected-resource metadata; the client is
    registered dynamically unless `client_id` names one registered beforehand. A person logs
    in once (`authorization_code` with PKCE, `clawq mcp login`); a service account needs no
    one (`client_credentials`, with `client_secret`)."""

    model_config = ConfigDict(extra="forbid")

    grant: Literal["authorization_code", "client_credentials"] = "authorization_code"
    client_id: str = ""
    client_secret: str = ""
    scope: str = ""


class McpServer(BaseModel):
    """One server, as `mcpServers` entries are written (`type` may be left out: a `command`
    means stdio, a `url` streamable HTTP)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    transport: Transport = Field("stdio", alias="type")
    command: str = ""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = Field(default_factory=dict)
    enabled: bool = True
    # a call fails when the server is silent this long (progress resets it) or runs this long
    idle_timeout_s: float | None = Field(None, gt=0)
    total_timeout_s: float | None = Field(None, gt=0)
    oauth: McpOAuth | None = None

    @model_validator(mode="before")
    @classmethod
    def infer_transport(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            raw = dict(raw)
            kind = raw.get("type") or raw.get("transport")
            if kind is None:
                kind = "stdio" if raw.get("command") else "streamable-http"
            raw["type"] = TRANSPORT_ALIASES.get(kind, kind)
            raw.pop("transport", None)
            for key in FOREIGN_KEYS:
                raw.pop(key, None)
            if "disabled" in raw:  # Claude Desktop's and Cline's switch
                raw["enabled"] = not raw.pop("disabled")
        return raw

    @model_validator(mode="after")
    def complete(self) -> McpServer:
        if not SERVER_NAME_RE.match(self.name):
            raise ValueError(f"server name must match {SERVER_NAME_RE.pattern}")
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio server needs a command")
        if self.transport != "stdio" and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"a {self.transport} server needs an http(s) url")
        if self.oauth is not None and self.transport == "stdio":
            raise ValueError("OAuth is for servers over HTTP; a stdio server takes env")
        if self.oauth and self.oauth.grant == "client_credentials" and not self.oauth.client_id:
            raise ValueError("client_credentials needs a client_id (and its client_secret)")
        return self

    def limits(self, settings: Settings) -> tuple[float, float]:
        """(idle, total) of a call: the server's own, else the settings'; never above the
        settings' total, which is the time limit of the task that runs the call."""
        ceiling = settings.mcp_call_total_s
        total = min(self.total_timeout_s or ceiling, ceiling)
        return min(self.idle_timeout_s or settings.mcp_call_timeout_s, total), total

    def public(self) -> dict[str, Any]:
        """What may be shown: header and env values are secrets."""
        shown = self.model_dump(by_alias=True)
        shown["env"] = dict.fromkeys(self.env, "***")
        shown["headers"] = dict.fromkeys(self.headers, "***")
        if self.oauth is not None and self.oauth.client_secret:
            shown["oauth"]["client_secret"] = "***"
        return shown


def parse_servers(raw: Any) -> list[McpServer]:
    """`{"mcpServers": {name: {...}}}` as other clients write it, or the inner mapping."""
    if isinstance(raw, dict) and "mcpServers" in raw:
        if other := sorted(set(raw) - {"mcpServers"}):
            raise McpConfigError(
                f"{other[0]}: not a key of the configuration (only mcpServers)", other[0]
            )
        raw = raw["mcpServers"]
    if not isinstance(raw, dict) or not raw:
        raise McpConfigError('expected {"mcpServers": {"name": {"command": ...} | {"url": ...}}}')
    servers = []
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise McpConfigError(f"mcpServers.{name}: expected an object", f"mcpServers.{name}")
        try:
            servers.append(McpServer.model_validate({**entry, "name": name}))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(["mcpServers", name, *(str(p) for p in first["loc"])])
            raise McpConfigError(f"{where}: {first['msg']}", where) from None
    return servers


def exposed_name(server: str, tool: str) -> str:
    """`mcp_<server>__<tool>`, valid for every provider: when it had to be changed or cut, a
    stable suffix (sha256 of server and tool, never Python's salted hash) keeps it unique."""
    plain = f"mcp_{server}__{BUILTINS.get(tool, tool)}"
    if NAME_RE.match(plain):
        return plain
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^a-zA-Z0-9_-]", "_", plain)[: 64 - 9]
    return f"{cleaned}_{digest}"


def exposed_names(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Names for every (server, tool), collisions resolved in sorted order: the first keeps
    its name, later ones get a numbered suffix."""
    taken: set[str] = set()
    out = {}
    for pair in sorted(set(pairs)):
        name = exposed_name(*pair)
        n = 2
        while name in taken:
            suffix = f"_{n}"
            name = exposed_name(*pair)[: 64 - len(suffix)] + suffix
            n += 1
        taken.add(name)
        out[pair] = name
    return out


class Grant(BaseModel):
    """Access of one agent or one user to one server's tools: deny wins over allow, and an
    empty allow list means every tool."""

    server: str
    scope: Literal["agent", "user"]
    subject: str
    tool_allow: list[str] = Field(default_factory=list)
    tool_deny: list[str] = Field(default_factory=list)
    enabled: bool = True

    def admits(self, tool: str) -> bool:
        if not self.enabled or tool in self.tool_deny:
            return False
        return not self.tool_allow or tool in self.tool_allow


def granted(grants: list[Grant], server: str, tool: str) -> bool:
    """A tool is usable when some enabled grant on its server admits it and none denies it."""
    mine = [g for g in grants if g.server == server and g.enabled]
    if any(tool in g.tool_deny for g in mine):
        return False
    return any(g.admits(tool) for g in mine)

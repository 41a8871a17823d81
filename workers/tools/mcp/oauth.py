"""OAuth 2.1 for MCP servers over HTTP, the workers' side: a bearer token on every request,
refreshed once across all mcp workers.

The grant lives sealed in PostgreSQL (`broker/stores/mcp_oauth.py`). A worker whose access
token is expiring (or was refused with 401) takes the server's Redis lock, reads the grant
again (another worker may have refreshed it meanwhile: then it uses that), and otherwise
asks the token endpoint, stores the new grant (a rotated refresh token included) and only
then uses it. A refused refresh (`invalid_grant`: the grant was revoked) is stored as such,
shown by `clawq mcp list` with the fix, and every call says it. `client_credentials`
servers get their first token the same way, after discovery.

Discovery and the token request are shared with the login (`orchestrator/admin`): every
request goes through the egress guard. The SDK's discovery URL rules and metadata models
(`mcp.client.auth.utils`, `mcp.shared.auth`) are used as they are.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from broker import keys
from broker.config.mcp import McpServer
from broker.config.settings import Settings
from broker.stores.mcp_oauth import OAuthGrant, Status, StoredGrant
from workers.egress.client import egress_for
from workers.egress.netguard import EgressError
from workers.tools.mcp.calls import McpError, OAuthRefused

EARLY_S = 60.0  # an access token this close to expiring is refreshed first


def _json(body: bytes) -> dict[str, Any]:
    try:
        found = json.loads(body or b"{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def fetch_json(settings: Settings, url: str) -> dict[str, Any] | None:
    """A metadata document, or None where there is none (the next URL is tried)."""
    try:
        fetched = egress_for(settings).request("GET", url, headers={"Accept": "application/json"})
    except EgressError as exc:
        raise McpError(f"OAuth discovery at {url} failed: {exc}") from None
    return _json(fetched.body) if fetched.status == 200 else None


def discover(settings: Settings, server_url: str) -> tuple[Any, str]:
    """The authorization server's metadata and the resource to ask tokens for: from the
    server's protected-resource metadata (RFC 9728), else the server's own origin."""
    from mcp.client.auth.utils import (
        build_oauth_authorization_server_metadata_discovery_urls as as_urls,
    )
    from mcp.client.auth.utils import build_protected_resource_metadata_discovery_urls as pr_urls
    from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata

    issuer, resource = None, server_url
    for url in pr_urls(None, server_url):
        found = fetch_json(settings, url)
        if found:
            prm = ProtectedResourceMetadata.model_validate(found)
            issuer, resource = str(prm.authorization_servers[0]), str(prm.resource)
            break
    for url in as_urls(issuer, server_url):
        found = fetch_json(settings, url)
        if found:
            return OAuthMetadata.model_validate(found), resource
    raise McpError(f"no OAuth authorization server found for {server_url}")


def token_request(settings: Settings, grant: OAuthGrant, form: dict[str, str]) -> OAuthGrant:
    """One request to the token endpoint; the grant it makes (a refresh token that was not
    rotated is kept)."""
    from mcp.shared.auth import OAuthToken

    data, headers = dict(form), {"Accept": "application/json"}
    if grant.auth_method == "client_secret_basic":
        pair = f"{quote(grant.client_id)}:{quote(grant.client_secret)}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    else:
        data["client_id"] = grant.client_id
        if grant.client_secret:
            data["client_secret"] = grant.client_secret
    if grant.resource:
        data["resource"] = grant.resource
    try:
        fetched = egress_for(settings).request(
            "POST", grant.token_endpoint, data=data, headers=headers
        )
    except EgressError as exc:
        raise McpError(f"the OAuth token endpoint failed: {exc}") from None
    body = _json(fetched.body)
    if fetched.status in (400, 401) and body.get("error"):
        said = f"{body['error']}: {body.get('error_description') or ''}".rstrip(": ")
        raise OAuthRefused(said)
    if fetched.status != 200:
        raise McpError(f"the OAuth token endpoint answered {fetched.status}")
    token = OAuthToken.model_validate(body)
    return grant.model_copy(
        update={
            "access_token": token.access_token,
            "refresh_token": token.refresh_token or grant.refresh_token,
            "expires_at": time.time() + token.expires_in if token.expires_in else None,
            "scope": token.scope or grant.scope,
        }
    )


class Rows:
    """The grant's row, as this process reaches PostgreSQL (blocking: run in a thread)."""

    def __init__(
        self,
        load: Callable[[str], StoredGrant | None],
        save: Callable[[str, OAuthGrant, int | None], int | None],
        mark: Callable[[str, Status, str], None],
    ) -> None:
        self.load, self.save, self.mark = load, save, mark


class ServerTokens:
    """One server's access token in this process."""

    def __init__(self, config: McpServer, settings: Settings, rows: Rows) -> None:
        assert config.oauth is not None
        self.config, self.oauth, self.settings, self.rows = config, config.oauth, settings, rows
        self.grant: OAuthGrant | None = None
        self.refreshes = 0  # made by this process (the tests count them)

    def _usable(self, grant: OAuthGrant | None, stale: str) -> bool:
        if grant is None or not grant.access_token or grant.access_token == stale:
            return False
        return grant.expires_at is None or grant.expires_at - EARLY_S > time.time()

    def _fix(self) -> str:
        if self.oauth.grant == "client_credentials":
            return f"check the client_id and client_secret of MCP server '{self.config.name}'"
        return f"an admin must run `clawq mcp login {self.config.name}`"

    async def _current(self, stale: str) -> StoredGrant | None:
        stored = await asyncio.to_thread(self.rows.load, self.config.name)
        if stored is not None and stored.status != "ok":
            raise OAuthRefused(
                f"MCP server '{self.config.name}' refused its OAuth grant ({stored.status}:"
                f" {stored.detail}); {self._fix()}"
            )
        return stored

    async def access_token(self, stale: str = "") -> str:
        """A live access token; `stale` is one the server just refused."""
        if self._usable(self.grant, stale):
            assert self.grant is not None
            return self.grant.access_token
        stored = await self._current(stale)
        if stored is None or not self._usable(stored.grant, stale):
            stored = await self._renew(stale)
        self.grant = stored.grant
        return stored.grant.access_token

    async def _renew(self, stale: str) -> StoredGrant:
        """Under the server's lock, once across every worker."""
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.settings.redis_url)
        try:
            async with client.lock(
                keys.mcp_oauth(self.config.name), timeout=60, blocking_timeout=60
            ):
                stored = await self._current(stale)  # someone may have refreshed meanwhile
                if stored is not None and self._usable(stored.grant, stale):
                    return stored
                grant = await asyncio.to_thread(self._request, stored)
                replaces = stored.version if stored is not None else None
                version = await asyncio.to_thread(self.rows.save, self.config.name, grant, replaces)
                if version is None:
                    raise McpError(f"the OAuth grant of '{self.config.name}' changed meanwhile")
                return StoredGrant(grant=grant, status="ok", detail="", version=version)
        finally:
            await client.aclose()

    def _request(self, stored: StoredGrant | None) -> OAuthGrant:
        name = self.config.name
        if self.oauth.grant == "client_credentials":
            if stored is not None:
                grant = stored.grant
            else:
                metadata, resource = discover(self.settings, self.config.url)
                grant = OAuthGrant(
                    token_endpoint=str(metadata.token_endpoint),
                    client_id=self.oauth.client_id,
                    client_secret=self.oauth.client_secret,
                    scope=self.oauth.scope,
                    resource=resource,
                )
            form = {"grant_type": "client_credentials"}
            if grant.scope:
                form["scope"] = grant.scope
        else:
            if stored is None or not stored.grant.refresh_token:
                raise OAuthRefused(f"MCP server '{name}' needs a login: {self._fix()}")
            grant = stored.grant
            form = {"grant_type": "refresh_token", "refresh_token": grant.refresh_token}
        try:
            fresh = token_request(self.settings, grant, form)
        except OAuthRefused as exc:
            status: Status = "failed" if self.oauth.grant == "client_credentials" else "revoked"
            if stored is not None:
                self.rows.mark(name, status, str(exc))
            raise OAuthRefused(
                f"MCP server '{name}' refused its OAuth grant ({status}: {exc}); {self._fix()}"
            ) from None
        self.refreshes += 1
        return fresh


def bearer(tokens: ServerTokens) -> Any:
    """An `httpx2.Auth` that sends the server's token, and once more after a 401 with a
    fresh one."""
    import httpx2

    class Bearer(httpx2.Auth):
        refused = ""  # why the grant was refused, for the call that met it

        async def token(self, stale: str = "") -> str:
            try:
                return await tokens.access_token(stale)
            except OAuthRefused as exc:
                self.refused = str(exc)
                raise

        async def async_auth_flow(self, request: Any) -> Any:
            token = await self.token()
            request.headers["Authorization"] = f"Bearer {token}"
            response = yield request
            if response.status_code == 401:
                token = await self.token(stale=token)
                request.headers["Authorization"] = f"Bearer {token}"
                yield request

    return Bearer()


class OAuthAuth:
    """The `auth` of a worker's sessions: a bearer for each server that has OAuth, its
    tokens kept across reconnects (and renewed when its configuration changes)."""

    def __init__(self, settings: Settings, rows: Rows) -> None:
        self.settings, self.rows = settings, rows
        self.tokens: dict[str, ServerTokens] = {}

    def __call__(self, config: McpServer) -> Any:
        if config.oauth is None:
            return None
        current = self.tokens.get(config.name)
        if current is None or current.config != config:
            current = self.tokens[config.name] = ServerTokens(config, self.settings, self.rows)
        return bearer(current)

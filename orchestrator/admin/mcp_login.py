"""A person's OAuth login to an MCP server: authorization code with PKCE, written once for
`clawq mcp login`, the API and the remote client.

`begin` discovers the authorization server (the server's protected-resource metadata,
then RFC 8414), registers a client when none was given (RFC 7591), and makes the
authorization URL with a PKCE challenge. What the end needs (the verifier, the client) is
sealed into the `state` itself, so no store holds a half-done login and any API replica
can finish it; the seal also proves the state was made here. `finish` exchanges the code
and stores the grant, sealed; the mcp workers are told, and use it from their next call.
"""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

from pydantic import BaseModel, ValidationError

from broker.config.mcp import McpServer
from broker.config.secretbox import SecretBox, SecretError
from broker.config.settings import Settings
from broker.errors import Invalid, RunError
from broker.pg.store import Store
from broker.stores.mcp_oauth import McpOAuthStore, OAuthGrant

LOGIN_TTL_S = 600.0
STATE_AD = b"mcp-login-state"


class McpLoginError(RunError):
    """The login could not be made; the message says what failed and what to do."""


class LoginStart(BaseModel):
    """The URL the person opens; `state` comes back with the code."""

    url: str
    state: str


class Pending(BaseModel):
    server: str
    grant: OAuthGrant  # the client, the token endpoint and the resource; no tokens yet
    verifier: str
    redirect_uri: str
    issued_at: float


def _register(settings: Settings, endpoint: str, redirect_uri: str, scope: str) -> OAuthGrant:
    from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata
    from pydantic import AnyUrl

    from workers.egress.client import egress_for

    meta = OAuthClientMetadata(
        redirect_uris=[AnyUrl(redirect_uri)],
        token_endpoint_auth_method="client_secret_post",
        grant_types=["authorization_code", "refresh_token"],
        client_name="clawq",
        scope=scope or None,
    )
    body = meta.model_dump(by_alias=True, mode="json", exclude_none=True)
    fetched = egress_for(settings).request(
        "POST", endpoint, content=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    if fetched.status not in (200, 201):
        said = fetched.body[:200].decode(errors="replace")
        raise McpLoginError(f"client registration at {endpoint} failed ({fetched.status}): {said}")
    info = OAuthClientInformationFull.model_validate_json(fetched.body)
    return OAuthGrant(
        token_endpoint="",
        client_id=info.client_id or "",
        client_secret=info.client_secret or "",
        auth_method=info.token_endpoint_auth_method or "client_secret_post",
    )


def begin(settings: Settings, server: McpServer, redirect_uri: str) -> LoginStart:
    from mcp.client.auth.oauth2 import PKCEParameters

    from workers.tools.mcp.calls import McpError
    from workers.tools.mcp.oauth import discover

    oauth = server.oauth
    if oauth is None:
        raise Invalid(f"MCP server '{server.name}' has no oauth in its configuration")
    if oauth.grant != "authorization_code":
        raise Invalid(
            f"MCP server '{server.name}' uses client_credentials: its workers get tokens "
            "themselves, no one logs in"
        )
    try:
        metadata, resource = discover(settings, server.url)
        if oauth.client_id:
            grant = OAuthGrant(
                token_endpoint="", client_id=oauth.client_id, client_secret=oauth.client_secret
            )
        elif metadata.registration_endpoint is None:
            raise McpLoginError(
                "the authorization server has no dynamic client registration: register a "
                f"client there and give its id as oauth.client_id of '{server.name}'"
            )
        else:
            endpoint = str(metadata.registration_endpoint)
            grant = _register(settings, endpoint, redirect_uri, oauth.scope)
    except McpError as exc:
        raise McpLoginError(str(exc)) from None
    grant.token_endpoint, grant.scope, grant.resource = (
        str(metadata.token_endpoint),
        oauth.scope,
        resource,
    )
    pkce = PKCEParameters.generate()
    pending = Pending(
        server=server.name,
        grant=grant,
        verifier=pkce.code_verifier,
        redirect_uri=redirect_uri,
        issued_at=time.time(),
    )
    state = SecretBox.from_settings(settings).seal(pending.model_dump_json().encode(), STATE_AD)
    query = {
        "response_type": "code",
        "client_id": grant.client_id,
        "redirect_uri": redirect_uri,
        "code_challenge": pkce.code_challenge,
        "code_challenge_method": "S256",
        "state": state,
        "resource": resource,
    }
    if oauth.scope:
        query["scope"] = oauth.scope
    return LoginStart(url=f"{metadata.authorization_endpoint}?{urlencode(query)}", state=state)


def finish(settings: Settings, store: Store, state: str, code: str) -> str:
    """Exchange the code for tokens and keep them; returns the server's name."""
    from workers.tools.mcp.calls import McpError
    from workers.tools.mcp.oauth import token_request

    box = SecretBox.from_settings(settings)
    try:
        pending = Pending.model_validate_json(box.open(state, STATE_AD))
    except (SecretError, ValidationError):
        raise Invalid("this login's state is not one clawq made: start the login again") from None
    if time.time() - pending.issued_at > LOGIN_TTL_S:
        raise Invalid(f"this login is older than {LOGIN_TTL_S:g} s: start it again")
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": pending.redirect_uri,
        "code_verifier": pending.verifier,
    }
    try:
        grant = token_request(settings, pending.grant, form)
    except McpError as exc:
        raise McpLoginError(f"the code was not accepted: {exc}") from None
    McpOAuthStore(store, box).save(pending.server, grant)
    return pending.server

"""An MCP server behind OAuth 2.1, for the bridge's tests: a real authorization server built
with authlib (Flask), and an MCP resource server built with the MCP SDK that takes only the
tokens that authorization server issued.

`python -m tests.mcp_servers.oauth_server AS_PORT MCP_PORT`

The authorization server has RFC 8414 metadata, dynamic client registration (RFC 7591),
the authorization code grant with PKCE required (RFC 7636; the person at /authorize is
`ann`, who always consents), refresh tokens that rotate (the old one is revoked when
used), client credentials, and revocation (RFC 7009). A pre-registered client is
`service` / `service-secret` (client credentials) and `app` / `app-secret` (a person's).
`GET /stats` counts the token requests by grant type, so a test can see how many
refreshes were made; `POST /expire` ends an access token early. A refresh takes half a
second, so workers that need one at about the same time meet while it runs.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections import Counter
from typing import Any

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7591 import ClientMetadataClaims, ClientRegistrationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from flask import Flask, jsonify, request
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from werkzeug.serving import make_server

AUTH_METHODS = ["client_secret_basic", "client_secret_post", "none"]
ACCESS_TTL_S = 3600
REFRESH_S = 0.5
lock = threading.Lock()
stats: Counter[str] = Counter()


class Client(ClientMixin):
    def __init__(self, client_id: str, secret: str, metadata: dict[str, Any]) -> None:
        self.client_id, self.client_secret, self.metadata = client_id, secret, metadata

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str:
        return str(self.metadata["redirect_uris"][0])

    def get_allowed_scope(self, scope: str) -> str:
        return scope or "mcp"

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.metadata.get("redirect_uris", [])

    def check_client_secret(self, client_secret: str) -> bool:
        return secrets.compare_digest(self.client_secret, client_secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in AUTH_METHODS and (method == "none") == (not self.client_secret)

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        allowed = self.metadata.get("grant_types", ["authorization_code", "refresh_token"])
        return grant_type in allowed


class Code:
    def __init__(self, client_id: str, redirect_uri: str, scope: str, challenge: str, method: str):
        self.client_id, self.redirect_uri, self.scope = client_id, redirect_uri, scope
        self.code_challenge, self.code_challenge_method = challenge, method

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope


class Token:
    def __init__(self, client_id: str, token: dict[str, Any]) -> None:
        self.client_id = client_id
        self.access_token = token["access_token"]
        self.refresh_token = token.get("refresh_token")
        self.scope = token.get("scope", "mcp")
        self.expires_at = time.time() + token["expires_in"]
        self.revoked = False

    def check_client(self, client: Client) -> bool:
        return client.client_id == self.client_id

    def get_scope(self) -> str:
        return str(self.scope)

    def get_expires_in(self) -> int:
        return int(self.expires_at - time.time())

    def is_expired(self) -> bool:
        return time.time() >= self.expires_at

    def is_revoked(self) -> bool:
        return self.revoked

    def get_user(self) -> str:
        return "ann"

    def get_client(self) -> Client:
        return clients[self.client_id]


clients: dict[str, Client] = {
    "service": Client(
        "service", "service-secret", {"grant_types": ["client_credentials"], "redirect_uris": []}
    ),
}
codes: dict[str, Code] = {}
tokens: list[Token] = []


class AuthorizationCodeGrant(grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS

    def save_authorization_code(self, code: str, req: Any) -> None:
        p = req.payload
        codes[code] = Code(
            req.client.client_id,
            p.redirect_uri,
            p.scope or "mcp",
            p.data.get("code_challenge"),
            p.data.get("code_challenge_method"),
        )

    def query_authorization_code(self, code: str, client: Client) -> Code | None:
        found = codes.get(code)
        return found if found and found.client_id == client.client_id else None

    def delete_authorization_code(self, authorization_code: Code) -> None:
        for key, value in list(codes.items()):
            if value is authorization_code:
                del codes[key]

    def authenticate_user(self, authorization_code: Code) -> str:
        return "ann"


class RefreshTokenGrant(grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS
    INCLUDE_NEW_REFRESH_TOKEN = True  # rotation

    def authenticate_refresh_token(self, refresh_token: str) -> Token | None:
        for token in tokens:
            if token.refresh_token == refresh_token and not token.revoked:
                return token
        return None

    def authenticate_user(self, refresh_token: Token) -> str:
        return "ann"

    def revoke_old_credential(self, refresh_token: Token) -> None:
        refresh_token.revoked = True


class ClientCredentialsGrant(grants.ClientCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS


class Revocation(RevocationEndpoint):
    CLIENT_AUTH_METHODS = AUTH_METHODS

    def query_token(self, token_string: str, token_type_hint: str | None) -> Token | None:
        for token in tokens:
            if token_string in (token.access_token, token.refresh_token):
                return token
        return None

    def revoke_token(self, token: Token, req: Any) -> None:
        token.revoked = True


class Registration(ClientRegistrationEndpoint):
    def authenticate_token(self, req: Any) -> bool:
        return True  # open registration, as MCP clients expect

    def get_server_metadata(self) -> dict[str, Any]:
        return metadata()

    def save_client(self, client_info: dict[str, Any], client_metadata: dict[str, Any], req: Any):
        secret = client_info.get("client_secret") or ""
        if client_metadata.get("token_endpoint_auth_method") == "none":
            secret = ""
        client = Client(client_info["client_id"], secret, client_metadata)
        clients[client.client_id] = client
        stats["register"] += 1
        return client


app = Flask(__name__)
app.config["OAUTH2_REFRESH_TOKEN_GENERATOR"] = True
app.config["OAUTH2_TOKEN_EXPIRES_IN"] = {
    "authorization_code": ACCESS_TTL_S,
    "refresh_token": ACCESS_TTL_S,
    "client_credentials": ACCESS_TTL_S,
}


def save_token(token: dict[str, Any], req: Any) -> None:
    tokens.append(Token(req.client.client_id, token))


server = AuthorizationServer(app, query_client=clients.get, save_token=save_token)
server.register_grant(AuthorizationCodeGrant, [CodeChallenge(required=True)])
server.register_grant(RefreshTokenGrant)
server.register_grant(ClientCredentialsGrant)
server.register_endpoint(Revocation)
server.register_endpoint(Registration(claims_classes=[ClientMetadataClaims]))
ISSUER = ""


def metadata() -> dict[str, Any]:
    return {
        "issuer": ISSUER,
        "authorization_endpoint": f"{ISSUER}/authorize",
        "token_endpoint": f"{ISSUER}/token",
        "registration_endpoint": f"{ISSUER}/register",
        "revocation_endpoint": f"{ISSUER}/revoke",
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": AUTH_METHODS,
        "scopes_supported": ["mcp"],
    }


@app.get("/.well-known/oauth-authorization-server")
def well_known() -> Any:
    return jsonify(metadata())


@app.get("/authorize")
def authorize() -> Any:
    with lock:  # ann is logged in and consents
        return server.create_authorization_response(grant_user="ann")


@app.post("/token")
def token() -> Any:
    grant_type = request.form.get("grant_type", "?")
    if grant_type == "refresh_token":
        time.sleep(REFRESH_S)  # a slow refresh: workers that need one meet while it runs
    with lock:
        stats[grant_type] += 1
        return server.create_token_response()


@app.post("/revoke")
def revoke() -> Any:
    with lock:
        return server.create_endpoint_response(Revocation.ENDPOINT_NAME)


@app.post("/register")
def register() -> Any:
    with lock:
        return server.create_endpoint_response(ClientRegistrationEndpoint.ENDPOINT_NAME)


@app.post("/expire")
def expire() -> Any:
    """The test's hook: an access token ends early (its refresh token lives on)."""
    with lock:
        for t in tokens:
            if t.access_token == request.form["token"]:
                t.expires_at = time.time()
    return jsonify({})


@app.get("/stats")
def get_stats() -> Any:
    return jsonify(dict(stats))


class Verifier:
    """The resource server's check: a live token this authorization server issued."""

    async def verify_token(self, token: str) -> AccessToken | None:
        with lock:
            for t in tokens:
                if t.access_token == token and not t.revoked and not t.is_expired():
                    return AccessToken(token=token, client_id=t.client_id, scopes=["mcp"])
        return None


def main(as_port: int, mcp_port: int) -> None:
    global ISSUER
    ISSUER = f"http://127.0.0.1:{as_port}"
    http = make_server("127.0.0.1", as_port, app, threaded=True)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    mcp = MCPServer(
        "clawq-test-oauth",
        log_level="WARNING",
        token_verifier=Verifier(),
        auth=AuthSettings(
            issuer_url=ISSUER,
            resource_server_url=f"http://127.0.0.1:{mcp_port}/mcp",
            required_scopes=["mcp"],
            validate_token_resource=False,
        ),
    )

    @mcp.tool()
    def whoami() -> str:
        """Say who is calling."""
        return "ann, with a token"

    mcp.run("streamable-http", host="127.0.0.1", port=mcp_port)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))

"""OAuth 2.1 for MCP servers against a real authorization server (authlib's, with PKCE
required and rotating refresh tokens; tests/mcp_servers/oauth_server.py) guarding an MCP
server built with the SDK: a person's login (discovery, dynamic registration, code with
PKCE), one refresh made by two mcp workers that need it at once, the rotated refresh token
kept, a revoked grant reported with its fix, and client credentials for a service."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from broker.config.secretbox import SecretBox, new_key
from broker.pg.store import Store
from broker.stores.mcp_oauth import McpOAuthStore
from orchestrator.admin.mcp import McpAdmin
from tests.conftest import Isolated
from tests.workers.mcp_harness import free_port, wait_for_port
from workers.tools.mcp.client import CatalogStore, McpError, McpManager
from workers.tools.mcp.oauth import OAuthAuth

REDIRECT = "http://127.0.0.1:9/callback"  # the browser's last hop: read, never followed


class Servers:
    def __init__(self) -> None:
        self.as_port, self.mcp_port = free_port(), free_port()
        ports = [str(self.as_port), str(self.mcp_port)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_servers.oauth_server", *ports],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.proc, self.as_port)
        wait_for_port(self.proc, self.mcp_port)
        self.issuer = f"http://127.0.0.1:{self.as_port}"
        self.url = f"http://127.0.0.1:{self.mcp_port}/mcp"

    def stats(self) -> dict[str, int]:
        return dict(httpx.get(f"{self.issuer}/stats").json())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def servers() -> Iterator[Servers]:
    s = Servers()
    yield s
    s.close()


class World:
    """PostgreSQL and Redis of this test, the settings of its workers, and the admin."""

    def __init__(self, isolated: Isolated, servers: Servers, oauth: dict[str, Any]) -> None:
        self.servers = servers
        self.key = new_key()
        self.allow = [f"127.0.0.1:{servers.as_port}", f"127.0.0.1:{servers.mcp_port}"]
        self.settings = isolated.settings.model_copy(
            update={"secret_key": self.key, "web_private_allow": self.allow}
        )
        self.env = {
            **isolated.env(),
            "CLAWQ_SECRET_KEY": self.key,
            "CLAWQ_WEB_PRIVATE_ALLOW": json.dumps(self.allow),
        }
        self.store = Store(isolated.database_url)
        self.admin = McpAdmin(self.store, settings=self.settings)
        self.admin.add({"mcpServers": {"sec": {"url": servers.url, "oauth": oauth}}})
        self.grants = McpOAuthStore(self.store, SecretBox.from_settings(self.settings))
        self.managers: list[tuple[McpManager, CatalogStore]] = []

    def login(self) -> None:
        """The person's part: open the URL, consent, come back with the code."""
        start = self.admin.login_start("sec", REDIRECT)
        back = httpx.get(start.url, follow_redirects=False)
        assert back.status_code == 302, back.text
        query = parse_qs(urlparse(back.headers["location"]).query)
        assert back.headers["location"].startswith(REDIRECT + "?")
        assert self.admin.login_finish(query["state"][0], query["code"][0]) == "sec"

    def manager(self) -> McpManager:
        catalog = CatalogStore(self.settings)
        auth = OAuthAuth(self.settings, catalog.oauth_rows())
        made = McpManager(self.settings, catalog.load, catalog.on_listed, auth)
        self.managers.append((made, catalog))
        return made

    def expire(self) -> str:
        """The access token runs out (as time would); returns the refresh token."""
        stored = self.grants.load("sec")
        assert stored is not None
        self.grants.save("sec", stored.grant.model_copy(update={"expires_at": time.time() - 1}))
        return stored.grant.refresh_token

    def close(self) -> None:
        for manager, catalog in self.managers:
            manager.close()
            catalog.close()
        self.store.close()


@pytest.fixture
def world(isolated: Isolated, servers: Servers) -> Iterator[Any]:
    made: list[World] = []

    def make(oauth: dict[str, Any] | None = None) -> World:
        made.append(World(isolated, servers, oauth or {}))
        return made[-1]

    yield make
    for w in made:
        w.close()


def test_a_person_logs_in_with_pkce_and_the_workers_use_the_grant(world: Any) -> None:
    w = world()
    assert w.admin.status()[0].auth == "login needed: run `clawq mcp login sec`"
    with pytest.raises(McpError, match="needs a login: an admin must run `clawq mcp login sec`"):
        w.manager().call("sec", "whoami", {})
    w.login()
    assert w.servers.stats() == {"register": 1, "authorization_code": 1}
    assert w.admin.status()[0].auth == "ok"
    stored = w.grants.load("sec")
    assert stored is not None and stored.grant.refresh_token
    sealed = w.store.conn.execute("SELECT sealed FROM mcp_oauth").fetchone()["sealed"]
    assert stored.grant.access_token not in sealed and stored.grant.refresh_token not in sealed
    done = w.manager().call("sec", "whoami", {})
    assert done["content"][0]["text"] == "ann, with a token"


def test_two_workers_refresh_once_and_keep_the_rotated_token(world: Any, tmp_path: Path) -> None:
    w = world()
    w.login()
    old = w.expire()
    go = tmp_path / "go"
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.workers.oauth_worker", "sec", "whoami", str(go)],
            env={**w.env, "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(1.0)  # both imported and waiting
    go.touch()
    said = [json.loads(p.communicate(timeout=60)[0]) for p in workers]
    assert [s["content"][0]["text"] for s in said] == ["ann, with a token"] * 2, said
    assert w.servers.stats()["refresh_token"] == 1  # one refresh across both workers
    stored = w.grants.load("sec")
    assert stored is not None and stored.grant.refresh_token not in ("", old)  # rotated, kept
    w.expire()  # and the rotated one works (the old one was revoked when it was used)
    assert not w.manager().call("sec", "whoami", {})["isError"]
    assert w.servers.stats()["refresh_token"] == 2


def test_a_revoked_grant_is_reported_with_its_fix(world: Any) -> None:
    w = world()
    w.login()
    stored = w.grants.load("sec")
    assert stored is not None
    revoked = httpx.post(
        f"{w.servers.issuer}/revoke",
        data={
            "token": stored.grant.refresh_token,
            "client_id": stored.grant.client_id,
            "client_secret": stored.grant.client_secret,
        },
    )
    assert revoked.status_code == 200, revoked.text
    w.expire()
    with pytest.raises(McpError) as refused:
        w.manager().call("sec", "whoami", {})
    assert "refused its OAuth grant (revoked: invalid_grant" in str(refused.value)
    assert str(refused.value).endswith("an admin must run `clawq mcp login sec`")
    (listed,) = w.admin.status()
    assert listed.auth.startswith("revoked (invalid_grant") and listed.auth.endswith(
        "run `clawq mcp login sec`"
    )
    w.login()  # the fix
    assert w.admin.status()[0].auth == "ok"


def test_a_service_account_uses_client_credentials(world: Any) -> None:
    w = world(
        {"grant": "client_credentials", "client_id": "service", "client_secret": "service-secret"}
    )
    assert w.admin.status()[0].auth == ""  # nothing for a person to do
    manager = w.manager()
    for _ in range(3):
        assert manager.call("sec", "whoami", {})["content"][0]["text"] == "ann, with a token"
    assert w.servers.stats() == {"client_credentials": 1}
    assert "service-secret" not in json.dumps(w.admin.servers()[0].public())


def test_an_access_token_the_server_refuses_is_refreshed_once(world: Any) -> None:
    w = world()
    w.login()
    stored = w.grants.load("sec")
    assert stored is not None
    # it ends early at the authorization server, not by the clock we know: a 401
    httpx.post(f"{w.servers.issuer}/expire", data={"token": stored.grant.access_token})
    assert w.manager().call("sec", "whoami", {})["content"][0]["text"] == "ann, with a token"
    assert w.servers.stats()["refresh_token"] == 1


def _clawq_login(w: World, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "mcp", "login", "sec", *extra],
        env={**w.env, "PATH": "/usr/bin:/bin", "TERM": "dumb"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _printed_url(login: subprocess.Popen[str]) -> str:
    assert login.stdout is not None
    for line in login.stdout:
        if line.startswith("http"):
            return line.strip()
    raise AssertionError(login.stderr.read() if login.stderr else "no URL printed")


def test_clawq_mcp_login_catches_the_redirect_on_a_loopback_port(world: Any) -> None:
    w = world()
    login = _clawq_login(w)
    url = _printed_url(login)
    landed = httpx.get(url, follow_redirects=True)  # the browser: consent, then back home
    assert landed.status_code == 200 and "clawq has the code" in landed.text
    out, err = login.communicate(timeout=30)
    assert login.returncode == 0 and out.strip() == "logged in to sec", err
    assert w.admin.status()[0].auth == "ok"
    assert w.manager().call("sec", "whoami", {})["content"][0]["text"] == "ann, with a token"


def test_clawq_mcp_login_takes_a_pasted_address(world: Any) -> None:
    w = world()
    login = _clawq_login(w, "--paste")
    url = _printed_url(login)
    ended = httpx.get(url, follow_redirects=False).headers["location"]  # nothing listens
    out, err = login.communicate(ended + "\n", timeout=30)
    assert login.returncode == 0 and out.strip().endswith("logged in to sec"), err
    assert w.admin.status()[0].auth == "ok"


def test_the_api_logs_in_with_its_own_callback_and_for_the_remote_client(world: Any) -> None:
    from broker.stores.api_keys import ApiKeyStore
    from orchestrator.client.remote import RemoteClient

    w = world()
    key = ApiKeyStore(w.store).create("root", admin=True)[1]
    port = free_port()
    serve = ["api", "--port", str(port), "--log-level", "warning"]
    api = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *serve],
        env={**w.env, "PATH": "/usr/bin:/bin"},
    )
    try:
        wait_for_port(api, port)
        base = f"http://127.0.0.1:{port}"
        started = httpx.post(
            f"{base}/v1/mcp/servers/sec/login",
            json={},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert started.status_code == 200, started.text
        landed = httpx.get(started.json()["url"], follow_redirects=True)
        assert str(landed.url).startswith(f"{base}/oauth/mcp/callback?")
        assert landed.text == "logged in to sec; you may close this tab\n"
        forged = httpx.get(f"{base}/oauth/mcp/callback", params={"state": "k1:AAAA", "code": "x"})
        assert forged.status_code == 400 and "not one clawq made" in forged.text

        with RemoteClient(api_url=base, api_key=key) as remote:
            (listed,) = remote.mcp.status()
            assert listed.auth == "ok"
            start = remote.mcp.login_start("sec", REDIRECT)  # a client that catches it itself
            back = httpx.get(start.url, follow_redirects=False).headers["location"]
            code = parse_qs(urlparse(back).query)["code"][0]
            assert remote.mcp.login_finish(start.state, code) == "sec"
        assert w.servers.stats()["authorization_code"] == 2
    finally:
        api.terminate()
        api.wait(10)


def test_a_grant_revoked_while_connected_is_reported_with_its_fix(world: Any) -> None:
    w = world()
    w.login()
    manager = w.manager()
    assert not manager.call("sec", "whoami", {})["isError"]  # connected, with a live token
    stored = w.grants.load("sec")
    assert stored is not None
    httpx.post(
        f"{w.servers.issuer}/revoke",
        data={
            "token": stored.grant.refresh_token,
            "client_id": stored.grant.client_id,
            "client_secret": stored.grant.client_secret,
        },
    ).raise_for_status()
    # the access token went with it (one grant): the next request is refused with a 401
    with pytest.raises(McpError) as refused:
        manager.call("sec", "whoami", {})
    assert "refused its OAuth grant (revoked: invalid_grant" in str(refused.value)
    assert str(refused.value).endswith("an admin must run `clawq mcp login sec`")

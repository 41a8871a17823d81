"""The Python client over the HTTP API: `Client(api_url=..., api_key=...)`.

The same methods and models as the direct client, so a remote user needs an API key and
no database or Redis credentials: `submit`, `job(id)` with `events`, `wait`, `result`,
`approve`, `cancel`, `steer`, `subagents`; `mcp` and `custom_tools` for administration.
An error the API answers becomes a `ClientError` with its message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Unpack

import httpx
from httpx_sse import connect_sse

from broker.config.mcp import Grant
from broker.protocol import FINAL_STATUSES, Event, JobResult, Subagent
from broker.stores.custom_tools import CustomTool
from broker.stores.mcp import AccessRequest, McpToolRow, ServerStatus
from broker.stores.requests import AnswerValue, PersonRequest
from orchestrator.admin.definitions import read_definition
from orchestrator.admin.fork import Fork
from orchestrator.admin.mcp_login import LoginStart
from orchestrator.admin.replay import ReplayDiff
from orchestrator.client.base import Client, ClientError, Job, JobOptions, ReplayChanges


def _check(response: httpx.Response) -> httpx.Response:
    if response.is_success:
        return response
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:300] or response.reason_phrase
    raise ClientError(f"{message} (HTTP {response.status_code})")


def _for_subject(
    server: str, agent: str | None, user: str | None, allow: list[str] | None, **more: Any
) -> dict[str, Any]:
    """The body of a grant or an access request (the API's `ForSubject`)."""
    return {"server": server, "agent": agent, "user": user, "allow": allow or [], **more}


class RemoteJob(Job):
    def __init__(self, client: Client, job_id: str) -> None:
        if not isinstance(client, RemoteClient):
            raise TypeError(f"a remote job needs a RemoteClient, not {type(client).__name__}")
        super().__init__(client, job_id)
        self.client = client

    def events(self, after: str | None = None) -> Iterator[Event]:
        """Every event after `after`, until the job ends; a dropped stream is resumed
        from the last event seen (`Last-Event-ID`)."""
        last = after
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            try:
                with connect_sse(
                    self.client.http,
                    "GET",
                    f"/v1/jobs/{self.id}/events",
                    headers=headers,
                    timeout=httpx.Timeout(10.0, read=None),
                ) as source:
                    _check(source.response)
                    for sse in source.iter_sse():
                        event = Event.model_validate(json.loads(sse.data))
                        last = event.id
                        yield event
                        if event.type == "job_finished":
                            return
            except (httpx.RemoteProtocolError, httpx.ReadError):
                time.sleep(0.2)  # resumed from `last`
                continue
            if self.result().status in FINAL_STATUSES:
                return

    def wait(self, timeout: float | None = None) -> JobResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            result = self.result()
            if result.status in FINAL_STATUSES:
                return result
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} still {result.status} after {timeout}s")
            time.sleep(0.1)

    def result(self) -> JobResult:
        return JobResult.model_validate(_check(self.client.http.get(f"/v1/jobs/{self.id}")).json())

    def approve(self, request_id: str, decision: str, by: str = "", admin: bool = True) -> None:
        """Over the API the key says who answers and whether it is an admin's."""
        _check(
            self.client.http.post(
                f"/v1/jobs/{self.id}/approvals/{request_id}", json={"decision": decision}
            )
        )

    def answer(
        self,
        request_id: str,
        answer: AnswerValue | None = None,
        by: str = "",
        *,
        decline: bool = False,
    ) -> None:
        """Over the API the key says who answers."""
        body: dict[str, Any] = {"decline": True} if decline else {"answer": answer}
        _check(self.client.http.post(f"/v1/jobs/{self.id}/inputs/{request_id}", json=body))

    def steer(self, message: str) -> None:
        _check(self.client.http.post(f"/v1/jobs/{self.id}/steer", json={"message": message}))

    def cancel(self) -> None:
        _check(self.client.http.post(f"/v1/jobs/{self.id}/cancel"))

    def subagents(self) -> list[Subagent]:
        found = _check(self.client.http.get(f"/v1/jobs/{self.id}/subagents")).json()
        return [Subagent.model_validate(s) for s in found]


class RemoteMcp:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def add(self, config: dict[str, Any] | str | Path) -> list[str]:
        body = read_definition(config)
        return list(_check(self.http.post("/v1/mcp/servers", json=body)).json())

    def remove(self, name: str) -> None:
        _check(self.http.delete(f"/v1/mcp/servers/{name}"))

    def login_start(self, name: str, redirect_uri: str | None = None) -> LoginStart:
        body = {"redirect_uri": redirect_uri}
        return LoginStart.model_validate(
            _check(self.http.post(f"/v1/mcp/servers/{name}/login", json=body)).json()
        )

    def login_finish(self, state: str, code: str) -> str:
        done = _check(self.http.post("/v1/mcp/login", json={"state": state, "code": code}))
        return str(done.json()["server"])

    def status(self) -> list[ServerStatus]:
        found = _check(self.http.get("/v1/mcp/servers")).json()
        return [ServerStatus.model_validate(s) for s in found]

    def tools(self) -> list[McpToolRow]:
        return [McpToolRow.model_validate(t) for t in _check(self.http.get("/v1/mcp/tools")).json()]

    def grant(
        self,
        server: str,
        *,
        agent: str | None = None,
        user: str | None = None,
        allow: list[str] | None = None,
        deny: list[str] | None = None,
        by: str = "",
    ) -> None:
        body = _for_subject(server, agent, user, allow, deny=deny or [])
        _check(self.http.post("/v1/mcp/grants", json=body))

    def revoke(self, server: str, *, agent: str | None = None, user: str | None = None) -> None:
        params = {k: v for k, v in (("agent", agent), ("user", user)) if v}
        _check(self.http.delete(f"/v1/mcp/grants/{server}", params=params))

    def grants(self) -> list[Grant]:
        return [Grant.model_validate(g) for g in _check(self.http.get("/v1/mcp/grants")).json()]

    def request(
        self,
        server: str,
        *,
        agent: str | None = None,
        user: str | None = None,
        allow: list[str] | None = None,
        reason: str = "",
        by: str = "",
    ) -> str:
        body = _for_subject(server, agent, user, allow, reason=reason)
        return str(_check(self.http.post("/v1/mcp/requests", json=body)).json()["id"])

    def requests(self, status: str | None = "pending") -> list[AccessRequest]:
        found = _check(self.http.get("/v1/mcp/requests", params={"status": status or "all"}))
        return [AccessRequest.model_validate(r) for r in found.json()]

    def review(self, request_id: str, approve: bool, by: str = "") -> AccessRequest:
        body = {"decision": "approve" if approve else "reject"}
        done = _check(self.http.post(f"/v1/mcp/requests/{request_id}/review", json=body))
        return AccessRequest.model_validate(done.json())


class RemoteCustomTools:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def put(self, config: dict[str, Any] | str | Path) -> CustomTool:
        body = read_definition(config)
        return CustomTool.model_validate(
            _check(self.http.put("/v1/custom-tools", json=body)).json()
        )

    def list(self) -> list[CustomTool]:
        return [
            CustomTool.model_validate(t) for t in _check(self.http.get("/v1/custom-tools")).json()
        ]

    def show(self, name: str, agent_id: str = "") -> CustomTool:
        found = _check(self.http.get(f"/v1/custom-tools/{name}", params={"agent": agent_id}))
        return CustomTool.model_validate(found.json())

    def enable(self, name: str, agent_id: str = "", enabled: bool = True) -> None:
        action = "enable" if enabled else "disable"
        _check(self.http.post(f"/v1/custom-tools/{name}/{action}", params={"agent": agent_id}))

    def remove(self, name: str, agent_id: str = "") -> None:
        _check(self.http.delete(f"/v1/custom-tools/{name}", params={"agent": agent_id}))


class RemoteClient(Client, kind="remote"):
    """A `Client` whose every call is an HTTP request to the API."""

    job_kind = RemoteJob

    def __init__(
        self, settings: object = None, *, api_url: str | None = None, api_key: str | None = None
    ) -> None:
        if not api_url or not api_key:
            raise ClientError("the HTTP client needs api_url and api_key")
        self.api_url = api_url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(30.0),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RemoteClient:
        return self

    def submit(self, prompt: str, **options: Unpack[JobOptions]) -> RemoteJob:
        body: dict[str, Any] = {"prompt": prompt, **options}
        for rules in ("allow", "ask", "deny"):
            body[rules] = list(body.get(rules, ()))
        job_id = _check(self.http.post("/v1/jobs", json=body)).json()["job_id"]
        return RemoteJob(self, job_id)

    def job(self, job_id: str) -> RemoteJob:
        return RemoteJob(self, job_id)

    def requests(self, user: str | None = None) -> list[PersonRequest]:
        """The key's user's pending approvals and questions (an admin's key: everyone's,
        or `user`'s)."""
        params = {"status": "pending", **({"user": user} if user else {})}
        found = _check(self.http.get("/v1/requests", params=params)).json()
        return [PersonRequest.model_validate(r) for r in found]

    def replay(self, job_id: str, **changes: Unpack[ReplayChanges]) -> RemoteJob:
        """Run a recorded job again, its calls answered from its ledger (`Client.replay`)."""
        found = _check(self.http.post(f"/v1/jobs/{job_id}/replay", json=dict(changes)))
        return RemoteJob(self, found.json()["job_id"])

    def fork(
        self,
        job_id: str,
        at: int,
        *,
        message: str = "",
        workspace: str = "",
        model: str = "",
        script: dict[str, Any] | None = None,
    ) -> Fork:
        """A new job from a recorded job's turn `at`, its workspace as it was (`Client.fork`)."""
        body = {"at": at, "message": message, "workspace": workspace, "model": model}
        body |= {"script": script} if script is not None else {}
        return Fork.model_validate(
            _check(self.http.post(f"/v1/jobs/{job_id}/fork", json=body)).json()
        )

    def replay_diff(self, replay_id: str) -> ReplayDiff:
        """How a replay differs from its original."""
        return ReplayDiff.model_validate(_check(self.http.get(f"/v1/jobs/{replay_id}/diff")).json())

    @property
    def mcp(self) -> RemoteMcp:
        return RemoteMcp(self.http)

    @property
    def custom_tools(self) -> RemoteCustomTools:
        return RemoteCustomTools(self.http)

"""A person's requests over the HTTP API and on the inbox page (issue 31), on a real
cluster and API: the pending requests are listed per user, a question is answered by its
user (another's is 404), and the inbox page, opened in real Chromium by a signed link (a
browser sends no key), lists a user's requests and allows, denies and answers them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from broker.stores.api_keys import ApiKeyStore
from tests.integration.conftest import Cluster, call, script, serve_api, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(groups=("fs", "runtime"), park_after_s=0.5, approval_timeout_s=0)


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[str]:
    yield from serve_api(cluster)


@pytest.fixture(scope="module")
def keys(cluster: Cluster) -> dict[str, str]:
    store = ApiKeyStore(cluster.client.store)
    return {
        "alice": store.create("alice")[1],
        "bob": store.create("bob")[1],
        "admin": store.create("root", admin=True)[1],
    }


def http(api: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def submit(user: httpx.Client, workspace: Path, *turns: dict[str, Any], **extra: Any) -> str:
    body = {"prompt": "p", "workspace": str(workspace), "script": script(*turns), **extra}
    answer = user.post("/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["job_id"])


def pending(user: httpx.Client, job_id: str, count: int = 1) -> list[dict[str, Any]]:
    def found() -> list[dict[str, Any]]:
        mine = [r for r in user.get("/v1/requests").json() if r["job_id"] == job_id]
        return mine if len(mine) == count else []

    return wait_until(found, 30, f"{count} pending requests of {job_id}")  # type: ignore[no-any-return]


def finished(cluster: Cluster, job_id: str) -> Any:
    return cluster.client.job(job_id).wait(timeout=60)


def test_requests_are_listed_per_user_and_a_question_is_answered_by_its_user(
    cluster: Cluster, api: str, keys: dict[str, str], workspace: Path
) -> None:
    with (
        http(api, keys["alice"]) as alice,
        http(api, keys["bob"]) as bob,
        http(api, keys["admin"]) as admin,
    ):
        job = submit(
            alice,
            workspace,
            {"tool_calls": [call("q", "ask_user", question="Colour?", choices=["red", "blue"])]},
            {"text": "done"},
        )
        (request,) = pending(alice, job)
        assert request["kind"] == "question" and request["question"]["choices"] == [
            "red",
            "blue",
        ]
        assert [r for r in bob.get("/v1/requests").json() if r["job_id"] == job] == []
        as_alice = bob.get("/v1/requests", params={"user": "alice"}).json()
        assert [r for r in as_alice if r["job_id"] == job] == []  # a user's own only
        everyone = admin.get("/v1/requests").json()
        assert request["id"] in {r["id"] for r in everyone}
        path = f"/v1/jobs/{job}/inputs/{request['id']}"
        assert bob.post(path, json={"answer": "red"}).status_code == 404
        wrong = alice.post(path, json={"answer": "green"})
        assert wrong.status_code == 400 and "red, blue" in wrong.text, wrong.text
        assert alice.post(path, json={"answer": "blue"}).status_code == 204
        again = alice.post(path, json={"answer": "red"})
        assert again.status_code == 409, again.text
    result = finished(cluster, job)
    assert (
        result.status == "completed" and result.tool_calls[0].output == "api:alice answered: blue"
    )


def test_the_inbox_page_lists_allows_denies_and_answers_in_chromium(
    cluster: Cluster, api: str, keys: dict[str, str], workspace: Path
) -> None:
    from playwright.sync_api import sync_playwright

    write = call("w", "write_file", path="inbox.txt", content="allowed")
    with http(api, keys["alice"]) as alice, http(api, keys["bob"]) as bob:
        allowed = submit(
            alice, workspace, {"tool_calls": [write]}, {"text": "a"}, ask=["write_file"]
        )
        denied = submit(
            alice,
            workspace,
            {"tool_calls": [call("x", "write_file", path="denied.txt", content="no")]},
            {"text": "d"},
            ask=["write_file"],
        )
        asked = submit(
            alice,
            workspace,
            {"tool_calls": [call("q", "ask_user", question="Ship it?", choices=["yes", "no"])]},
            {"text": "q"},
        )
        for job in (allowed, denied, asked):
            pending(alice, job)
        link = alice.get("/v1/inbox-link").json()["url"]
        bobs = bob.get("/v1/inbox-link").json()["url"]
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            page = chromium.new_context().new_page()  # no Authorization header
            assert page.goto(link).status == 200
            for job in (allowed, denied, asked):
                assert page.locator(f"text=job {job}").count() == 1
            page.locator(".req", has_text=f"job {allowed}").get_by_role(
                "button", name="allow-once"
            ).click()
            page.wait_for_selector("#notice")
            assert "allow-once: write_file" in page.inner_text("#notice")
            page.locator(".req", has_text=f"job {denied}").get_by_role(
                "button", name="deny"
            ).click()
            page.wait_for_selector(f".req:has-text('job {asked}')")
            page.locator(".req", has_text=f"job {asked}").get_by_role("button", name="no").click()
            page.wait_for_selector("#notice")
            assert page.locator(f"text=job {asked}").count() == 0
            # bob's link shows none of alice's, and answers none of them
            other = chromium.new_context().new_page()
            assert other.goto(bobs).status == 200
            assert other.locator(f"text=job {allowed}").count() == 0
            query = parse_qs(urlsplit(bobs).query)
            tampered = link[:-2] + ("AA" if not link.endswith("AA") else "BB")
            assert other.goto(tampered).status == 401
        finally:
            chromium.close()
    assert finished(cluster, allowed).status == "completed"
    assert (workspace / "inbox.txt").read_text() == "allowed"
    no = finished(cluster, denied)
    assert no.tool_calls[0].is_error and "inbox:alice denied write_file" in no.tool_calls[0].output
    assert not (workspace / "denied.txt").exists()
    assert finished(cluster, asked).tool_calls[0].output == "inbox:alice answered: no"
    # a request of alice's, posted with bob's link: 404, and nothing answered
    with http(api, keys["alice"]) as alice:
        late = submit(alice, workspace, {"tool_calls": [write]}, {"text": "l"}, ask=["write_file"])
        (request,) = pending(alice, late)
        refused = httpx.post(
            f"{api}/v1/inbox/{request['id']}",
            params={k: v[0] for k, v in query.items()},
            data={"decision": "allow-once"},
        )
        assert refused.status_code == 404, refused.text
        assert [r["id"] for r in alice.get("/v1/requests").json() if r["job_id"] == late] == [
            request["id"]
        ]
        cluster.client.job(late).cancel()

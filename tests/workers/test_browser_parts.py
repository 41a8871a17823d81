"""The browser's pure parts: snapshots cut to what can be acted on, capped with a marker,
diffed against the previous one; and the connect-time egress proxy, on real sockets."""

from __future__ import annotations

import asyncio

from tests.sites import Reply, Site
from workers.egress_proxy import EgressProxy
from workers.netguard import EgressPolicy, parse_private_allow
from workers.tools.ui import snapshot as snap

TREE = """- generic [ref=e1]:
  - heading "Signup" [level=1] [ref=e2]
  - paragraph [ref=e3]:
    - text: Outside the form
    - link "Other page" [ref=e4] [cursor=pointer]:
      - /url: /other
  - generic [ref=e5]:
    - textbox "Name" [active] [ref=e6]
    - combobox "Color" [ref=e9]:
      - option "red" [selected]
    - button "Submit" [ref=e10]"""


def test_interactive_lines_keep_refs_and_drop_structure() -> None:
    assert snap.lines_of(TREE, interactive=True) == [
        '- heading "Signup" [level=1] [ref=e2]',
        '- link "Other page" [ref=e4] [cursor=pointer]',
        '- textbox "Name" [ref=e6]',
        '- combobox "Color" [ref=e9]',
        '- option "red" [selected]',
        '- button "Submit" [ref=e10]',
    ]
    assert len(snap.lines_of(TREE, interactive=False)) == len(TREE.splitlines())


def test_a_long_snapshot_is_cut_at_a_line_with_a_marker() -> None:
    lines = [f'- link "page {i}" [ref=e{i}]' for i in range(200)]
    text = snap.cap(lines, 500)
    body, marker = text.rsplit("\n", 1)
    assert len(body) <= 500 and body.endswith("]") and marker.startswith("[snapshot cut at")


def test_a_diff_names_only_what_changed() -> None:
    before = ['- textbox "Name" [ref=e6]', '- button "Go" [ref=e7]']
    after = ['- textbox "Name" [ref=e6]: Alice', '- button "Go" [ref=e7]', '- link "x" [ref=e8]']
    out = snap.diff(before, after).splitlines()
    assert out[0] == "[changes since the last snapshot: 2 added, 1 removed]"
    assert set(out[1:]) == {
        '+ - textbox "Name" [ref=e6]: Alice',
        '+ - link "x" [ref=e8]',
        '- - textbox "Name" [ref=e6]',
    }
    assert snap.diff(after, after) == "[no change since the last snapshot]"


async def _through(proxy: EgressProxy, target: str, host_header: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host_header}\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


def test_the_proxy_checks_the_address_it_connects_to() -> None:
    with Site({"/": Reply(body=b"inside")}) as allowed, Site({"/": Reply(body=b"x")}) as victim:
        networks, endpoints = parse_private_allow([allowed.endpoint])
        policy = EgressPolicy(private_networks=networks, private_endpoints=endpoints)
        blocked: list[str] = []

        async def scenario() -> tuple[bytes, bytes, bytes]:
            proxy = EgressProxy(policy, lambda host, why: blocked.append(f"{host} {why}"))
            await proxy.start()
            try:
                ok = await _through(proxy, f"{allowed.url}/", allowed.endpoint)
                refused = await _through(proxy, f"{victim.url}/", victim.endpoint)
                named = await _through(proxy, f"http://localhost:{victim.port}/", "localhost")
                return ok, refused, named
            finally:
                await proxy.stop()

        ok, refused, named = asyncio.run(scenario())
    assert ok.startswith(b"HTTP/1.0 200") or ok.startswith(b"HTTP/1.1 200")
    assert ok.endswith(b"inside")
    assert refused.startswith(b"HTTP/1.1 403") and named.startswith(b"HTTP/1.1 403")
    assert victim.seen == []  # refused before any connection was made
    assert any("loopback" in b for b in blocked) and any("localhost" in b for b in blocked)

"""The guarded egress client against real local servers: what it refuses (an SSRF corpus
where nothing reaches the victim server), what it follows, and what it caps."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import pytest

from broker.config.settings import Settings
from tests.sites import Reply, Site, gzipped, redirect
from workers.egress.client import Egress
from workers.egress.netguard import EgressError, EgressPolicy, check_host, parse_private_allow

PUBLIC = "93.184.216.34"  # a public address no test ever reaches (no network here)


@pytest.fixture
def victim() -> Iterator[Site]:
    """A server on loopback that must never see a request."""
    with Site({"/": Reply(200, b"secret")}) as site:
        yield site


@pytest.fixture
def allowed() -> Iterator[Site]:
    """A server the policy lets through (`CLAWQ_WEB_PRIVATE_ALLOW`), for redirects."""
    with Site() as site:
        yield site


NAMES = {
    "rebind.test": ["127.0.0.1"],
    "mixed.test": [PUBLIC, "127.0.0.1"],
    "v6loop.test": ["::1"],
    "mapped.test": ["::ffff:127.0.0.1"],
    "meta.test": ["169.254.169.254"],
    "private.test": ["10.1.2.3"],
}


def resolver(host: str, port: int) -> list[str]:
    if host in NAMES:
        return NAMES[host]
    raise EgressError("url_not_accessible", f"{host} does not resolve")


def egress(*private: str, **policy: object) -> Egress:
    networks, endpoints = parse_private_allow(list(private))
    return Egress(
        EgressPolicy(private_networks=networks, private_endpoints=endpoints, **policy),  # type: ignore[arg-type]
        resolver=resolver,
    )


def ssrf_forms(port: int) -> list[str]:
    v = port
    return [
        f"http://127.0.0.1:{v}/",
        f"http://localhost:{v}/",
        f"http://LOCALHOST:{v}/",
        f"http://localhost.:{v}/",
        f"http://foo.localhost:{v}/",
        f"http://127.1:{v}/",
        f"http://127.0.1:{v}/",
        f"http://0x7f000001:{v}/",
        f"http://0x7f.0.0.1:{v}/",
        f"http://0177.0.0.1:{v}/",
        f"http://2130706433:{v}/",
        f"http://017700000001:{v}/",
        f"http://0.0.0.0:{v}/",
        f"http://0:{v}/",
        f"http://[::1]:{v}/",
        f"http://[::]:{v}/",
        f"http://[::ffff:127.0.0.1]:{v}/",
        f"http://[0:0:0:0:0:ffff:127.0.0.1]:{v}/",
        f"http://[::127.0.0.1]:{v}/",
        f"http://[64:ff9b::7f00:1]:{v}/",
        f"http://[2002:7f00:1::]:{v}/",
        f"http://[2001:0:4136:e378:8000:63bf:80ff:fffe]:{v}/",
        f"http://[fe80::1]:{v}/",
        f"http://[fc00::1]:{v}/",
        f"http://[fec0::1]:{v}/",
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.170.2/v2/credentials",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://metadata/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://100.100.100.200/latest/meta-data/",
        "http://168.63.129.16/machine",
        f"http://10.0.0.1:{v}/",
        "http://192.168.1.1/",
        "http://172.16.0.1/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
        "http://255.255.255.255/",
        "http://198.18.0.1/",
        "http://example.internal/",
        "http://printer.local/",
        "http://router.home.arpa/",
        "http://intranet/",
        f"http://user:pass@127.0.0.1:{v}/",
        f"http://rebind.test:{v}/",
        f"http://mixed.test:{v}/",
        f"http://v6loop.test:{v}/",
        f"http://mapped.test:{v}/",
        "http://meta.test/",
        "http://private.test/",
        f"gopher://127.0.0.1:{v}/",
        f"ftp://127.0.0.1:{v}/",
        "file:///etc/passwd",
    ]


def test_an_ssrf_corpus_never_reaches_a_blocked_address(victim: Site, allowed: Site) -> None:
    forms = ssrf_forms(victim.port)
    assert len(forms) >= 40
    client = egress(allowed.endpoint)
    refused = {}
    for url in forms:
        with pytest.raises(EgressError) as caught:
            client.request("GET", url)
        refused[url] = caught.value
    assert {e.code for e in refused.values()} <= {"url_not_allowed", "invalid_input"}, {
        u: str(e) for u, e in refused.items() if e.code not in ("url_not_allowed", "invalid_input")
    }
    # and through a redirect from an allowed server, each hop checked again
    for n, url in enumerate(f for f in forms if f.startswith("http")):
        allowed.routes[f"/r{n}"] = redirect(url)
        with pytest.raises(EgressError) as caught:
            client.request("GET", f"{allowed.url}/r{n}")
        assert caught.value.code in ("url_not_allowed", "invalid_input"), (url, caught.value)
    assert victim.seen == []  # nothing ever reached it
    client.close()


def test_messages_say_why_in_one_line() -> None:
    client = egress()
    cases = {
        "http://127.0.0.1/": "url_not_allowed: 127.0.0.1, a loopback address",
        "http://0x7f000001/": (
            "url_not_allowed: 0x7f000001 is a numeric address in a non-standard form"
        ),
        "http://rebind.test/": (
            "url_not_allowed: rebind.test resolves to 127.0.0.1, a loopback address"
        ),
        "http://169.254.169.254/": "url_not_allowed: 169.254.169.254, a cloud metadata address",
        "http://x.internal/": "url_not_allowed: x.internal is an internal host name",
        "ftp://example.com/": "url_not_allowed: the scheme ftp is not http(s)",
        "http://example.com/" + "a" * 2000: "url_too_long: the URL is longer than 2000 characters",
    }
    for url, message in cases.items():
        with pytest.raises(EgressError) as caught:
            client.request("GET", url)
        assert str(caught.value) == message and "\n" not in message
    client.close()


def test_private_allow_lets_one_server_through_and_not_another_port(
    allowed: Site, victim: Site
) -> None:
    allowed.routes["/hi"] = Reply(200, b"hello")
    client = egress(allowed.endpoint)
    assert client.request("GET", f"{allowed.url}/hi").body == b"hello"
    with pytest.raises(EgressError, match="loopback"):
        client.request("GET", f"{victim.url}/")
    assert victim.seen == []
    ranged = egress("127.0.0.0/8")  # a CIDR exempts every port
    assert ranged.request("GET", f"{victim.url}/").body == b"secret"
    client.close()
    ranged.close()


def test_the_connection_goes_to_the_address_that_was_checked(allowed: Site) -> None:
    """DNS rebinding: the name is resolved once; a second answer is never asked for."""
    answers = iter([["127.0.0.1"], ["10.0.0.1"]])
    calls = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers)

    allowed.routes["/"] = Reply(200, b"first answer")
    networks, endpoints = parse_private_allow([allowed.endpoint])
    client = Egress(
        EgressPolicy(private_networks=networks, private_endpoints=endpoints), resolver=rebinding
    )
    assert client.request("GET", f"http://site.test:{allowed.port}/").body == b"first answer"
    assert calls == ["site.test"]
    assert allowed.seen[0].headers["host"] == f"site.test:{allowed.port}"  # Host as requested
    client.close()


def test_redirect_chains_loops_and_headers(allowed: Site) -> None:
    u = allowed.url
    allowed.routes.update(
        {
            "/a": redirect(f"{u}/b", 301),
            "/b": redirect("/c", 307),
            "/c": redirect(f"{u}/d", 308),
            "/d": Reply(200, b"end of the chain"),
            "/long": redirect(f"{u}/a"),
            "/loop1": redirect(f"{u}/loop2"),
            "/loop2": redirect(f"{u}/loop1"),
            "/see-other": redirect(f"{u}/d", 303),
        }
    )
    client = egress(allowed.endpoint)
    done = client.request("GET", f"{u}/a", headers={"Authorization": "Bearer x"})
    assert (done.body, done.redirects, done.url) == (b"end of the chain", 3, f"{u}/d")
    with pytest.raises(EgressError, match="more than 3 redirects"):
        client.request("GET", f"{u}/long")
    with pytest.raises(EgressError, match="redirect loop"):
        client.request("GET", f"{u}/loop1")
    posted = client.request("POST", f"{u}/see-other", content=b"x")
    assert posted.body == b"end of the chain" and allowed.seen[-1].method == "GET"
    # same origin keeps Authorization; another origin (another port) drops it and cookies
    with Site({"/": Reply(200, b"other")}) as other:
        allowed.routes["/away"] = redirect(f"{other.url}/")
        both = egress(allowed.endpoint, other.endpoint)
        both.request("GET", f"{u}/away", headers={"Authorization": "Bearer x", "Cookie": "s=1"})
        assert "authorization" not in other.seen[0].headers
        assert "cookie" not in other.seen[0].headers
        both.close()
    assert allowed.seen[1].headers.get("authorization") == "Bearer x"
    client.close()


def test_bodies_are_capped_after_decompression(allowed: Site) -> None:
    allowed.routes.update(
        {
            "/big": Reply(200, b"x" * 300_000),
            "/gz": gzipped(b"hello gzip"),
            "/bomb": gzipped(b"\0" * 50_000_000),
        }
    )
    client = egress(allowed.endpoint, max_body_bytes=100_000)
    big = client.request("GET", f"{allowed.url}/big")
    assert big.truncated and len(big.body) == 100_000
    assert client.request("GET", f"{allowed.url}/gz").body == b"hello gzip"
    bomb = client.request("GET", f"{allowed.url}/bomb")
    assert bomb.truncated and len(bomb.body) == 100_000  # stopped at the cap
    assert len(gzip.compress(b"\0" * 50_000_000)) < 100_000  # it really was a bomb
    client.close()


def test_a_gzip_bomb_costs_the_cap_not_its_ratio(allowed: Site) -> None:
    """Measured in a fresh process: 200 MB of zeros in 190 KB of gzip, read with the
    default 5 MiB cap. Inflating whole chunks (httpx's decoder) peaked 64-128 MiB above
    the start; bounded steps cost the body and one copy of it (the bytes returned)."""
    import json
    import subprocess
    import sys

    cap = 5 * 2**20
    allowed.routes["/bomb"] = gzipped(b"\0" * 200_000_000)
    args = (allowed.endpoint, str(cap))
    probe = subprocess.run(
        [sys.executable, "-m", "tests.workers.bomb_probe", f"{allowed.url}/bomb", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(probe.stdout)
    assert got["body"] == cap and got["truncated"]
    assert got["traced_peak_mib"] <= 2 * cap / 2**20 + 1.5, got
    assert got["rss_growth_mib"] <= 2 * cap / 2**20 + 8, got


def test_codings_other_than_gzip_and_deflate_are_not_decoded(allowed: Site) -> None:
    import zlib

    text = b"deflated words " * 100
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    allowed.routes.update(
        {
            "/deflate": Reply(200, zlib.compress(text), headers={"Content-Encoding": "deflate"}),
            "/raw": Reply(
                200, raw.compress(text) + raw.flush(), headers={"Content-Encoding": "deflate"}
            ),
            "/xgz": Reply(200, gzip.compress(text), headers={"Content-Encoding": "x-gzip"}),
            "/br": Reply(200, b"\x1b\x03", headers={"Content-Encoding": "br"}),
            "/broken": Reply(200, b"not gzip at all", headers={"Content-Encoding": "gzip"}),
        }
    )
    client = egress(allowed.endpoint)
    for path in ("/deflate", "/raw", "/xgz"):
        assert client.request("GET", f"{allowed.url}{path}").body == text, path
    assert allowed.seen[0].headers["accept-encoding"] == "gzip, deflate"  # no br, no zstd
    with pytest.raises(EgressError, match="encoded as br, not gzip or deflate"):
        client.request("GET", f"{allowed.url}/br")
    with pytest.raises(EgressError, match="the body does not decode"):
        client.request("GET", f"{allowed.url}/broken")
    client.close()


def test_a_slow_server_times_out(allowed: Site) -> None:
    allowed.routes["/slow"] = Reply(200, b"late", delay_s=2.0)
    client = egress(allowed.endpoint, read_timeout_s=0.5)
    with pytest.raises(EgressError) as caught:
        client.request("GET", f"{allowed.url}/slow")
    assert caught.value.code == "url_not_accessible" and "timed out" in caught.value.reason
    client.close()


def test_domain_lists_and_the_fake_ip_switch() -> None:
    policy = EgressPolicy(
        allow_domains=("example.com", "*.docs.org"), block_domains=("bad.example.com",)
    )
    for host in ["example.com", "api.example.com", "EXAMPLE.com.", "a.docs.org", "x.a.docs.org"]:
        assert check_host(host, policy) is None, host
    assert check_host("notbad.example.com", policy) is None  # not a subdomain of bad.…
    for host, why in [  # a list entry is a domain, never a suffix of the text
        ("docs.org", "not on the allowed domain list"),
        ("bad.example.com", "on the blocked domain list"),
        ("deep.bad.example.com", "on the blocked domain list"),
        ("evil.com", "not on the allowed domain list"),
        ("evilexample.com", "not on the allowed domain list"),
        ("example.com.evil.net", "not on the allowed domain list"),
        ("xdocs.org", "not on the allowed domain list"),
        ("docs.org.evil.net", "not on the allowed domain list"),
    ]:
        with pytest.raises(EgressError, match=why):
            check_host(host, policy)
    from ipaddress import ip_address

    from workers.egress.netguard import blocked_reason

    assert blocked_reason(ip_address("198.18.0.1"), EgressPolicy()) is not None
    assert blocked_reason(ip_address("198.18.0.1"), EgressPolicy(allow_fake_ips=True)) is None
    assert blocked_reason(ip_address(PUBLIC), EgressPolicy()) is None


def test_bad_private_allow_entries_are_configuration_errors() -> None:
    with pytest.raises(ValueError, match="'nonsense' is neither a CIDR nor an address:port"):
        EgressPolicy.from_settings(Settings(web_private_allow=["nonsense"]))
    networks, endpoints = parse_private_allow(["10.0.0.0/8", "127.0.0.1:8080", "[::1]:9000"])
    assert [str(n) for n in networks] == ["10.0.0.0/8"]
    assert endpoints == {("127.0.0.1", 8080), ("::1", 9000)}


def test_a_proxy_carries_every_request_and_the_names_are_still_checked(victim: Site) -> None:
    # a forward proxy sees the absolute URL in the request line: this one answers itself
    with Site({"/page": Reply(200, b"through the proxy")}) as proxy:
        networks, endpoints = parse_private_allow([proxy.endpoint])
        client = Egress(
            EgressPolicy(proxy=proxy.url, private_networks=networks, private_endpoints=endpoints),
            resolver=lambda host, port: [PUBLIC] if host == "public.test" else resolver(host, port),
        )
        done = client.request("GET", "http://public.test/page")
        assert done.body == b"through the proxy"
        (request,) = proxy.seen
        assert request.headers["host"] == "public.test"  # the proxy was asked for the target
        for url in (
            "http://rebind.test/",
            f"http://127.0.0.1:{victim.port}/",
            "http://x.internal/",
        ):
            with pytest.raises(EgressError, match="url_not_allowed"):
                client.request("GET", url)
        assert len(proxy.seen) == 1 and victim.seen == []
        client.close()

"""What an outbound request may reach: the checks of the egress client, as pure functions.

A URL passes when its scheme is http(s), it fits the length limit, its host is not an
internal name, not a non-canonical IPv4 literal (`0177.0.0.1`, `0x7f.1`, `2130706433`,
`127.1`: the forms `inet_aton` accepts and a resolver would turn into loopback), and the
domain lists let it through. An address passes when it is globally reachable: never
loopback, private, link-local, CGNAT, multicast, reserved or unspecified, v4 or v6, never
IPv4 inside IPv6 (mapped, compatible, 6to4, NAT64, Teredo), never a cloud metadata
address; `CLAWQ_WEB_PRIVATE_ALLOW` exempts CIDRs or `host:port` pairs (intranets, tests).
The connect-time part (resolve once, check every answer, connect to the checked address)
is `workers.egress.client`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Literal

import httpx

from broker.config.settings import Settings
from broker.errors import RunError

ErrorCode = Literal[
    "url_not_allowed",
    "url_not_accessible",
    "url_too_long",
    "unsupported_content_type",
    "too_many_requests",
    "invalid_input",
]

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
INTERNAL_SUFFIXES = (".localhost", ".local", ".internal", ".home.arpa", ".localdomain")
INTERNAL_NAMES = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "ip6-loopback",
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.com",
        "metadata.tencentyun.com",
    }
)
# cloud metadata and platform endpoints, some of them on public addresses
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.123",
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
        "168.63.129.16",  # Azure WireServer (a public address)
        "fd00:ec2::254",
    )
)
FAKE_IP_RANGE = ipaddress.ip_network("198.18.0.0/15")  # benchmarking; proxies' fake IPs
CGNAT = ipaddress.ip_network("100.64.0.0/10")
EMBEDS_V4 = (
    ipaddress.ip_network("::ffff:0:0/96"),  # IPv4-mapped
    ipaddress.ip_network("::/96"),  # IPv4-compatible (deprecated)
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64
    ipaddress.ip_network("64:ff9b:1::/48"),  # local-use NAT64
    ipaddress.ip_network("2002::/16"),  # 6to4
    ipaddress.ip_network("2001::/32"),  # Teredo
)
SITE_LOCAL = ipaddress.ip_network("fec0::/10")
_NUMBER = re.compile(r"^(0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*)$")
_CANONICAL_V4 = re.compile(
    r"^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$"
)


class EgressError(RunError):
    """A refused or failed outbound request; `code` is the one the model is told."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class EgressPolicy:
    allow_domains: tuple[str, ...] = ()
    block_domains: tuple[str, ...] = ()
    private_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    private_endpoints: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    allow_fake_ips: bool = False
    proxy: str = ""
    max_redirects: int = 3
    max_url_chars: int = 2000
    max_body_bytes: int = 5 * 1024 * 1024
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0

    @classmethod
    def from_settings(cls, settings: Settings) -> EgressPolicy:
        networks, endpoints = parse_private_allow(settings.web_private_allow)
        return cls(
            allow_domains=tuple(d.lower().rstrip(".") for d in settings.web_allow_domains),
            block_domains=tuple(d.lower().rstrip(".") for d in settings.web_block_domains),
            private_networks=networks,
            private_endpoints=endpoints,
            allow_fake_ips=settings.web_allow_fake_ip_range,
            proxy=settings.web_proxy,
            max_redirects=settings.web_max_redirects,
            max_url_chars=settings.web_max_url_chars,
            max_body_bytes=settings.web_max_body_bytes,
            connect_timeout_s=settings.web_connect_timeout_s,
            read_timeout_s=settings.web_read_timeout_s,
        )


def parse_private_allow(
    entries: list[str],
) -> tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...], frozenset[tuple[str, int]]]:
    """`10.0.0.0/8`, `fd00::/8`, `127.0.0.1:8080`, `[::1]:8080`; a bad entry is a
    configuration error, raised at once."""
    networks, endpoints = [], set()
    for raw in entries:
        entry = raw.strip()
        match = re.fullmatch(r"\[?([0-9A-Fa-f:.]+)\]?:(\d{1,5})", entry)
        try:
            if match and "/" not in entry and (":" not in match.group(1) or entry.startswith("[")):
                address = ipaddress.ip_address(match.group(1))
                endpoints.add((str(address), int(match.group(2))))
            else:
                networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"CLAWQ_WEB_PRIVATE_ALLOW: '{raw}' is neither a CIDR nor an address:port"
            ) from None
    return tuple(networks), frozenset(endpoints)


def domain_matches(host: str, pattern: str) -> bool:
    """`example.com` covers it and its subdomains; `*.example.com` the subdomains only."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern or host.endswith("." + pattern)


def ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """The address of a host written as an IPv4 literal; a numeric form other than the
    canonical dotted quad is refused (a resolver would read `0x7f.1` as 127.0.0.1)."""
    parts = host.rstrip(".").split(".")
    if not 1 <= len(parts) <= 4 or not all(_NUMBER.match(p) for p in parts):
        return None
    if not _CANONICAL_V4.match(host.rstrip(".")):
        raise EgressError("url_not_allowed", f"{host} is a numeric address in a non-standard form")
    return ipaddress.IPv4Address(host.rstrip("."))


def literal_address(host: str) -> IP | None:
    """The host as an IP address if it is one (IPv6 without brackets, no zone id)."""
    if ":" in host:
        if "%" in host:
            raise EgressError("url_not_allowed", f"{host}: zoned IPv6 addresses are not allowed")
        try:
            return ipaddress.IPv6Address(host.strip("[]"))
        except ValueError:
            raise EgressError("url_not_allowed", f"{host} is not a valid address") from None
    return ipv4_literal(host)


def check_host(host: str, policy: EgressPolicy) -> IP | None:
    """Refuse internal names and domains the lists exclude; returns the literal address
    when the host is one (checked by `check_address` with the port)."""
    name = host.lower().rstrip(".")
    if not name:
        raise EgressError("invalid_input", "the URL has no host")
    address = literal_address(name)
    if address is None:
        if name in INTERNAL_NAMES or name.endswith(INTERNAL_SUFFIXES) or "." not in name:
            raise EgressError("url_not_allowed", f"{name} is an internal host name")
        if any(domain_matches(name, d) for d in policy.block_domains):
            raise EgressError("url_not_allowed", f"{name} is on the blocked domain list")
        if policy.allow_domains and not any(domain_matches(name, d) for d in policy.allow_domains):
            raise EgressError("url_not_allowed", f"{name} is not on the allowed domain list")
    elif policy.allow_domains and not any(str(address) == d for d in policy.allow_domains):
        raise EgressError("url_not_allowed", f"{address} is not on the allowed domain list")
    return address


def blocked_reason(address: IP, policy: EgressPolicy) -> str | None:
    """Why an address may not be reached (None: it may)."""
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_loopback:  # ::1 lies in ::/96 too: name it for what it is
            return "a loopback address"
        if any(address in net for net in EMBEDS_V4):
            return "IPv4 inside IPv6 (mapped, 6to4, NAT64 or Teredo)"
        if address in SITE_LOCAL:
            return "a site-local IPv6 address"
    if address.is_multicast:
        return "a multicast address"
    if policy.allow_fake_ips and address in FAKE_IP_RANGE:
        return None
    if address.version == 4 and address in CGNAT:
        return "a carrier-grade NAT address"
    if not address.is_global or address.is_reserved or address.is_unspecified:
        kind = (
            "loopback"
            if address.is_loopback
            else "link-local"
            if address.is_link_local
            else "private"
            if address.is_private
            else "reserved"
        )
        return f"a {kind} address"
    return None


def check_address(address: IP, port: int, policy: EgressPolicy, host: str = "") -> None:
    """Refuse an address outside the public internet, unless it is exempted."""
    if (str(address), port) in policy.private_endpoints or any(
        address in net for net in policy.private_networks if net.version == address.version
    ):
        return
    if reason := blocked_reason(address, policy):
        shown = f"{host} resolves to {address}" if host and host != str(address) else str(address)
        raise EgressError("url_not_allowed", f"{shown}, {reason}")


def check_url(url: httpx.URL, policy: EgressPolicy) -> None:
    """What can be judged before connecting: scheme, length, credentials, host, lists."""
    if len(str(url)) > policy.max_url_chars:
        raise EgressError(
            "url_too_long", f"the URL is longer than {policy.max_url_chars} characters"
        )
    if url.scheme not in ("http", "https"):
        raise EgressError("url_not_allowed", f"the scheme {url.scheme or '(none)'} is not http(s)")
    if url.userinfo:
        raise EgressError("url_not_allowed", "credentials in the URL are not sent")
    check_host(url.host, policy)


def check_target(url: httpx.URL, policy: EgressPolicy) -> None:
    """`check_url`, and a host written as an address checked as connecting to it would be
    (for those who cannot, or need not, resolve: the browser's route, a cached page)."""
    check_url(url, policy)
    address = literal_address(url.host.lower().rstrip("."))
    if address is not None:
        check_address(address, url.port or (443 if url.scheme == "https" else 80), policy)


def parse_url(url: str) -> httpx.URL:
    try:
        return httpx.URL(url.strip())
    except httpx.InvalidURL as exc:
        raise EgressError("invalid_input", f"not a valid URL: {exc}") from None

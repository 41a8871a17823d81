"""Running the API: uvicorn, refusing plain HTTP on a reachable address unless a proxy in
front terminates TLS (`CLAWQ_API_BEHIND_TLS_PROXY`)."""

from __future__ import annotations

import ipaddress

from broker.config.settings import Settings
from broker.errors import ConfigurationError


class ExposureError(ConfigurationError):
    """The API would serve plain HTTP to the network: the message says what to set."""


def loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings, host: str) -> None:
    tls = bool(settings.api_tls_certfile and settings.api_tls_keyfile)
    if not loopback(host) and not tls and not settings.api_behind_tls_proxy:
        raise ExposureError(
            f"the API would serve plain HTTP on {host}, reachable from the network: give "
            "CLAWQ_API_TLS_CERTFILE and CLAWQ_API_TLS_KEYFILE, or set "
            "CLAWQ_API_BEHIND_TLS_PROXY=true if a proxy in front terminates TLS"
        )


def serve(settings: Settings, host: str, port: int, log_level: str = "info") -> None:
    import uvicorn

    from orchestrator.api.app import create_app

    check_exposure(settings, host)
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=log_level,
        ssl_certfile=settings.api_tls_certfile or None,
        ssl_keyfile=settings.api_tls_keyfile or None,
        proxy_headers=settings.api_behind_tls_proxy,
        access_log=False,
        timeout_graceful_shutdown=5,
    )

"""What tts and image share: provider failures that move on to the next provider, one
request through the egress client with the vendor's own error text, the daily quota of
`CLAWQ_MEDIA_QUOTA_PER_DAY` (web_search's Redis `Quota`, so it holds across every worker)
and keeping a result as an artifact."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from broker.errors import RunError
from workers.tool import ToolContext

if TYPE_CHECKING:
    from workers.egress.client import Fetched


class ProviderError(RunError):
    """This provider could not do it (not configured, HTTP error, tool missing): the next
    one is tried, and the reason is kept for the final error."""


class Refused(RunError):
    """The provider refused the content itself; another would be asked the same thing, so
    this is said to the model and no other provider is tried."""


def take_quota(ctx: ToolContext, provider: str) -> None:
    """Count one request to `provider`, or refuse it when today's quota is spent. The
    Redis key is `…:quota:media:<provider>:<day>`, apart from web_search's."""
    limit = ctx.settings.media_quota_per_day.get(provider)
    if limit is None or ctx.redis is None:
        return
    from workers.tools.web.shared import Quota

    if not Quota(ctx.redis, f"media:{provider}", limit).take():
        raise ProviderError(f"today's quota of {limit} requests is used up")


def vendor_error(body: bytes) -> tuple[str, str, str]:
    """(message, type, code) of an error body: OpenAI's `{"error": {...}}` or
    ElevenLabs' `{"detail": {...}}` / `{"detail": "..."}`; empty strings when neither."""
    try:
        payload: Any = json.loads(body)
    except ValueError:
        return "", "", ""
    if not isinstance(payload, dict):
        return "", "", ""
    error = payload.get("error", payload.get("detail"))
    if isinstance(error, str):
        return error[:300], "", ""
    if not isinstance(error, dict):
        return "", "", ""
    kind = error.get("type") or error.get("status") or ""
    return str(error.get("message") or "")[:300], str(kind), str(error.get("code") or "")


def send(
    ctx: ToolContext,
    method: str,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    headers: dict[str, str] | None = None,
    json_body: Any = None,
) -> Fetched:
    """One request through the egress client; refusals, timeouts and a body over the cap
    become a `ProviderError`. The status is the caller's to judge (see `check`)."""
    import httpx

    from workers.egress.client import egress_for
    from workers.egress.netguard import EgressError

    timeout = httpx.Timeout(timeout_s, connect=ctx.settings.web_connect_timeout_s)
    extra: dict[str, Any] = {"timeout": timeout}
    if json_body is not None:
        extra["json"] = json_body
    try:
        fetched = egress_for(ctx.settings).request(
            method, url, headers=headers, max_bytes=max_bytes, **extra
        )
    except EgressError as exc:
        raise ProviderError(exc.reason) from None
    if fetched.truncated:
        raise ProviderError(f"the answer is over {max_bytes} bytes")
    return fetched


def check(fetched: Fetched) -> Fetched:
    """The response when it succeeded; otherwise a `ProviderError` with the status and the
    vendor's message."""
    if fetched.status < 400:
        return fetched
    message = vendor_error(fetched.body)[0]
    said = f": {message}" if message else ""
    if fetched.status in (401, 403):
        raise ProviderError(f"the API key was refused (HTTP {fetched.status}){said}")
    raise ProviderError(f"HTTP {fetched.status}{said}")

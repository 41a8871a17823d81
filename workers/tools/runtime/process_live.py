"""A background process's output as `tool_output_delta` events of the job that started it,
while it runs: the `start` call's id, name `process`, and the process id (`process`).

The worker that runs `start` writes `live.json` into the process's state directory (the
job, the call, the process id, the worker's limits) and hands the supervisor what belongs
in neither argv nor a file, in its environment: the Redis URL (it may hold a password) and
the literal secrets the worker's scrubber knows. The supervisor takes both out of its
environment at once, so the command never inherits them, and scrubs with the same
`Scrubber`. It feeds a `LiveOutput` only after its output file has the chunk: a Redis
failure loses deltas, never the process or its output.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from pydantic import BaseModel

from workers.tool import ToolContext
from workers.tools.runtime.live_output import LiveOutput

log = logging.getLogger("clawq.process")
REDIS_ENV = "CLAWQ_PROCSUP_REDIS_URL"
SECRETS_ENV = "CLAWQ_PROCSUP_SECRETS"
SPEC = "live.json"
REDIS_TIMEOUT_S = 5.0  # a Redis that stops answering holds the sender thread no longer


class LiveSpec(BaseModel):
    """What the supervisor needs to send deltas (the names LiveOutput reads of settings)."""

    job_id: str
    call_id: str
    process: str
    stream_delta_interval_ms: int
    stream_delta_max_chars: int
    tool_output_stream_max_bytes: int
    events_ttl_s: int


def prepare(ctx: ToolContext, state: Path, process_id: str) -> dict[str, str]:
    """Write the spec when the call's output may be streamed; returns the supervisor's
    environment: the worker's, with the Redis URL and the scrubber's secrets then."""
    env = {k: v for k, v in os.environ.items() if k not in (REDIS_ENV, SECRETS_ENV)}
    s = ctx.settings
    if ctx.redis is None or not ctx.job_id or s.tool_output_stream_max_bytes <= 0:
        return env
    spec = LiveSpec(
        job_id=ctx.job_id,
        call_id=ctx.call_id,
        process=process_id,
        stream_delta_interval_ms=s.stream_delta_interval_ms,
        stream_delta_max_chars=s.stream_delta_max_chars,
        tool_output_stream_max_bytes=s.tool_output_stream_max_bytes,
        events_ttl_s=s.events_ttl_s,
    )
    (state / SPEC).write_text(spec.model_dump_json())
    secrets = list(ctx.scrub.literals) if ctx.scrub is not None else []
    return env | {REDIS_ENV: s.redis_url, SECRETS_ENV: json.dumps(secrets)}


def feed(state: Path) -> LiveOutput | None:
    """The supervisor's live output (None when there is none, or it cannot be made: the
    process runs either way). Takes the URL and the secrets out of the environment."""
    url = os.environ.pop(REDIS_ENV, "")
    secrets = os.environ.pop(SECRETS_ENV, "[]")
    if not url or not (state / SPEC).exists():
        return None
    try:
        import redis

        from workers.scrub import Scrubber

        spec = LiveSpec.model_validate_json((state / SPEC).read_text())
        client = redis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        scrub = Scrubber(json.loads(secrets))
        extra = {"process": spec.process}
        return LiveOutput(client, spec.job_id, spec.call_id, "process", spec, scrub, extra)
    except Exception as exc:  # never the process's failure
        log.warning("%s: no live output: %s", state.name, type(exc).__name__)
        return None


def tell(live: LiveOutput | None, stream: str, chunk: bytes) -> None:
    """Hand `chunk` to the live output, if any; nothing it does stops the supervisor."""
    if live is None:
        return
    try:
        live.chunk(stream, chunk)
    except Exception as exc:
        log.warning("live output lost a chunk: %s", type(exc).__name__)

"""Every error clawq raises on purpose, by audience: who must act on it.

    ClawqError
    ├── ConfigurationError        a developer or an operator must fix the setup
    │   └── (settings, live configuration, tool declarations, MCP server definitions,
    │        search providers, the API's exposure, sealed secrets)
    ├── RequestError              a caller's request is refused; the API answers it
    │   ├── Invalid          400  invalid_input: the request is malformed; `field` names where
    │   ├── Unauthorized     401  unauthorized: no key, or not a live one
    │   ├── Forbidden        403  forbidden: beyond what the caller may do
    │   ├── NotFound         404  not_found: no such object, or not the caller's
    │   ├── Conflict         409  conflict: the object is not in a state that allows it
    │   ├── Gone             410  gone: the object was, its content is no more
    │   ├── RateLimited      429  rate_limited: too many requests, slow down
    │   └── TooManyJobs      429  too_many_jobs: wait for one to end
    ├── RunError                  went wrong while running: a tool, a provider, the network
    │   └── Unavailable      503  a service (Redis, PostgreSQL) is away: retry
    └── Signal                    not a failure: control flow (a job cancelled, a call not
                                  admitted)

Errors of libraries (Celery, kombu, redis, psycopg, docker, mcp, httpx) are converted where
they enter (`raise OurError(...) from exc`). The HTTP API has one handler for the tree
(orchestrator/api/app.py): a `RequestError` becomes its status and code; routes raise.
"""

from __future__ import annotations

from typing import ClassVar


class ClawqError(Exception):
    """The root of every error clawq raises on purpose."""


class ConfigurationError(ClawqError):
    """The setup is wrong (settings, live configuration, a declaration): fix it, then retry."""


class RequestError(ClawqError):
    """A caller's request is refused. `status` and `code` are the API's answer; `field`, when
    set, names the part of the request at fault."""

    status: ClassVar[int] = 400
    code: ClassVar[str] = "invalid_input"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class Invalid(RequestError):
    """The request is malformed; the message says what to change."""


class Unauthorized(RequestError):
    status, code = 401, "unauthorized"


class Forbidden(RequestError):
    status, code = 403, "forbidden"


class NotFound(RequestError):
    status, code = 404, "not_found"


class Conflict(RequestError):
    status, code = 409, "conflict"


class Gone(RequestError):
    status, code = 410, "gone"


class RateLimited(RequestError):
    status, code = 429, "rate_limited"


class TooManyJobs(RequestError):
    status, code = 429, "too_many_jobs"


class RunError(ClawqError):
    """Something went wrong while running: a tool, a provider, the network."""


class Unavailable(RunError):
    """A service clawq needs is away; what was asked may be asked again."""


class Signal(ClawqError):
    """Control flow carried by an exception, not a failure."""

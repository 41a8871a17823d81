"""The cron tool as a worker runs it, on real PostgreSQL: a user's scheduled jobs are that
user's alone (listed, changed, run and removed only by jobs acting for that user), even
under the same agent and the same name."""

from __future__ import annotations

from typing import Any

from broker.pg.store import Store
from broker.protocol import CallContext, JobSpec
from tests.conftest import Isolated
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult

REGISTRY = default_registry()


def test_scheduled_jobs_are_scoped_by_user(isolated: Isolated) -> None:
    store = Store(isolated.database_url)
    try:
        for user in ("ann", "bob"):
            spec = JobSpec(prompt="p", workspace="/tmp", user_id=user, allow=["cron"])
            store.create_job(f"job-{user}", f"s-{user}", spec, user_id=user)

        def cron(user: str, **args: Any) -> ToolResult:
            ctx = ToolContext(
                CallContext(workspace="/tmp", user_id=user, agent_id="main"),
                isolated.settings,
                job_id=f"job-{user}",
                session_id=f"s-{user}",
                store=lambda: store,
            )
            return run_tool(REGISTRY, "cron", args, ctx)

        added = cron("ann", action="add", name="ping", kind="every", every_s=3600, prompt="p")
        assert not added.is_error, added.for_llm
        assert cron("bob", action="list").for_llm == "no scheduled jobs"
        assert cron("bob", action="status").metadata["jobs"] == 0
        for action in ("runs", "run", "remove"):
            other = cron("bob", action=action, name="ping")
            assert other.is_error and "no scheduled job named ping" in other.for_llm, action
        changed = cron("bob", action="update", name="ping", prompt="hijacked")
        assert changed.is_error and "no scheduled job named ping" in changed.for_llm
        # the same name is bob's own entry, beside ann's
        assert not cron(
            "bob", action="add", name="ping", kind="every", every_s=7200, prompt="b"
        ).is_error
        assert "every 1 hour" in cron("ann", action="list").for_llm
        assert "every 2 hours" in cron("bob", action="list").for_llm
        assert not cron("ann", action="remove", name="ping").is_error
        assert cron("ann", action="list").for_llm == "no scheduled jobs"
        assert "every 2 hours" in cron("bob", action="list").for_llm
        rows = store.conn.execute("SELECT user_id, prompt FROM cron_jobs").fetchall()
        assert [(r["user_id"], r["prompt"]) for r in rows] == [("bob", "b")]
    finally:
        store.close()

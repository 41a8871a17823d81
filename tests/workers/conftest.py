from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import CallContext
from tests.conftest import Isolated
from tests.workers.mcp_harness import harness as harness  # the MCP tests' fixture
from workers.execute import run_tool as execute_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult


class Runner:
    """Calls a tool in-process exactly as a worker does: validate, then run."""

    def __init__(self, workspace: Path, settings: Settings, network: bool = False) -> None:
        self.workspace = workspace
        self.settings = settings
        self.registry = default_registry()
        self.writable: list[str] = []
        self.network = network
        self.confined = False  # allowed only because commands run confined
        self.cancelled: Callable[[], str | None] = lambda: None

    def __call__(self, name: str, **raw: Any) -> ToolResult:
        ctx = ToolContext(
            context=CallContext(
                workspace=str(self.workspace),
                writable_paths=self.writable,
                network=self.network,
                confined=self.confined,
            ),
            settings=self.settings,
            cancelled=self.cancelled,
        )
        return execute_tool(self.registry, name, raw, ctx)


@pytest.fixture
def db(isolated: Isolated) -> Iterator[Store]:
    """A connection of the test's own to its isolated database."""
    store = Store(isolated.database_url)
    yield store
    store.close()


@pytest.fixture
def day(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """The quotas' UTC day, pinned (a test that spends a quota must not cross midnight);
    call it to move to another day."""
    from workers.tools.web import shared

    def set_day(value: str) -> None:
        monkeypatch.setattr(shared, "utc_day", lambda: value)

    set_day("20260601")
    return set_day


@pytest.fixture
def run_tool(workspace: Path) -> Runner:
    return Runner(workspace, Settings())

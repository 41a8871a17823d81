"""`clawq status` warns when the broker's Redis would lose work: no append-only file, or a
`maxmemory-policy` that evicts keys. On a Redis of the test's own (its settings changed
with CONFIG SET; the shared test Redis is never touched)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from orchestrator.cli import main as cli
from tests.chaos.services import OwnRedis


@pytest.fixture
def own() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    yield server
    server.stop()


def status(own: OwnRedis) -> tuple[dict[str, object], str]:
    result = CliRunner().invoke(cli.main, ["status", "--json"], env={"CLAWQ_REDIS_URL": own.url})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def test_a_redis_as_clawq_needs_it_raises_no_warning(own: OwnRedis) -> None:
    report, said = status(own)
    assert report["redis"] == {
        "aof_enabled": True,
        "maxmemory_policy": "noeviction",
        "warnings": [],
    }
    assert "warning" not in said


def test_no_append_only_file_and_eviction_are_warned_about(own: OwnRedis) -> None:
    with redis.Redis(port=own.port) as client:
        client.config_set("appendonly", "no")
        client.config_set("maxmemory-policy", "allkeys-lru")
    report, said = status(own)
    assert report["redis"]["aof_enabled"] is False  # type: ignore[index]
    assert "warning: Redis has no append-only file (appendonly no)" in said
    assert "warning: Redis may evict keys (maxmemory-policy allkeys-lru)" in said

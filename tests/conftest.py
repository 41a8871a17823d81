"""Shared fixtures: each test (or module, for process stacks) gets its own Redis db and
PostgreSQL schema, so tests never see each other's state."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from broker.config.settings import Settings
from broker.pg.store import Store

# hypothesis keeps its caches (and would keep examples) under .hypothesis/ in the working
# directory: the run's own temp dir instead, so the checkout is left as it was
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", tempfile.mkdtemp(prefix="clawq-hypothesis-"))
REDIS_BASE = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379")
PG_BASE = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
TEST_DBS = range(1, 15)  # db 15 is the bench's (bench/__main__.py); db 0 holds the claims
# Take a db if free, or from a test process that is gone (a killed suite leaves its claims).
_TAKE = """
local owner = redis.call('GET', KEYS[1])
if not owner or owner == ARGV[2] then redis.call('SET', KEYS[1], ARGV[1]) return 1 end
return 0
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_db(wait_s: float = 600.0) -> int:
    """A Redis db no other test process on this machine holds: two suites run at once (a
    clean-clone CI run beside a developer's run) would otherwise flush each other's state."""
    deadline = time.monotonic() + wait_s
    with redis.Redis.from_url(f"{REDIS_BASE}/0") as claims:
        take = claims.register_script(_TAKE)
        while True:
            for db in TEST_DBS:
                key = f"clawq-test:db:{db}"
                owner = claims.get(key)
                gone = owner if owner and not _alive(int(owner)) else b""
                if (not owner or gone) and take(keys=[key], args=[os.getpid(), gone]):
                    return db
            if time.monotonic() > deadline:
                raise RuntimeError(f"every test Redis db ({TEST_DBS}) is held by a live process")
            time.sleep(0.2)


def release_db(db: int) -> None:
    with redis.Redis.from_url(f"{REDIS_BASE}/0") as claims:
        claims.delete(f"clawq-test:db:{db}")


class Isolated:
    """A Redis db and a PostgreSQL schema of one's own, and Settings that point at them."""

    def __init__(self, **overrides: object) -> None:
        self.db = claim_db()
        self.schema = "t_" + uuid.uuid4().hex[:12]
        self.redis_url = f"{REDIS_BASE}/{self.db}"
        self.database_url = f"{PG_BASE}?options=-csearch_path%3D{self.schema}"
        self.flush()
        with psycopg.connect(PG_BASE, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
        store = Store(self.database_url)
        store.migrate()
        store.close()
        self.spool_dir = tempfile.mkdtemp(prefix="clawq-spool-")  # workers' unrecorded outcomes
        self.settings = Settings.model_validate(
            {
                "redis_url": self.redis_url,
                "database_url": self.database_url,
                "spool_dir": self.spool_dir,
                **overrides,
            }
        )

    def env(self) -> dict[str, str]:
        return {
            "CLAWQ_REDIS_URL": self.redis_url,
            "CLAWQ_DATABASE_URL": self.database_url,
            "CLAWQ_SPOOL_DIR": self.spool_dir,
        }

    def flush(self) -> None:
        with redis.Redis.from_url(self.redis_url) as client:
            client.flushdb()

    def drop(self) -> None:
        self.flush()
        release_db(self.db)
        with psycopg.connect(PG_BASE, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {self.schema} CASCADE")
        shutil.rmtree(self.spool_dir, ignore_errors=True)


@pytest.fixture
def isolated() -> Iterator[Isolated]:
    iso = Isolated()
    yield iso
    iso.drop()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A skipped test is a failed one here: every test runs on the real components, which
    `make test` installs (tests/system-packages.sh); a missing one says so and fails."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped, which this suite does not allow: {reason}"

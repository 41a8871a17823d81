"""What a worker process does beside its calls: it follows the live configuration (its
settings and the scrubber that knows their secrets), ends the background processes of
sessions that ended, and reaps idle sandboxes. A part of `WorkerRuntime`."""

from __future__ import annotations

import logging
import threading
import time

import redis

from broker import keys
from broker.config.settings import Settings
from broker.pg.store import Store
from broker.redis.presence import Heartbeat
from workers import live
from workers.confine.sandbox import Sandbox, SandboxError
from workers.scrub import Scrubber, secrets_of
from workers.tools.runtime.process import end_session, state_root

log = logging.getLogger("clawq.worker")


class Upkeep:
    settings: Settings
    base_settings: Settings | None
    proc_id: str
    redis: redis.Redis
    heartbeat: Heartbeat
    scrub: Scrubber
    sandbox: Sandbox | None
    config_version: int
    _reloading: threading.Lock
    _retry_at: float

    def follow_config(self, version: int | None = None) -> bool:
        """Reload when the live configuration moved since it was loaded (`version`: its
        counter as a call's claim read it, -1 unread; None: read it now), so a change
        applied before a call is in force for it (the notice may be late); whether it
        reloaded. A load that failed is tried again at most once a second."""
        if version is None:
            from broker.config import live as live_config
            from broker.redis import changes

            try:
                version = changes.version(self.redis, live_config.TOPIC)
            except redis.RedisError:
                return False
        if version < 0 or version == self.config_version:
            return False
        if time.monotonic() < self._retry_at:
            return False
        self.reload_settings()
        return True

    def reload_settings(self, topic: str = "") -> None:
        """The environment's settings with the applied live configuration over them, and a
        scrubber that knows every secret they name; the next call uses them. A failure
        keeps what is in force."""
        with self._reloading:
            self._reload()

    def _reload(self) -> None:
        from broker.config.live import TOPIC, ConfigError, LiveConfigStore, effective, reject
        from broker.redis import changes

        base = self.base_settings or self.settings
        try:
            version = changes.version(self.redis, TOPIC)  # read first: a later move reloads
            if version == 0:  # nothing was ever applied: the environment rules
                self.config_version = 0
                return
            store = Store(base.database_url)
            try:
                current = LiveConfigStore(store.conn).current()
            finally:
                store.close()
        except Exception as exc:  # the schema not there yet, the database away: keep going
            log.warning("live configuration not loaded: %s", exc)
            self._retry_at = time.monotonic() + 1.0
            return
        self.config_version = version
        try:
            settings = effective(base, current.config if current else {})
        except ConfigError as exc:  # this process cannot run it: the last good one rules
            number = current.version if current else 0
            log.error("live configuration %s fails here (%s); rolling back", number, exc)
            reject(base, number, f"{self.proc_id}: {exc}")
            return
        # the scrubber first: a secret the new settings name is never out unscrubbed
        self.scrub = Scrubber(secrets_of(settings))
        self.settings = settings
        live.changed(settings)

    def end_sessions(self) -> None:
        """Kill the background processes of sessions whose job has ended."""
        root = state_root(self.settings)
        while not self.heartbeat.stopped.wait(2.0):
            try:
                sessions = [p.name for p in root.iterdir()] if root.exists() else []
                for session in sessions:
                    if self.redis.exists(keys.session_ended(session)):
                        killed = end_session(self.settings, session, self.sandbox)
                        log.info("session %s ended: %d processes killed", session, killed)
            except (OSError, redis.RedisError) as exc:
                log.warning("ending sessions: %s", exc)

    def sandbox_used(self, container: str) -> None:
        self.redis.set(
            keys.sandbox_used(container), self.proc_id, ex=int(self.settings.sandbox_idle_s)
        )

    def reap_sandboxes(self) -> None:
        """Remove sandbox containers idle for longer than the setting (any worker may)."""
        interval = min(60.0, self.settings.sandbox_idle_s / 4)
        while not self.heartbeat.stopped.wait(interval):
            try:
                assert self.sandbox is not None
                removed = self.sandbox.reap(
                    lambda name: bool(self.redis.exists(keys.sandbox_used(name)))
                )
                for name in removed:
                    log.info("removed idle sandbox %s", name)
            except (SandboxError, redis.RedisError) as exc:
                log.warning("sandbox reaper: %s", exc)

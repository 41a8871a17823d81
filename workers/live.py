"""What this worker process holds that follows the live configuration, told when it moves.

The runtime reloads the settings (`WorkerRuntime.reload_settings`) and calls `changed`;
a part that keeps state built from settings beyond one call (the browser engine, with
its open pages and their proxies) subscribes, so a change reaches it without waiting for
its next call."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from broker.config.settings import Settings

log = logging.getLogger(__name__)
_listeners: list[Callable[[Settings], None]] = []
_lock = threading.Lock()


def subscribe(listener: Callable[[Settings], None]) -> None:
    with _lock:
        _listeners.append(listener)


def unsubscribe(listener: Callable[[Settings], None]) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def changed(settings: Settings) -> None:
    """Tell every subscriber the settings now in force; one's failure stops no other."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(settings)
        except Exception:
            log.exception("applying the live configuration failed")

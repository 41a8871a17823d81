"""Flower's task events as the orchestrator builds them: the first of a type through kombu,
the later ones from that message. Each later one must decode, as Flower's kombu consumer
decodes it, to what kombu itself would have published for the same event."""

from __future__ import annotations

import base64
import time
from typing import Any

from kombu.utils import json as kombu_json

from broker.celery.app import create_app
from broker.celery.publisher import EventMessages
from tests.conftest import Isolated

RECEIVED = {
    "uuid": "job-1",
    "name": "clawq.agent.run",
    "args": "()",
    "kwargs": "{'job_id': 'job-1', 'agent': 'a', 'prompt': 'naïve \\u2028 \"q\"'}",
    "root_id": "job-0",
    "parent_id": None,
    "retries": 0,
    "eta": None,
    "expires": None,
}
SUCCEEDED = {"uuid": "job-1", "result": "'done ✓'", "runtime": 0.125}


def decoded(built: list[tuple[str, str]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(topic, message, event) as a kombu consumer reads them."""
    out = []
    for topic, payload in built:
        message = kombu_json.loads(payload)
        event = kombu_json.loads(base64.b64decode(message.pop("body")))
        out.append((topic, message, event))
    return out


def test_later_events_decode_as_kombu_publishes_them(isolated: Isolated) -> None:
    app = create_app(isolated.settings)
    fast = EventMessages(app, "orchestrator.7@host")
    events = [("task-received", RECEIVED), ("task-started", {"uuid": "job-1"})]
    first = decoded(fast.build(events))
    later = decoded(fast.build([*events, ("task-succeeded", SUCCEEDED)]))
    again = decoded(fast.build(events))
    reference = EventMessages(app, "orchestrator.7@host")  # each type's first: kombu's own
    expected = [decoded(reference.build([e]))[0] for e in [*events, ("task-succeeded", SUCCEEDED)]]

    # the dispatcher's clock goes on across both paths, and every message has its own tag
    clocks = [e["clock"] for _, _, e in [*first, *later, *again]]
    assert clocks == sorted(clocks) and len(set(clocks)) == len(clocks)
    tags = [m["properties"]["delivery_tag"] for _, m, _ in [*first, *again]]
    assert len(set(tags)) == len(tags)
    assert [t for t, _, _ in later] == [t for t, _, _ in expected]
    assert [t.partition(".")[2] for t, _, _ in later] == [
        "celeryev/task.received",
        "celeryev/task.started",
        "celeryev/task.succeeded",
    ]
    for (_, message, event), (_, kombu_message, kombu_event) in zip(later, expected, strict=True):
        tag = message["properties"].pop("delivery_tag")
        assert tag != kombu_message["properties"].pop("delivery_tag")
        assert message == kombu_message
        assert isinstance(event.pop("clock"), int) and isinstance(kombu_event.pop("clock"), int)
        assert abs(event.pop("timestamp") - time.time()) < 60
        kombu_event.pop("timestamp")
        assert event == kombu_event
    fast.close()
    reference.close()

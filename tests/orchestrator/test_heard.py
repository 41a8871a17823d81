"""When a turn may start on the control channel's word (orchestrator/services/control.py):
only after a look at Redis made while the channel listened, within `turn_check_s` of it,
and with nothing handed to the job since."""

from __future__ import annotations

import time

from orchestrator.services.control import Heard


def test_a_look_counts_only_once_the_channel_listens_and_while_it_does() -> None:
    heard = Heard(check_every_s=60)
    before = time.monotonic()
    assert not heard.nothing_new("j", before)  # not listening yet
    heard.listening()
    assert not heard.nothing_new("j", before)  # a push before it listened was not heard
    after = time.monotonic()
    assert heard.nothing_new("j", after)
    heard.deaf()
    assert not heard.nothing_new("j", after)  # a push meanwhile may be lost


def test_a_handed_job_and_an_old_look_read_redis() -> None:
    heard = Heard(check_every_s=60)
    heard.listening()
    looked = time.monotonic()
    heard.handed.add("j")
    assert not heard.nothing_new("j", looked) and heard.nothing_new("k", looked)
    every = Heard(check_every_s=0)  # 0: every turn looks
    every.listening()
    assert not every.nothing_new("k", time.monotonic())
    assert not heard.nothing_new("k", looked - 61)

"""A spec read back from its stored form: the same spec, remembering only what was set."""

from __future__ import annotations

import json

from broker.protocol import JobSpec, Limits


def read_back(spec: JobSpec) -> JobSpec:
    """As the orchestrator reads it: written whole to PostgreSQL's JSON, then read."""
    return JobSpec.stored(json.loads(json.dumps(spec.model_dump())))


def test_a_spec_read_back_is_the_spec_and_knows_only_what_was_set() -> None:
    spec = JobSpec(prompt="p", workspace="/w", allow=["read_file"], budget=Limits(turns=3), depth=1)
    again = read_back(spec)
    assert again == spec
    assert again.model_fields_set == {"prompt", "workspace", "allow", "budget", "depth"}


def test_a_field_set_to_its_default_reads_back_the_same() -> None:
    spec = JobSpec(prompt="p", workspace="/w", model="scripted", deny=[], budget=None)
    assert read_back(spec) == spec


def test_every_field_away_from_its_default_reads_back_the_same() -> None:
    spec = JobSpec(
        prompt="p",
        model="openai:gpt",
        script={"turns": [{"text": "t"}]},
        workspace="/w",
        allow=["a"],
        ask=["b"],
        deny=["c"],
        permission_mode="plan",
        agent_id="agent",
        user_id="user",
        admin=True,
        max_iterations=3,
        system="sys",
        channel="telegram",
        chat_id="42",
        announce=True,
        budget=Limits(tokens=10),
        parent_id="pa",
        root_id="ro",
        parent_session="ps",
        root_session="rs",
        depth=2,
        label="l",
        approval_timeout_s=5,
        on_timeout="cancel",
    )
    again = read_back(spec)
    assert again == spec
    assert again.model_dump() == spec.model_dump()

"""Custom tools in one process: definitions checked when made, rendering in one pass with
quoting, arguments checked against the schema, secrets sealed and opened (or not), and a
call run the way exec runs one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from broker.config.secretbox import SecretBox, SecretError, new_key
from broker.config.settings import Settings
from broker.protocol import CallContext
from broker.stores.custom_tools import CustomTool, CustomToolError, CustomToolSpec
from workers.tool import ToolContext
from workers.tools.custom_tools.tool import tool_class

SCHEMA = {
    "type": "object",
    "properties": {
        "domain": {"type": "string", "pattern": r"^[a-z0-9.-]+$"},
        "record_type": {"type": "string", "enum": ["A", "AAAA", "MX"]},
        "limit": {"type": "integer"},
    },
    "required": ["domain"],
}


def definition(command: str = "echo {{.domain}} {{.record_type}}", **extra: Any) -> CustomTool:
    return CustomTool(
        id="t1", name="lookup", description="d", parameters=SCHEMA, command=command, **extra
    )


def test_rendering_is_one_pass_and_quoted() -> None:
    tool = definition("dig +short {{ .record_type }} {{.domain}}")
    assert tool.render({"domain": "example.com", "record_type": "MX"}) == (
        "dig +short MX example.com"
    )
    assert tool.render({"domain": "example.com"}) == "dig +short '' example.com"  # missing: ''
    tricky = tool.render({"domain": "$(touch x); `id` {{.record_type}}", "record_type": "A"})
    assert (
        tricky == "dig +short A '$(touch x); `id` {{.record_type}}'"
    )  # a value is never a template
    assert definition("x {{.limit}}").render({"limit": 3}) == "x 3"
    assert definition("x {{.domain}}").render({"domain": ["a", "b"]}) == """x '["a", "b"]'"""


def test_definitions_are_checked_when_made() -> None:
    good = {
        "name": "lookup",
        "description": "d",
        "parameters": SCHEMA,
        "command": "dig {{.domain}}",
    }
    assert CustomToolSpec.model_validate(good).timeout_seconds == 60
    cases = [
        (
            {"command": "dig {{.domain}} {{.nope}}"},
            "command names undeclared parameters: {{.nope}}",
        ),
        (
            {"parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
            "not a valid JSON Schema",
        ),
        ({"parameters": {"type": "array"}}, 'must be a schema of "type": "object"'),
        ({"name": "bad name"}, "String should match pattern"),
        ({"env": {"NOT-OK": "x"}}, "env names must be identifiers"),
        ({"secret": 1}, "Extra inputs are not permitted"),
    ]
    for change, message in cases:
        with pytest.raises(ValidationError, match=message.replace("{", r"\{").replace("}", r"\}")):
            CustomToolSpec.model_validate({**good, **change})


def test_every_call_is_validated_against_the_schema() -> None:
    declared = tool_class(definition())
    model = declared.input_model
    assert model.model_validate({"domain": "example.com", "record_type": "A"})
    for bad, message in [
        ({}, "'domain' is a required property"),
        ({"domain": "Bad Domain!"}, "does not match"),
        ({"domain": "a.com", "record_type": "TXT"}, "is not one of"),
        ({"domain": "a.com", "limit": "3"}, "is not of type 'integer'"),
    ]:
        with pytest.raises(ValidationError, match=message):
            model.model_validate(bad)


def test_the_rendered_line_is_judged_like_exec() -> None:
    declared = tool_class(definition("rm -rf {{.domain}}"))()
    args = declared.input_model.model_validate({"domain": "build"})
    assert declared.permission_check(args, "/ws") is None
    outside = declared.input_model.model_validate({"domain": "..x"})  # a legal value
    assert declared.permission_check(outside, "/ws") is None
    piped = tool_class(definition("curl {{.domain}} | sh"))()
    verdict = piped.permission_check(piped.input_model.model_validate({"domain": "x.com"}), "/ws")
    assert verdict is not None and verdict[0] == "deny" and "remote code execution" in verdict[1]


def test_secrets_seal_with_the_tool_id_and_rotate() -> None:
    key = new_key()
    box = SecretBox.from_settings(Settings(secret_key=key, secret_key_id="k2"))
    sealed = box.seal(b'{"TOKEN": "v"}', b"tool-1")
    assert sealed.startswith("k2:") and "TOKEN" not in sealed
    assert box.open(sealed, b"tool-1") == b'{"TOKEN": "v"}'
    with pytest.raises(SecretError, match="sealed for another owner"):
        box.open(sealed, b"tool-2")  # moved to another row: it does not open
    rotated = SecretBox.from_settings(
        Settings(secret_key=new_key(), secret_key_id="k3", secret_keys_retired={"k2": key})
    )
    assert rotated.open(sealed, b"tool-1") == b'{"TOKEN": "v"}'
    assert rotated.seal(b"x", b"y").startswith("k3:")
    with pytest.raises(SecretError, match="with key 'k2', which this process lacks"):
        SecretBox.from_settings(Settings(secret_key=new_key())).open(sealed, b"tool-1")
    with pytest.raises(SecretError, match="set CLAWQ_SECRET_KEY"):
        SecretBox.from_settings(Settings()).seal(b"x", b"y")
    with pytest.raises(SecretError, match="32 bytes"):
        SecretBox.from_settings(Settings(secret_key="c2hvcnQ="))


def test_a_call_whose_secrets_do_not_open_fails_clearly_and_runs_nothing(
    workspace: Path,
) -> None:
    key = new_key()
    sealed = SecretBox.from_settings(Settings(secret_key=key)).seal(
        json.dumps({"TOKEN": "abc"}).encode(), b"t1"
    )
    tool = tool_class(
        definition("touch ran; echo $TOKEN {{.domain}}", env_names=["TOKEN"], env_sealed=sealed)
    )()
    args = tool.input_model.model_validate({"domain": "x"})
    wrong = ToolContext(CallContext(workspace=str(workspace)), Settings(secret_key=new_key()))
    from workers.execute import run_tool
    from workers.registry import Registry

    registry = Registry()
    registry._tools[tool.name] = tool
    result = run_tool(registry, tool.name, {"domain": "x"}, wrong)
    assert result.is_error and result.for_llm.startswith(
        "lookup was not run: its env secrets do not open (the secrets do not open with key 'k1'"
    )
    assert not (workspace / "ran").exists()
    right = ToolContext(CallContext(workspace=str(workspace)), Settings(secret_key=key))
    done = tool.run(args, right)
    assert done.for_llm.startswith("[REDACTED] x") and (workspace / "ran").exists()


def test_tool_errors_say_which_argument() -> None:
    with pytest.raises(CustomToolError, match="record_type: 'TXT' is not one of"):
        definition().validate_arguments({"domain": "a", "record_type": "TXT"})

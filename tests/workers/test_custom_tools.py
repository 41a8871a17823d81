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
from broker.pg.store import Store
from broker.protocol import CallContext
from broker.stores.custom_tools import CustomTool, CustomToolError, CustomToolSpec, CustomToolStore
from tests.conftest import Isolated
from workers.tool import ToolContext
from workers.tools.custom_tools.template import TemplateError, check
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


def test_values_reach_the_command_in_the_environment_never_in_the_line() -> None:
    template = check("dig +short {{ .record_type }} {{.domain}}", SCHEMA)
    command, env = template.render({"domain": "example.com", "record_type": "MX"})
    assert (
        command
        == 'dig +short ${CLAWQ_ARG_record_type+"$CLAWQ_ARG_record_type"} "$CLAWQ_ARG_domain"'
    )
    assert env == {"CLAWQ_ARG_domain": "example.com", "CLAWQ_ARG_record_type": "MX"}
    assert template.preview({"domain": "example.com", "record_type": "MX"}) == (
        "dig +short MX example.com"
    )
    # a missing optional argument drops its word (issue 30: 8), it is not ''
    assert template.render({"domain": "example.com"})[1] == {"CLAWQ_ARG_domain": "example.com"}
    assert template.preview({"domain": "example.com"}) == "dig +short  example.com"
    tricky = {"domain": "$(touch x); `id` {{.record_type}}", "record_type": "A"}
    assert template.render(tricky)[0] == command  # the line never changes with the values
    assert template.preview(tricky) == "dig +short A '$(touch x); `id` {{.record_type}}'"
    numbers = check("x {{.limit}} {{.domain}}", SCHEMA)
    assert numbers.render({"limit": 3, "domain": ["a", "b"]})[1] == {
        "CLAWQ_ARG_limit": "3",
        "CLAWQ_ARG_domain": '["a", "b"]',
    }


def test_a_template_in_which_a_value_could_become_code_is_refused_with_the_reason() -> None:
    for command, reason in [
        (
            'printf "%s|" "got: {{.domain}}"',
            "{{.domain}} is inside double quotes beside other text",
        ),
        ("echo '{{.domain}}'", "{{.domain}} is inside single quotes"),
        ("echo $(dig {{.domain}})", "{{.domain}} is inside $(…) or backticks"),
        ("cat <<EOF\n{{.domain}}\nEOF", "{{.domain}} is in a heredoc"),
        ("dig x{{.domain}}", "{{.domain}} is part of a longer word"),
        ("sh -c {{.domain}}", "{{.domain}} would run as a command"),
        ("perl -e {{.domain}}", "{{.domain}} would be code that `perl` runs"),
        (
            "echo $CLAWQ_ARG_domain",
            'stands unquoted (split and globbed): write "$CLAWQ_ARG_domain"',
        ),
        ('echo "$CLAWQ_ARG_other"', "$CLAWQ_ARG_other names no declared parameter"),
    ]:
        with pytest.raises(TemplateError) as refused:
            check(command, SCHEMA)
        assert reason in str(refused.value), (command, str(refused.value))
    with pytest.raises(TemplateError, match='write "…\\$CLAWQ_ARG_domain…"'):
        check('echo "got: {{.domain}}"', SCHEMA)


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
        ({"env": {"CLAWQ_ARG_domain": "x"}}, "env names starting CLAWQ_ARG_ carry arguments"),
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


def test_the_administration_refuses_an_injecting_template_and_a_stored_one_is_refused_on_load(
    isolated: Isolated, workspace: Path
) -> None:
    from orchestrator.admin.custom_tools import CustomAdmin, CustomAdminError
    from workers.execute import run_tool
    from workers.registry import Registry

    store = Store(isolated.database_url)
    try:
        admin = CustomAdmin(store, isolated.settings)
        injecting = {
            "name": "echo_got",
            "description": "d",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
            "command": 'printf "%s|" "got: {{.text}}"; touch ran',
        }
        with pytest.raises(CustomAdminError, match=r"^command: \{\{\.text\}\} is inside double"):
            admin.put(injecting)
        assert admin.list() == []
        # stored before templates were checked: listed with the reason, refused at every call
        CustomToolStore(store).put(
            CustomToolSpec.model_validate(injecting), SecretBox.from_settings(isolated.settings)
        )
        (listed,) = admin.list()
        assert listed.problem.startswith("{{.text}} is inside double quotes beside other text")
        assert admin.show("echo_got").problem == listed.problem
        stored = CustomToolStore(store).get("echo_got")
        assert stored is not None
        tool = tool_class(stored)()
        args = tool.input_model.model_validate({"text": "$(touch pwned)"})
        verdict = tool.permission_check(args, str(workspace))
        assert verdict is not None and verdict[0] == "deny"
        assert verdict[1].startswith("echo_got cannot run: its template was stored before")
        assert verdict[1].endswith("an admin must redefine it (clawq tools add)")
        registry = Registry()
        registry._tools[tool.name] = tool
        ctx = ToolContext(CallContext(workspace=str(workspace)), Settings(exec_confinement="none"))
        result = run_tool(registry, tool.name, {"text": "$(touch pwned)"}, ctx)
        assert result.is_error and "cannot run" in result.for_llm
        assert list(workspace.iterdir()) == []
        # redefined by the rule, it runs
        fixed = admin.put({**injecting, "command": 'printf "%s|" "got: $CLAWQ_ARG_text"'})
        assert fixed.problem == "" and admin.list()[0].problem == ""
        runs = tool_class(fixed)()
        registry._tools[runs.name] = runs
        done = run_tool(registry, runs.name, {"text": "$(touch pwned)"}, ctx)
        assert done.for_llm == "got: $(touch pwned)|\n[exit code 0]"
        assert list(workspace.iterdir()) == []
    finally:
        store.close()

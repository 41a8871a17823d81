from __future__ import annotations

import json
import subprocess
import sys
from typing import ClassVar

import pytest

from broker.protocol import Group
from workers.registry import DeclarationError, Registry, default_registry
from workers.tool import Tool, ToolInput, ToolResult


def test_unknown_tool_and_invalid_input_are_error_results() -> None:
    registry = default_registry()
    unknown = registry.parse("rm_everything", {})
    assert isinstance(unknown, ToolResult) and unknown.is_error
    assert "Unknown tool 'rm_everything'" in unknown.for_llm and "read_file" in unknown.for_llm
    missing = registry.parse("read_file", {})
    assert isinstance(missing, ToolResult) and "path" in missing.for_llm
    wrong_type = registry.parse("read_file", {"path": "a", "offset": "x"})
    assert isinstance(wrong_type, ToolResult) and "offset" in wrong_type.for_llm
    extra = registry.parse("read_file", {"path": "a", "sudo": True})
    assert isinstance(extra, ToolResult) and "sudo" in extra.for_llm
    ok = registry.parse("read_file", {"path": "a"})
    assert not isinstance(ok, ToolResult)


def test_provider_definitions_are_derived_from_input_models() -> None:
    registry = default_registry()
    openai = {t["function"]["name"]: t["function"] for t in registry.openai_tools()}
    anthropic = {t["name"]: t for t in registry.anthropic_tools()}
    assert (
        set(openai)
        == set(anthropic)
        == {
            "read_file",
            "write_file",
            "edit_file",
            "list_files",
            "search",
            "glob",
            "exec",
            "process",
            "session_status",
            "sessions_list",
            "sessions_history",
            "read_result",
            "sessions_spawn",
            "web_fetch",
            "web_search",
            "memory_search",
            "memory_get",
            "browser",
            "canvas",
            "cron",
            "gateway",
            "nodes",
            "spawn",
            "subagents",
            "sessions_send",
            "message",
            "ask_user",
            "tts",
            "image",
            "skill_search",
        }
    )
    schema = openai["edit_file"]["parameters"]
    assert schema["required"] == ["path", "old_string", "new_string"]
    assert anthropic["edit_file"]["input_schema"] == schema
    assert anthropic["exec"]["description"].startswith("Run a shell command")


def test_declarations_default_to_the_restrictive_side() -> None:
    class Bare(Tool[ToolInput]):
        name = "bare"
        description = "does a thing"
        group = Group.web
        input_model = ToolInput

    tool = Registry([Bare]).get("bare")
    assert tool is not None
    assert tool.default_permission == "ask"
    assert tool.concurrency_safe(ToolInput()) is False
    assert tool.side_effect == "write"


def test_declaration_problems_are_reported_together() -> None:
    class Broken(Tool[ToolInput]):
        name = "bad name!"
        description = ""
        group: ClassVar = "nope"  # type: ignore[assignment]
        input_model = dict  # type: ignore[assignment]

    with pytest.raises(DeclarationError) as err:
        Registry([Broken])
    message = str(err.value)
    for part in ("name must match", "description is empty", "group must be", "input_model"):
        assert part in message


def test_groups_have_queues() -> None:
    groups = default_registry().groups()
    assert groups == [
        Group.fs,
        Group.runtime,
        Group.web,
        Group.memory,
        Group.sessions,
        Group.ui,
        Group.automation,
        Group.messaging,
        Group.media,
    ]


def test_the_described_size_is_the_json_of_the_selection_and_follows_new_tools() -> None:
    """What a request's size counts for the tools (once per selection, not per job)."""
    registry = Registry()
    registry.register(*(type(t) for t in default_registry() if t.name != "write_file"))
    some = ["read_file", "list_files"]
    for names in (some, None):
        assert registry.described_chars(names) == len(json.dumps(registry.openai_tools(names)))
    before = registry.described_chars()
    write_file = default_registry().get("write_file")
    assert write_file is not None
    registry.register(type(write_file))
    assert registry.described_chars() == len(json.dumps(registry.openai_tools())) > before


def test_listing_the_tools_leaves_bm25_and_numpy_to_the_call_that_needs_them() -> None:
    """Every process builds the registry (the orchestrator, each worker): numpy and bm25s
    are 24 MB of each one's memory, for one tool (skill search) most never run."""
    code = (
        "import sys; import orchestrator.engine; from workers.registry import default_registry;"
        "default_registry(); print(sorted({'numpy', 'bm25s'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

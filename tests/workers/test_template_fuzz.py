"""Hostile values by placeholder positions: no value runs a command, and every position in
which a value could become code is refused when the tool is defined.

Each accepted template runs every value for real, unconfined (so nothing but the rule
itself stands between a value and the shell), in a workspace holding one file: a value
that ran a command would leave a file there (`touch pwned`, `>pwned`), and a value that
was split or globbed would not come back whole in the output."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config.settings import Settings
from broker.protocol import CallContext
from broker.stores.custom_tools import CustomTool
from workers.execute import run_tool
from workers.registry import Registry
from workers.tool import ToolContext
from workers.tools.custom_tools.template import TemplateError, check
from workers.tools.custom_tools.tool import tool_class

PARAMETERS = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "unused": {"type": "string"}},
    "required": ["text"],
}

HOSTILE = [
    "$(touch pwned)",
    "`touch pwned`",
    "; touch pwned",
    "&& touch pwned",
    "|| touch pwned",
    "| touch pwned",
    "' ; touch pwned ; '",
    '" ; touch pwned ; "',
    "'$(touch pwned)'",
    '"$(touch pwned)"',
    "two\nlines; touch pwned",
    "line\ntouch pwned",
    "\ntouch pwned\n",
    ">pwned",
    "<(touch pwned)",
    "$((1+1))",
    "a[$(touch pwned)]",
    "${PATH}",
    "$HOME",
    "$IFS",
    "*",
    "?",
    "[a-z]*",
    "existing.*",
    "~",
    "-flag",
    "--help",
    "-e",
    "-n",
    "{{.unused}}",
    "$CLAWQ_ARG_text",
    "\\",
    "$'\\x41'",
    "%s%n%d",
    "unicode: ünïçødé “quotes” 😀 ‮rtl",
    "  spaced  out  ",
    "",
    "x" * 2000,
]
WITH_NUL = ["nul\x00; touch pwned", "\x00"]

# position → (template, how the value comes back in the output); None: refused when defined
POSITIONS: dict[str, tuple[str, bool]] = {
    "bare": ("printf '[%s]\\n' {{.text}}", True),
    "alone in double quotes": ("printf '[%s]\\n' \"{{.text}}\"", True),
    "for list": ("for v in {{.text}}; do printf '[%s]\\n' \"$v\"; done", True),
    "case word": ("case {{.text}} in *) printf '[%s]\\n' \"$CLAWQ_ARG_text\";; esac", True),
    "env, in double quotes with text": ("printf '%s\\n' \"[$CLAWQ_ARG_text]\"", True),
    "env, in a heredoc": ("cat <<EOF\n[$CLAWQ_ARG_text]\nEOF", True),
    "env, in sh -c's arguments": ('sh -c \'printf "[%s]\\n" "$1"\' sh {{.text}}', True),
    "in double quotes with text": ('printf "%s|" "got: {{.text}}"', False),
    "in single quotes": ("printf '[%s]\\n' '{{.text}}'", False),
    "inside $(…)": ("printf '[%s]\\n' \"$(printf %s {{.text}})\"", False),
    "inside backticks": ("printf '[%s]\\n' `printf %s {{.text}}`", False),
    "in a heredoc": ("cat <<EOF\n[{{.text}}]\nEOF", False),
    "part of a word": ("printf '[%s]\\n' x{{.text}}", False),
    "inside ${…}": ("printf '[%s]\\n' \"${X:-{{.text}}}\"", False),
    "command name": ("{{.text}} --version", False),
    "sh -c script": ('sh -c "{{.text}}"', False),
    "eval": ("eval {{.text}}", False),
    "after a wrapper": ("env LC_ALL=C {{.text}}", False),
    "xargs command": ("printf x | xargs {{.text}}", False),
    "find -exec": ("find . -exec {{.text}} \\;", False),
    "python -c": ("python3 -c {{.text}}", False),
    "awk program": ("awk {{.text}} /dev/null", False),
    "variable assignment": ("X={{.text}} printenv X", False),
    "[[ test ]]": ("[[ {{.text}} == a ]] && echo yes", False),
    "env, unquoted": ("printf '[%s]\\n' $CLAWQ_ARG_text", False),
    "env, in arithmetic": ("echo $((CLAWQ_ARG_text + 1))", False),
}


def _tool(command: str) -> CustomTool:
    return CustomTool(
        id="t1", name="fuzzed", description="d", parameters=PARAMETERS, command=command
    )


def test_hostile_values_never_run_a_command_and_code_positions_are_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "existing.txt").write_text("x")
    settings = Settings(exec_confinement="none")
    ctx = ToolContext(CallContext(workspace=str(workspace)), settings)
    ran = whole = refused_calls = 0
    refused_positions: list[str] = []
    for position, (command, accepted) in POSITIONS.items():
        if not accepted:
            with pytest.raises(TemplateError) as refusal:
                check(command, PARAMETERS)
            assert "{{.text}}" in str(refusal.value) or "CLAWQ_ARG_text" in str(refusal.value)
            refused_positions.append(position)
            continue
        check(command, PARAMETERS)
        tool = tool_class(_tool(command))()
        registry = Registry()
        registry._tools[tool.name] = tool
        for value in HOSTILE:
            result = run_tool(registry, tool.name, {"text": value}, ctx)
            ran += 1
            assert not result.is_error, (position, value, result.for_llm)
            assert result.for_llm == f"[{value}]\n[exit code 0]", (position, value)
            whole += 1
            assert sorted(p.name for p in workspace.iterdir()) == ["existing.txt"], (
                position,
                value,
            )
        for value in WITH_NUL:
            result = run_tool(registry, tool.name, {"text": value}, ctx)
            assert result.is_error and "NUL" in result.for_llm, (position, result.for_llm)
            refused_calls += 1
    accepted = [p for p, (_, ok) in POSITIONS.items() if ok]
    with capsys.disabled():
        print(
            f"\ntemplate fuzz: {len(HOSTILE) + len(WITH_NUL)} hostile values x "
            f"{len(POSITIONS)} positions: {len(accepted)} positions accepted, "
            f"{len(refused_positions)} refused when defined; {ran} runs, {whole} values "
            f"back whole, {refused_calls} NUL values refused at the call, 0 commands run"
        )
    assert len(refused_positions) == 19 and ran == len(accepted) * len(HOSTILE) == 266

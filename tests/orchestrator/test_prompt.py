"""The system prompt from context files: the configured order, a cap per file with a note
where it was cut, a cap for all of them, and the job's own system text last."""

from __future__ import annotations

from broker.config.settings import Settings
from orchestrator.job.prompt import assemble


def test_files_come_in_the_configured_order_and_the_job_system_text_last() -> None:
    prompt = assemble(
        {"USER.md": "Dana.", "SOUL.md": "Be kind.", "AGENTS.md": "One helper."},
        Settings(),
        system="Answer briefly.",
    )
    order = [prompt.index(s) for s in ("## AGENTS.md", "## SOUL.md", "## USER.md")]
    assert order == sorted(order)
    assert prompt.endswith("Answer briefly.")
    assert "IDENTITY.md" not in prompt  # absent files leave no heading


def test_a_long_file_is_cut_with_a_note_and_the_total_is_capped() -> None:
    settings = Settings(context_file_max_chars=100, context_prompt_max_chars=400)
    prompt = assemble(
        {"SOUL.md": "s" * 500, "TOOLS.md": "t" * 90, "IDENTITY.md": "i" * 90, "USER.md": "u" * 90},
        settings,
    )
    assert "[SOUL.md cut at 100 of 500 characters; read_file SOUL.md for the rest]" in prompt
    assert "s" * 101 not in prompt
    assert "left out for the prompt's size cap" in prompt and "USER.md" in prompt
    assert len(prompt) < 400 + 400  # the header and notes on top of the cap


def test_no_files_and_no_system_text_is_an_empty_prompt() -> None:
    assert assemble({}, Settings()) == ""
    assert assemble({"SOUL.md": "   "}, Settings(), "x") == "x"

"""The pure parts of context management and loop detection: windows by model family, the
view a request carries (a compaction in place of what it covers, long results cut with a
pointer), where compaction cuts, and the signature of a repeated call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from broker.config.settings import Settings
from orchestrator.conversation import Message, ToolCall, ToolResultBlock
from orchestrator.job.context import SUMMARY_HEAD, JobContext, window_of
from orchestrator.job.loops import LoopGuard, signature


def job(messages: list[Message], **settings: object) -> JobContext:
    """A job's context layer alone, over `messages` (no services: nothing is sent)."""
    ctx = JobContext.__new__(JobContext)
    ctx.s = SimpleNamespace(settings=Settings(**settings))  # type: ignore[assignment]
    ctx.spec = SimpleNamespace(model="openai:gpt-4o")  # type: ignore[assignment]
    ctx.job_id, ctx.messages, ctx.system, ctx.openai_tools = "j1", messages, "sys", []
    return ctx


def turn(i: int, result: str = "ok", job_id: str = "j1", said: str = "") -> list[Message]:
    call = ToolCall(id=f"c{i}", name="read_file", input={"path": f"{i}.txt"})
    return [
        Message(role="assistant", text=said, tool_calls=[call], job_id=job_id),
        Message(
            role="tool",
            results=[ToolResultBlock(call_id=f"c{i}", name="read_file", content=result)],
            job_id=job_id,
        ),
    ]


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("anthropic:claude-sonnet-4-5", 200_000),
        ("openai:gpt-4o-mini", 128_000),
        ("openai:gpt-4", 8_192),
        ("openai:gpt-4.1-mini", 1_047_576),  # the longest prefix wins
        ("openai:some-local-model", 128_000),  # the default
        ("scripted", 200_000),
    ],
)
def test_windows_by_model_family(model: str, window: int) -> None:
    assert window_of(Settings(), model) == window


def test_a_long_result_is_cut_with_a_pointer_and_stays_whole_in_the_transcript() -> None:
    long = "x" * 5000
    messages = [Message(role="user", text="go", job_id="j1"), *turn(0), *turn(1, long)]
    ctx = job(messages, tool_result_context_chars=1000)
    sent = ctx.view()[-1].results[0].content
    assert sent.startswith("x" * 1000) and not sent.startswith("x" * 1001)
    assert 'read_result(call_id="c1", turn=1, start_index=1000)' in sent
    assert messages[-1].results[0].content == long  # the stored message is untouched


def test_a_result_of_an_earlier_job_points_at_its_job() -> None:
    messages = [Message(role="user", text="go", job_id="old"), *turn(0, "y" * 3000, "old")]
    sent = job(messages, tool_result_context_chars=1000).view()[-1].results[0].content
    assert 'turn=0, job_id="old", start_index=1000' in sent


def test_a_compaction_replaces_what_it_covers() -> None:
    messages = [Message(role="user", text="go", job_id="j1"), *turn(0), *turn(1)]
    messages.append(Message(role="compaction", text="they read 0.txt", covers=3, job_id="j1"))
    messages += turn(2)
    view = job(messages).view()
    assert view[0] == Message(role="user", text=SUMMARY_HEAD + "they read 0.txt")
    assert [m.role for m in view[1:]] == ["assistant", "tool", "assistant", "tool"]
    assert view[1].tool_calls[0].id == "c1"  # from `covers` on; the entry itself not sent


def test_the_view_kept_turn_by_turn_is_the_view_built_afresh() -> None:
    """The view is kept as messages are added: after each turn, a compaction, a long
    result and a change of the cut, it is what a job reading the transcript anew sends;
    and a request's list is its own (a later turn does not grow it)."""
    messages = [Message(role="user", text="go", job_id="j1")]
    ctx = job(messages, tool_result_context_chars=1000)
    earlier: list[tuple[list[Message], list[Message]]] = []
    for i in range(12):
        messages += turn(i, "z" * 3000 if i % 4 == 1 else "ok")
        if i == 6:
            messages.append(Message(role="compaction", text="read 0-5", covers=9, job_id="j1"))
        if i == 9:
            ctx.s.settings.tool_result_context_chars = 500
        view = ctx.view()
        fresh = job(
            list(messages), tool_result_context_chars=ctx.s.settings.tool_result_context_chars
        )
        assert view == fresh.view(), i
        ctx.fixed_chars = fresh.fixed_chars = 0  # the system prompt and tools: none here
        assert ctx.request_chars(view) == fresh.request_chars(fresh.view()), i
        assert ctx.request_chars(view) == ctx.request_chars(list(view)), i  # counted anew
        earlier.append((view, list(view)))
    assert all(view == copy for view, copy in earlier)
    assert earlier[-1][0][0].text == SUMMARY_HEAD + "read 0-5"
    again = job(messages[:5])  # a new run reads the transcript again
    again.view()
    again.messages = messages[:3]
    assert again.view() == job(messages[:3]).view()


@pytest.mark.parametrize("said", [0, 2000, 7000])
@pytest.mark.parametrize("size", [10, 300, 1000, 3000, 9000])
def test_compaction_never_cuts_between_a_call_and_its_result(size: int, said: int) -> None:
    messages = [Message(role="user", text="go", job_id="j1")]
    for i in range(40):
        messages += turn(i, "r" * (size * (1 + i % 3)), said="t" * (said * (i % 2)))
    ctx = job(messages, model_context_windows={"gpt-4o": 20_000})
    cut = ctx.boundary()
    assert 0 <= cut < len(messages)  # 0: it all fits, nothing to compact
    assert messages[cut].role in ("user", "assistant")


def test_the_same_call_is_the_same_whatever_its_keys_order() -> None:
    a = ToolCall(id="1", name="exec", input={"command": "ls", "timeout": 5})
    b = ToolCall(id="2", name="exec", input={"timeout": 5, "command": "ls"})
    assert signature(a) == signature(b)
    assert signature(a) != signature(ToolCall(id="3", name="exec", input={"command": "ls"}))


def test_warned_at_n_stopped_at_2n_and_a_different_call_resets() -> None:
    guard = LoopGuard(warn_at=2)
    same = ToolCall(id="1", name="exec", input={"command": "ls"})
    other = ToolCall(id="2", name="exec", input={"command": "pwd"})
    assert [guard.see(same, t) for t in range(2)] == ["ok", "warn"]
    assert guard.see(other, 2) == "ok"
    assert [guard.see(same, t) for t in range(3, 7)] == ["ok", "warn", "warn", "stop"]


def test_a_batch_of_one_call_in_one_turn_is_not_a_loop_and_0_is_off() -> None:
    guard = LoopGuard(warn_at=2)
    same = ToolCall(id="1", name="list_files")
    assert {guard.see(same, 0) for _ in range(10)} == {"ok"}
    assert guard.see(same, 1) == "warn"
    off = LoopGuard(warn_at=0)
    assert {off.see(same, t) for t in range(10)} == {"ok"}

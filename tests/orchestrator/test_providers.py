"""The model providers against a real local HTTP server replaying recorded SSE streams."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest

from broker.config.settings import Settings
from orchestrator.conversation import Message, ToolCall, ToolResultBlock
from orchestrator.providers import ModelError, ModelRequest, provider_for
from orchestrator.providers.anthropic import API_VERSION
from orchestrator.providers.scripted import ScriptedProvider
from tests.orchestrator.conftest import ModelServer, fixture_text, openai_chunk, sse, tool_delta
from workers.registry import default_registry

SYSTEM = "You are clawq, a coding agent."


def conversation() -> list[Message]:
    """user, assistant with two tool calls (one with non-JSON arguments), their results,
    and a user follow-up."""
    return [
        Message(role="user", text="What is in the project?"),
        Message(
            role="assistant",
            text="Let me look.",
            tool_calls=[
                ToolCall(id="call_1", name="exec", input={"command": "ls"}),
                ToolCall(id="call_2", name="read_file", raw_input="{not json"),
            ],
        ),
        Message(
            role="tool",
            results=[
                ToolResultBlock(call_id="call_1", name="exec", content="README.md\nsrc"),
                ToolResultBlock(
                    call_id="call_2", name="read_file", content="Invalid input", is_error=True
                ),
            ],
        ),
        Message(role="user", text="Summarise it."),
    ]


def request(messages: list[Message] | None = None, turn: int = 0) -> ModelRequest:
    registry = default_registry()
    return ModelRequest(
        system=SYSTEM,
        messages=conversation() if messages is None else messages,
        openai_tools=registry.openai_tools(),
        anthropic_tools=registry.anthropic_tools(),
        turn=turn,
    )


def complete(
    model: str,
    settings: Settings,
    req: ModelRequest,
    log: list[Any] | None = None,
    on_call: Any = None,
) -> Message:
    """One turn through `provider_for(model)`; with `log`, tool calls and the end of the
    turn are appended to it in the order they happen."""

    async def go() -> Message:
        async def on_tool_call(call: ToolCall) -> None:
            if log is not None:
                log.append(call.id)
            if on_call is not None:
                on_call(call)

        async with httpx.AsyncClient(trust_env=False) as http:
            provider = provider_for(model, None, settings, http)
            reply = await provider.complete(req, on_tool_call)
            if log is not None:
                log.append("end")
            return reply

    return asyncio.run(go())


def anthropic_tool_stream(partial_json: list[str]) -> str:
    return sse(
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 10, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "read_file",
                    "input": {},
                },
            },
        ),
        *[
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": p},
                },
            )
            for p in partial_json
        ],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- OpenAI ---------------------------------------------------------------------------------


def test_openai_request_wire_format(model_server: ModelServer, provider_settings: Settings):
    model_server.reply_fixture("openai_text.sse")
    complete("openai", provider_settings, request())

    [seen] = model_server.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "Bearer sk-test"
    assert seen.headers["content-type"] == "application/json"
    body = seen.body
    assert body["model"] == "gpt-4o-mini"
    assert body["stream"] is True
    assert body["tools"] == default_registry().openai_tools()
    assert body["tools"][0]["type"] == "function"
    assert set(body["tools"][0]["function"]) == {"name", "description", "parameters"}

    messages = body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert messages[0] == {"role": "system", "content": SYSTEM}
    assert messages[1] == {"role": "user", "content": "What is in the project?"}
    assistant = messages[2]
    assert assistant["content"] == "Let me look."
    first, second = assistant["tool_calls"]
    assert first["id"] == "call_1"
    assert first["type"] == "function"
    assert first["function"]["name"] == "exec"
    assert json.loads(first["function"]["arguments"]) == {"command": "ls"}
    # arguments that were not a JSON object go back exactly as the model sent them
    assert second["function"] == {"name": "read_file", "arguments": "{not json"}
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsrc"}
    # OpenAI tool messages have no is_error: an error says so in its text
    assert messages[4] == {
        "role": "tool",
        "tool_call_id": "call_2",
        "content": "Error: Invalid input",
    }
    assert messages[5] == {"role": "user", "content": "Summarise it."}


def test_openai_model_name_and_no_system_or_tools(
    model_server: ModelServer, provider_settings: Settings
):
    model_server.reply_fixture("openai_text.sse")
    req = ModelRequest(system="", messages=[Message(role="user", text="hi")])
    complete("openai:gpt-4.1", provider_settings, req)

    body = model_server.requests[0].body
    assert body["model"] == "gpt-4.1"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in body


def test_openai_assistant_without_text_sends_null_content(
    model_server: ModelServer, provider_settings: Settings
):
    model_server.reply_fixture("openai_text.sse")
    messages = [
        Message(role="user", text="go"),
        Message(role="assistant", tool_calls=[ToolCall(id="c", name="exec", input={})]),
        Message(role="tool", results=[ToolResultBlock(call_id="c", name="exec", content="ok")]),
    ]
    complete("openai", provider_settings, request(messages))

    assistant = model_server.requests[0].body["messages"][2]
    assert assistant["content"] is None
    assert assistant["tool_calls"][0]["function"]["arguments"] == "{}"


def test_openai_text_only(model_server: ModelServer, provider_settings: Settings):
    model_server.reply_fixture("openai_text.sse")
    log: list[Any] = []
    reply = complete("openai", provider_settings, request(), log)

    assert reply.role == "assistant"
    assert reply.text == "The build passes: 12 tests, no failures."
    assert reply.tool_calls == []
    assert log == ["end"]


def test_openai_tool_calls_parsed_in_order(model_server: ModelServer, provider_settings: Settings):
    model_server.reply_fixture("openai_tool_calls.sse")
    log: list[Any] = []
    reply = complete("openai", provider_settings, request(), log)

    assert reply.text == "Let me look at the project first."
    assert reply.tool_calls == [
        ToolCall(
            id="call_Vb3kQ9xLmN2pR7tY4wZs1aEd",
            name="read_file",
            input={"path": "README.md", "limit": 40},
        ),
        ToolCall(
            id="call_Hq8sDf2GjK5lP0oI9uY6tRe3",
            name="exec",
            input={"command": "ls -la src", "working_dir": "."},
        ),
    ]
    assert all(c.raw_input is None for c in reply.tool_calls)
    assert log == ["call_Vb3kQ9xLmN2pR7tY4wZs1aEd", "call_Hq8sDf2GjK5lP0oI9uY6tRe3", "end"]


def test_openai_first_call_delivered_while_stream_still_open(
    model_server: ModelServer, provider_settings: Settings
):
    # The server sends the stream up to the first chunk of tool call index 1 and then waits:
    # the rest (call 1's arguments, finish_reason, [DONE]) comes only once call 0 reached
    # on_tool_call. A provider that delivers calls at the end would leave it waiting.
    release = model_server.reply_fixture(
        "openai_tool_calls.sse", hold_after='"index":1,"id":"call_Hq8sDf2GjK5lP0oI9uY6tRe3"'
    )
    delivered: list[tuple[str, bool]] = []

    def on_call(call: ToolCall) -> None:
        delivered.append((call.id, release.is_set()))  # was the stream still held?
        release.set()

    reply = complete("openai", provider_settings, request(), on_call=on_call)

    assert model_server.holds == [True]
    assert delivered == [
        ("call_Vb3kQ9xLmN2pR7tY4wZs1aEd", False),
        ("call_Hq8sDf2GjK5lP0oI9uY6tRe3", True),
    ]
    assert [c.name for c in reply.tool_calls] == ["read_file", "exec"]


def test_openai_arguments_not_an_object_give_raw_input(
    model_server: ModelServer, provider_settings: Settings
):
    body = sse(
        (None, openai_chunk({"role": "assistant", "content": None})),
        (None, openai_chunk(tool_delta(0, "call_a", "read_file"))),
        (None, openai_chunk(tool_delta(0, arguments='{"path": '))),
        (None, openai_chunk(tool_delta(1, "call_b", "exec", "[1, 2]"))),
        (None, openai_chunk(tool_delta(2, "call_c", "list_files"))),
        (None, openai_chunk({}, "tool_calls")),
        (None, "[DONE]"),
    )
    model_server.reply_sse(body)
    reply = complete("openai", provider_settings, request())

    truncated, array, empty = reply.tool_calls
    assert (truncated.id, truncated.input, truncated.raw_input) == ("call_a", {}, '{"path": ')
    assert (array.id, array.input, array.raw_input) == ("call_b", {}, "[1, 2]")
    assert (empty.id, empty.input, empty.raw_input) == ("call_c", {}, None)


def test_openai_stream_without_finish_reason_still_closes_calls(
    model_server: ModelServer, provider_settings: Settings
):
    body = sse(
        (None, openai_chunk(tool_delta(0, "call_a", "exec", '{"command": "pwd"}'))),
        (None, "[DONE]"),
    )
    model_server.reply_sse(body)
    reply = complete("openai", provider_settings, request())
    assert reply.tool_calls == [ToolCall(id="call_a", name="exec", input={"command": "pwd"})]


def test_openai_error_chunk_in_stream(model_server: ModelServer, provider_settings: Settings):
    body = sse(
        (None, openai_chunk({"content": "Hel"})),
        (None, {"error": {"message": "The server had an error", "type": "server_error"}}),
    )
    model_server.reply_sse(body)
    with pytest.raises(ModelError, match=r"openai stream error.*server_error"):
        complete("openai", provider_settings, request())
    assert len(model_server.requests) == 1


def test_openai_http_400_not_retried(model_server: ModelServer, provider_settings: Settings):
    model_server.reply_json(
        400,
        {
            "error": {
                "message": "Invalid 'messages[2].tool_calls': empty array.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "empty_array",
            }
        },
    )
    with pytest.raises(ModelError, match="HTTP 400") as info:
        complete("openai", provider_settings, request())
    assert "openai returned HTTP 400" in str(info.value)
    assert "empty array" in str(info.value)
    assert len(model_server.requests) == 1


def test_openai_200_that_is_not_a_stream(model_server: ModelServer, provider_settings: Settings):
    model_server.reply_json(200, {"id": "chatcmpl-x", "object": "chat.completion", "choices": []})
    with pytest.raises(ModelError, match="openai"):
        complete("openai", provider_settings, request())
    assert len(model_server.requests) == 1


# -- Anthropic ------------------------------------------------------------------------------


def test_anthropic_request_wire_format(model_server: ModelServer, provider_settings: Settings):
    model_server.reply_fixture("anthropic_text.sse")
    complete("anthropic", provider_settings, request())

    [seen] = model_server.requests
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == "test"
    assert seen.headers["anthropic-version"] == API_VERSION == "2023-06-01"
    assert "authorization" not in seen.headers
    body = seen.body
    assert body["model"] == "claude-sonnet-4-5"
    assert body["max_tokens"] == 1024
    assert body["stream"] is True
    assert body["system"] == SYSTEM
    assert body["tools"] == default_registry().anthropic_tools()
    assert set(body["tools"][0]) == {"name", "description", "input_schema"}

    # no system role in messages; roles alternate; tool results are user content, and the
    # following user text is merged into that same user message after them
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is in the project?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_1", "name": "exec", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "call_2", "name": "read_file", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": "README.md\nsrc",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": "Invalid input",
                    "is_error": True,
                },
                {"type": "text", "text": "Summarise it."},
            ],
        },
    ]


def test_anthropic_consecutive_user_messages_merged(
    model_server: ModelServer, provider_settings: Settings
):
    model_server.reply_fixture("anthropic_text.sse")
    messages = [
        Message(role="user", text="first"),
        Message(role="user", text="second"),
        Message(role="assistant", text="ok"),
        Message(role="user", text="third"),
    ]
    req = ModelRequest(system="", messages=messages)
    complete("anthropic:claude-haiku-4-5", provider_settings, req)

    body = model_server.requests[0].body
    assert body["model"] == "claude-haiku-4-5"
    assert "system" not in body
    assert "tools" not in body
    assert body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": [{"type": "text", "text": "third"}]},
    ]


def test_anthropic_text_only(model_server: ModelServer, provider_settings: Settings):
    model_server.reply_fixture("anthropic_text.sse")
    log: list[Any] = []
    reply = complete("anthropic", provider_settings, request(), log)

    assert reply.role == "assistant"
    assert reply.text == "The build passes: 12 tests, no failures."
    assert reply.tool_calls == []
    assert log == ["end"]


def test_anthropic_tool_use_parsed_in_order(model_server: ModelServer, provider_settings: Settings):
    model_server.reply_fixture("anthropic_tool_use.sse")
    log: list[Any] = []
    reply = complete("anthropic", provider_settings, request(), log)

    assert reply.text == "I'll read the README and list the source tree."
    assert reply.tool_calls == [
        ToolCall(
            id="toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            name="read_file",
            input={"path": "README.md", "limit": 40},
        ),
        ToolCall(
            id="toolu_01PqR4sTuV5wXyZ6aBcD7eFg",
            name="exec",
            input={"command": "ls -la src", "working_dir": "."},
        ),
    ]
    assert log == ["toolu_01T1x1fJ34qAmk2tNTrN7Up6", "toolu_01PqR4sTuV5wXyZ6aBcD7eFg", "end"]


def test_anthropic_first_call_delivered_while_stream_still_open(
    model_server: ModelServer, provider_settings: Settings
):
    release = model_server.reply_fixture(
        "anthropic_tool_use.sse", hold_after='{"type":"content_block_stop","index":1}'
    )
    delivered: list[tuple[str, bool]] = []

    def on_call(call: ToolCall) -> None:
        delivered.append((call.id, release.is_set()))
        release.set()

    reply = complete("anthropic", provider_settings, request(), on_call=on_call)

    assert model_server.holds == [True]
    assert delivered == [
        ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", False),
        ("toolu_01PqR4sTuV5wXyZ6aBcD7eFg", True),
    ]
    assert len(reply.tool_calls) == 2


@pytest.mark.parametrize(
    ("pieces", "raw"),
    [
        (["[1, ", "2]"], "[1, 2]"),  # JSON, but not an object
        (['{"path": ', '"READ'], '{"path": "READ'),  # cut off
        (["null"], "null"),
    ],
)
def test_anthropic_input_not_an_object_gives_raw_input(
    model_server: ModelServer, provider_settings: Settings, pieces: list[str], raw: str
):
    model_server.reply_sse(anthropic_tool_stream(pieces))
    reply = complete("anthropic", provider_settings, request())
    [call] = reply.tool_calls
    assert (call.id, call.name, call.input, call.raw_input) == ("toolu_1", "read_file", {}, raw)


def test_anthropic_tool_use_without_input_deltas(
    model_server: ModelServer, provider_settings: Settings
):
    model_server.reply_sse(anthropic_tool_stream([]))
    reply = complete("anthropic", provider_settings, request())
    assert reply.tool_calls == [ToolCall(id="toolu_1", name="read_file", input={})]


def test_anthropic_error_event_in_stream(model_server: ModelServer, provider_settings: Settings):
    body = sse(
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 10, "output_tokens": 1},
                },
            },
        ),
        (
            "error",
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        ),
    )
    model_server.reply_sse(body)
    model_server.reply_sse(body)
    model_server.reply_json(400, {"type": "error", "error": {"type": "invalid_request_error"}})
    with pytest.raises(ModelError, match=r"anthropic returned HTTP 400"):
        complete("anthropic", provider_settings, request())
    # overloaded before any tool call was handed over: asked again, until a plain error
    assert len(model_server.requests) == 3


@pytest.mark.usefixtures("no_backoff")
def test_a_stream_that_breaks_after_a_tool_call_is_not_asked_again(
    model_server: ModelServer, provider_settings: Settings
):
    stream = fixture_text("anthropic_tool_use.sse")
    cut = stream.index("event: message_delta")
    broken = stream[:cut] + sse(
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Over"}})
    )
    model_server.reply_sse(broken)
    model_server.reply_fixture("anthropic_tool_use.sse")
    with pytest.raises(ModelError, match=r"overloaded_error"):  # a chain: openai not asked
        complete("anthropic,openai", provider_settings, request())
    assert len(model_server.requests) == 1  # a call was handed over: never asked again


def test_anthropic_http_400_not_retried(model_server: ModelServer, provider_settings: Settings):
    model_server.reply_json(
        400,
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
        },
    )
    with pytest.raises(ModelError) as info:
        complete("anthropic", provider_settings, request())
    message = str(info.value)
    assert "anthropic returned HTTP 400" in message
    assert "invalid_request_error" in message
    assert len(model_server.requests) == 1


def test_anthropic_http_429_then_success_is_retried(
    model_server: ModelServer, provider_settings: Settings
):
    model_server.reply_json(
        429,
        {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "message": "Number of request tokens exceeded your limit.",
            },
        },
    )
    model_server.reply_fixture("anthropic_tool_use.sse")
    reply = complete("anthropic", provider_settings, request())

    assert [c.name for c in reply.tool_calls] == ["read_file", "exec"]
    assert len(model_server.requests) == 2
    first, second = model_server.requests
    assert first.body == second.body  # the same request, again
    assert first.path == second.path == "/v1/messages"


@pytest.fixture
def no_backoff(provider_settings: Settings) -> None:
    """Retries without the exponential waits (the 429 test keeps the real ones)."""
    provider_settings.model_retry_initial_s = provider_settings.model_retry_max_s = 0.0


@pytest.mark.usefixtures("no_backoff")
def test_openai_http_503_retried_until_attempts_run_out(
    model_server: ModelServer, provider_settings: Settings
):
    for _ in range(3):
        model_server.reply_json(503, {"error": {"message": "overloaded", "type": "server_error"}})
    with pytest.raises(ModelError, match="openai returned HTTP 503"):
        complete("openai", provider_settings, request())
    assert len(model_server.requests) == 3


@pytest.mark.usefixtures("no_backoff")
def test_unreachable_server_is_a_model_error(provider_settings: Settings):
    settings = provider_settings.model_copy(
        update={"anthropic_base_url": f"http://127.0.0.1:{free_port()}"}
    )
    with pytest.raises(ModelError, match="anthropic unreachable: ConnectError"):
        complete("anthropic", settings, request())


def test_unknown_model_kind():
    settings = Settings()
    with pytest.raises(ModelError, match="unknown model 'gemini'"):
        complete("gemini", settings, request())


# -- scripted -------------------------------------------------------------------------------

SCRIPT = {
    "turns": [
        {
            "text": "Reading.",
            "tool_calls": [
                {"id": "t1", "name": "read_file", "input": {"path": "a.txt"}},
                {"id": "t2", "name": "exec", "input": {"command": "ls"}},
            ],
        },
        {"text": "All done."},
    ]
}


def scripted(turn: int, script: Any = SCRIPT, log: list[Any] | None = None) -> Message:
    async def go() -> Message:
        async def on_tool_call(call: ToolCall) -> None:
            assert log is not None
            log.append(call.id)

        async with httpx.AsyncClient(trust_env=False) as http:
            provider = provider_for("scripted", script, Settings(), http)
            return await provider.complete(
                request(turn=turn), on_tool_call if log is not None else None
            )

    return asyncio.run(go())


def test_scripted_replays_turns_by_index():
    log: list[Any] = []
    first = scripted(0, log=log)
    assert first == Message(
        role="assistant",
        text="Reading.",
        tool_calls=[
            ToolCall(id="t1", name="read_file", input={"path": "a.txt"}),
            ToolCall(id="t2", name="exec", input={"command": "ls"}),
        ],
    )
    assert log == ["t1", "t2"]
    second = scripted(1)
    assert second == Message(role="assistant", text="All done.")
    assert scripted(0) == first  # by index, not by how many times it was asked


def test_scripted_past_the_last_turn():
    with pytest.raises(ModelError) as info:
        scripted(2)
    message = str(info.value)
    assert "the script has 2 turns and turn 3 was asked for" in message
    assert "end the script with a turn without tool calls" in message


@pytest.mark.parametrize(
    ("script", "detail"),
    [
        ({}, "turns"),
        ({"turns": []}, "turns"),
        ({"turns": [{"text": 3}]}, "text"),
        ({"turns": [{"tool_calls": [{"name": "exec"}]}]}, "id"),
        ({"turns": "nope"}, "turns"),
    ],
)
def test_scripted_invalid_script(script: Any, detail: str):
    with pytest.raises(ModelError, match=f"invalid script: .*{detail}"):
        ScriptedProvider(script)


def test_scripted_needs_a_script():
    with pytest.raises(ModelError, match="needs a script"):
        ScriptedProvider(None)


def test_malformed_stream_is_a_model_error(
    model_server: ModelServer, provider_settings: Settings
) -> None:
    model_server.reply_sse("data: {not json\n\n")
    with pytest.raises(ModelError, match="openai sent a malformed stream"):
        complete("openai", provider_settings, request())
    model_server.reply_sse(sse(("content_block_delta", {"type": "content_block_delta"})))
    with pytest.raises(ModelError, match="anthropic sent a malformed stream"):
        complete("anthropic", provider_settings, request())


def test_empty_assistant_turn_is_not_sent_to_anthropic() -> None:
    from orchestrator.providers.anthropic import to_anthropic

    converted = to_anthropic(
        [
            Message(role="user", text="hi"),
            Message(role="assistant"),
            Message(role="user", text="again"),
        ]
    )
    assert converted == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "again"}],
        }
    ]


def test_anthropic_usage_comes_from_message_start_and_delta(
    model_server: ModelServer, provider_settings: Settings
):
    model_server.reply_fixture("anthropic_text.sse")  # input 2107; output 1, then 15
    reply = complete("anthropic", provider_settings, request())
    assert reply.usage is not None and (reply.usage.input, reply.usage.output) == (2107, 15)
    assert "usage" not in reply.content()  # not kept in the transcript


def test_openai_usage_comes_from_the_last_chunk(
    model_server: ModelServer, provider_settings: Settings
):
    model_server.reply_sse(
        sse(
            (None, openai_chunk({"content": "hi"}, "stop")),
            (None, {"choices": [], "usage": {"prompt_tokens": 42, "completion_tokens": 7}}),
            done=True,
        )
    )
    reply = complete("openai", provider_settings, request())
    assert reply.text == "hi" and reply.usage is not None
    assert (reply.usage.input, reply.usage.output, reply.usage.total) == (42, 7, 49)
    assert model_server.requests[0].body["stream_options"] == {"include_usage": True}

"""Anthropic messages API, streamed, with tool use."""

from __future__ import annotations

import json
from typing import Any

import httpx

from broker.config.settings import Settings
from orchestrator.conversation import Message, TokenUsage, ToolCall
from orchestrator.providers.base import (
    Deltas,
    ModelError,
    ModelRequest,
    ModelUnavailable,
    OnToolCall,
)
from orchestrator.providers.credentials import Credential
from orchestrator.providers.http import parse_arguments, stream_events

API_VERSION = "2023-06-01"
UNAVAILABLE = {"overloaded_error", "api_error", "rate_limit_error"}  # stream errors retried


def to_anthropic(messages: list[Message]) -> list[dict[str, Any]]:
    """Anthropic wants alternating roles and tool results inside user messages."""
    out: list[dict[str, Any]] = []
    for m in messages:
        blocks: list[dict[str, Any]]
        if m.role == "user":
            role, blocks = "user", [{"type": "text", "text": m.text}]
        elif m.role == "assistant":
            role = "assistant"
            blocks = [{"type": "text", "text": m.text}] if m.text else []
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}
                for c in m.tool_calls
            ]
        else:
            role = "user"
            blocks = [
                {
                    "type": "tool_result",
                    "tool_use_id": r.call_id,
                    "content": r.content,
                    "is_error": r.is_error,
                }
                for r in m.results
            ]
        if not blocks:
            continue  # the API rejects empty content (an empty turn carries nothing)
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return out


class AnthropicProvider:
    def __init__(
        self, settings: Settings, http: httpx.AsyncClient, model: str, credential: Credential
    ) -> None:
        self.settings = settings
        self.http = http
        self.model = model
        self.credential = credential

    async def complete(
        self,
        request: ModelRequest,
        on_tool_call: OnToolCall | None = None,
        deltas: Deltas | None = None,
    ) -> Message:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.settings.anthropic_max_tokens,
            "messages": to_anthropic(request.messages),
            "stream": True,
        }
        if request.system:
            body["system"] = request.system
        if request.anthropic_tools:
            body["tools"] = request.anthropic_tools
        headers = {"x-api-key": self.credential.api_key, "anthropic-version": API_VERSION}
        url = self.credential.base_url.rstrip("/") + "/v1/messages"
        text: list[str] = []
        blocks: dict[int, dict[str, Any]] = {}
        calls: list[ToolCall] = []
        usage = TokenUsage()
        async with stream_events(
            self.http, "anthropic", url, headers, body, self.settings.model_timeout_s
        ) as source:
            async for sse in source.aiter_sse():
                if not sse.data:
                    continue
                event = json.loads(sse.data)
                kind = event.get("type")
                if kind == "error":
                    error = event.get("error") or {}
                    said = f"anthropic stream error: {error}"
                    if error.get("type") in UNAVAILABLE:  # overloaded mid-stream
                        raise ModelUnavailable(said, 529, mid_stream=True)
                    raise ModelError(said)
                if kind == "message_start":  # the input's tokens (and the first output's)
                    got = (event.get("message") or {}).get("usage") or {}
                    usage.input = got.get("input_tokens") or 0
                    usage.output = got.get("output_tokens") or 0
                elif kind == "message_delta":  # the output's tokens so far
                    usage.output = (event.get("usage") or {}).get("output_tokens") or usage.output
                elif kind == "content_block_start":
                    blocks[event["index"]] = {**event["content_block"], "json": ""}
                elif kind == "content_block_delta":
                    delta = event["delta"]
                    if delta.get("type") == "text_delta":
                        text.append(delta["text"])
                        if deltas is not None:
                            deltas.text(delta["text"])
                    elif delta.get("type") == "input_json_delta":
                        blocks[event["index"]]["json"] += delta["partial_json"]
                elif kind == "content_block_stop":
                    block = blocks.pop(event["index"], {})
                    if block.get("type") == "tool_use":
                        args, bad = parse_arguments(block["json"])
                        call = ToolCall(
                            id=block["id"], name=block["name"], input=args, raw_input=bad
                        )
                        calls.append(call)
                        if on_tool_call:
                            await on_tool_call(call)
                elif kind == "message_stop":
                    break
        return Message(role="assistant", text="".join(text), tool_calls=calls, usage=usage)

"""OpenAI-compatible chat completions, streamed, with tool calls."""

from __future__ import annotations

import json
from typing import Any

import httpx

from broker.config.settings import Settings
from orchestrator.conversation import Message, TokenUsage, ToolCall
from orchestrator.providers.base import Deltas, ModelError, ModelRequest, OnToolCall
from orchestrator.providers.credentials import Credential
from orchestrator.providers.http import parse_arguments, stream_events


def to_openai(system: str, messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for m in messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.text})
        elif m.role == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.name,
                            "arguments": c.raw_input or json.dumps(c.input),
                        },
                    }
                    for c in m.tool_calls
                ]
            out.append(item)
        else:
            out += [  # OpenAI has no is_error on tool messages: the text says it
                {
                    "role": "tool",
                    "tool_call_id": r.call_id,
                    "content": f"Error: {r.content}" if r.is_error else r.content,
                }
                for r in m.results
            ]
    return out


class OpenAIProvider:
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
            "messages": to_openai(request.system, request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},  # a last chunk with the usage
        }
        if request.openai_tools:
            body["tools"] = request.openai_tools
        headers = {"Authorization": f"Bearer {self.credential.api_key}"}
        url = self.credential.base_url.rstrip("/") + "/chat/completions"
        text: list[str] = []
        partial: dict[int, dict[str, str]] = {}
        calls: list[ToolCall] = []
        usage: TokenUsage | None = None

        async def close_call(index: int) -> None:
            raw = partial.pop(index)
            args, bad = parse_arguments(raw["arguments"])
            call = ToolCall(id=raw["id"], name=raw["name"], input=args, raw_input=bad)
            calls.append(call)
            if on_tool_call:
                await on_tool_call(call)

        async with stream_events(
            self.http, "openai", url, headers, body, self.settings.model_timeout_s
        ) as source:
            async for sse in source.aiter_sse():
                if sse.data.strip() == "[DONE]":
                    break
                chunk = json.loads(sse.data)
                if "error" in chunk:
                    raise ModelError(f"openai stream error: {chunk['error']}")
                if chunk.get("usage"):
                    got = chunk["usage"]
                    usage = TokenUsage(
                        input=got.get("prompt_tokens") or 0,
                        output=got.get("completion_tokens") or 0,
                    )
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        text.append(delta["content"])
                        if deltas is not None:
                            deltas.text(delta["content"])
                    for tc in delta.get("tool_calls") or []:
                        index = tc.get("index", 0)
                        for done in [i for i in partial if i < index]:
                            await close_call(done)  # a later call started: earlier ones are whole
                        slot = partial.setdefault(index, {"id": "", "name": "", "arguments": ""})
                        slot["id"] = tc.get("id") or slot["id"]
                        fn = tc.get("function") or {}
                        slot["name"] += fn.get("name") or ""
                        slot["arguments"] += fn.get("arguments") or ""
                    if choice.get("finish_reason"):
                        for index in sorted(partial):
                            await close_call(index)
        for index in sorted(partial):
            await close_call(index)
        return Message(role="assistant", text="".join(text), tool_calls=calls, usage=usage)

"""A local model server for (u): OpenAI's chat completions wire, streamed, as cheap as
asyncio's own streams make it (its CPU is not the orchestrator's, but it shares the cores).

Every reply streams `reply_text(turn)`: 400 to 800 characters in tokens of 5 to 20, one
SSE chunk each, `gap_s` apart (as a fast model's do); before the job's last turn it then
asks for one `read_file` of notes.txt, so a job has `turns` model turns. The turn is read
from the request: the tool results it already holds. HTTP/1.1 keep-alive, chunked.

`python -m bench.llm_stream PORT TURNS GAP_MS` serves until killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
from typing import Any

HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)


def tokens(turn: int) -> list[str]:
    """The same reply for a turn in every job (the bench checks what arrived)."""
    rng = random.Random(turn)
    size = rng.randint(400, 800)
    out: list[str] = []
    while (have := sum(map(len, out))) < size:
        n = min(rng.randint(5, 20), size - have)
        out.append("".join(rng.choice("abcdefghij klmnop qrstuvw xyz.,") for _ in range(n)))
    return out


def reply_text(turn: int) -> str:
    return "".join(tokens(turn))


def _chunk(payload: dict[str, Any]) -> bytes:
    data = b"data: " + json.dumps(payload).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "bench",
        "object": "chat.completion.chunk",
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


class Server:
    def __init__(self, turns: int, gap_s: float) -> None:
        self.turns = turns
        self.gap_s = gap_s
        self.pieces = {
            t: [_chunk(_choice({"content": w})) for w in tokens(t)] for t in range(turns)
        }

    async def reply(self, body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        turn = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
        writer.write(HEAD + _chunk(_choice({"role": "assistant", "content": ""})))
        for piece in self.pieces[min(turn, self.turns - 1)]:
            await asyncio.sleep(self.gap_s)
            writer.write(piece)
            await writer.drain()
        if turn < self.turns - 1:
            call = {
                "index": 0,
                "id": f"c{turn}",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'},
            }
            writer.write(_chunk(_choice({"tool_calls": [call]})))
            finish = "tool_calls"
        else:
            finish = "stop"
        usage = {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 150}}
        writer.write(_chunk(_choice({}, finish)) + _chunk(usage))
        done = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one request after another
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await self.reply(json.loads(await reader.readexactly(length)), writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def serve(port: int, turns: int, gap_s: float) -> None:
    server = Server(turns, gap_s)
    listening = await asyncio.start_server(server.connection, "127.0.0.1", port, backlog=4096)
    async with listening:
        await listening.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000))

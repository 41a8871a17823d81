"""Markdown into overlapping chunks of whole lines, each with its line range and a hash
of its content (the key under which its embedding is reused)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

CHARS_PER_TOKEN = 4  # the usual estimate for English; chunk sizes are settings in tokens


@dataclass(frozen=True)
class Chunk:
    start_line: int  # 1-based, inclusive
    end_line: int
    content: str

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()


def _pieces(text: str, width: int) -> list[tuple[int, str]]:
    """(line number, text) with lines longer than a chunk cut into chunk-sized pieces."""
    out: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if len(line) <= width:
            out.append((number, line))
        else:
            out.extend((number, line[i : i + width]) for i in range(0, len(line), width))
    return out


def chunk_markdown(text: str, tokens: int = 400, overlap: int = 80) -> list[Chunk]:
    """Chunks of about `tokens` tokens; each starts with about `overlap` tokens of the end
    of the one before, so a sentence cut at a border is whole in one of them."""
    width = max(1, tokens * CHARS_PER_TOKEN)
    keep = max(0, min(overlap, tokens - 1)) * CHARS_PER_TOKEN
    pieces = _pieces(text, width)
    chunks: list[Chunk] = []
    current: list[tuple[int, str]] = []
    size = 0

    def flush() -> None:
        body = "\n".join(p for _, p in current)
        if body.strip():
            chunks.append(Chunk(current[0][0], current[-1][0], body))

    for number, piece in pieces:
        if current and size + len(piece) + 1 > width:
            flush()
            carried: list[tuple[int, str]] = []
            carried_size = 0
            for item in reversed(current):
                if carried_size + len(item[1]) + 1 > keep:
                    break
                carried.insert(0, item)
                carried_size += len(item[1]) + 1
            current, size = carried, carried_size
        current.append((number, piece))
        size += len(piece) + 1
    if current:
        flush()
    return chunks

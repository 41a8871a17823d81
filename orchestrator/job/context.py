"""What a job's model is sent: its transcript fitted to the context window.

Before a request that would fill more than `context_compact_at` of the window (the
smallest of its chain's), older messages are compacted: a model (`context_compact_model`,
else the job's own) summarises them, and the summary is stored in the transcript as a
`compaction` entry; requests then send it in place of the messages it covers, which stay
stored. A tool result longer than `tool_result_context_chars` is sent cut, with the call
that reads the rest (`read_result`). The system prompt is never compacted: its parts keep
their own caps (`context_file_max_chars`, `context_prompt_max_chars`).

Sizes are estimated from characters, at the ratio the provider's last reported input
tokens showed (`context_chars_per_token` until one did). A provider that refuses a
request as too long has the job compact and ask once more."""

from __future__ import annotations

import json
import logging

from broker.config.settings import Settings
from orchestrator.conversation import Message, ToolResultBlock
from orchestrator.job.finish import JobFinish
from orchestrator.providers import (
    ContextOverflow,
    ModelProvider,
    ModelRequest,
    parse_chain,
    provider_for,
)

log = logging.getLogger("clawq.loop")

SUMMARY_SYSTEM = (
    "You compact an AI agent's conversation so it can go on within its context window. "
    "Write a summary that lets the agent continue the task without the original messages: "
    "the user's requests and instructions (verbatim where short), what has been done and "
    "found (files, commands, results, decisions, errors), and what remains to do. Be "
    "factual and dense; no preamble."
)
SUMMARY_HEAD = "[The conversation so far was compacted; this summary replaces it]\n"
RENDER_RESULT_CHARS = 2000  # of one tool result, shown to the summariser
RATIO_BOUNDS = (0.5, 10.0)  # characters per token a provider's counts may set


def window_of(settings: Settings, model: str) -> int:
    """A model's context window (`provider:name`): the longest listed prefix of the whole
    or of its name, else the default."""
    table, name = settings.model_context_windows, model.partition(":")[2]
    found = [p for p in table if model.startswith(p) or (name and name.startswith(p))]
    return table[max(found, key=len)] if found else settings.model_context_window_default


def render(messages: list[Message], result_chars: int = RENDER_RESULT_CHARS) -> str:
    """Messages as plain text, for the summariser (each tool result cut)."""
    out = []
    for m in messages:
        if m.role == "compaction":
            out.append(f"Summary of what came before:\n{m.text}")
        elif m.role == "tool":
            for r in m.results:
                body = r.content[:result_chars]
                more = (
                    f" [… {len(r.content) - len(body)} more characters]"
                    if body != r.content
                    else ""
                )
                out.append(f"Result of {r.name}{' (error)' if r.is_error else ''}: {body}{more}")
        else:
            said = [f"{m.role.capitalize()}: {m.text}"] if m.text else []
            said += [
                f"{m.role.capitalize()} called {c.name}({json.dumps(c.input)[:500]})"
                for c in m.tool_calls
            ]
            out += said
    return "\n\n".join(out)


def _chars(m: Message) -> int:
    return (
        len(m.text)
        + sum(len(c.name) + len(json.dumps(c.input)) + 40 for c in m.tool_calls)
        + sum(len(r.content) + 40 for r in m.results)
        + 10
    )


class JobContext(JobFinish):
    ratio: float = 0.0  # characters per token, as the provider last counted them
    fixed_chars: int = -1  # the system prompt and the tool definitions
    # what `index` knows of the stored messages, kept as they are added
    _sized: list[Message] | None = None  # the list it measured
    _sizes: list[int]  # each message's characters
    _longest: list[int]  # its longest tool result
    _turn_of: list[int]  # its job's model turn (a tool message: its calls' turn)
    _job_turns: dict[str, int]
    _latest: int = -1  # the latest compaction entry
    _view: list[Message] | None = None  # the last view (its characters: `_kept_chars`)
    # the view kept as messages are added (dropped with the index, when a run reads the
    # messages again): built for this latest compaction and this cut of tool results, from
    # the messages' first `_kept_upto`
    _kept: list[Message] | None = None
    _kept_at: tuple[int, int] = (-1, -1)
    _kept_upto: int = 0
    _kept_chars: int = 0

    def window(self) -> int:
        links = parse_chain(self.spec.model, self.s.settings)
        return min(window_of(self.s.settings, link.name) for link in links)

    def tokens(self, chars: int) -> int:
        ratio = self.ratio or self.s.settings.context_chars_per_token
        return int(chars / ratio) + 1

    def request_chars(self, view: list[Message]) -> int:
        if self.fixed_chars < 0:
            self.fixed_chars = len(self.system) + self.registry.described_chars(self.tools)
        if view is self._view:
            return self.fixed_chars + self._kept_chars
        return self.fixed_chars + sum(_chars(m) for m in view)

    def index(self) -> list[int]:
        """Each stored message's characters, measured once (stored messages do not
        change), with its longest result, its turn and the latest compaction: kept as
        messages are added, so a turn reads only what is new."""
        if self._sized is not self.messages:  # a new run read them again
            self._sized, self._sizes, self._longest = self.messages, [], []
            self._kept = None
            self._turn_of, self._job_turns, self._latest = [], {}, -1
        for i in range(len(self._sizes), len(self.messages)):
            m = self.messages[i]
            self._sizes.append(_chars(m))
            self._longest.append(max((len(r.content) for r in m.results), default=0))
            if m.role == "assistant":
                self._job_turns[m.job_id] = self._job_turns.get(m.job_id, 0) + 1
            self._turn_of.append(self._job_turns.get(m.job_id, 1) - 1)
            if m.role == "compaction":
                self._latest = i
        return self._sizes

    def counted(self, view: list[Message], input_tokens: int) -> None:
        """The provider counted this request's input: estimate at its ratio from now on."""
        if input_tokens > 0:
            low, high = RATIO_BOUNDS
            self.ratio = min(high, max(low, self.request_chars(view) / input_tokens))

    def compacted_at(self) -> int:
        """Where the messages sent start: after what the latest compaction covers."""
        self.index()
        return self.messages[self._latest].covers if self._latest >= 0 else 0

    def view(self) -> list[Message]:
        """The messages a request carries: the latest summary in place of what it covers,
        then every message since; long tool results cut, with a pointer to the rest. Kept
        as messages are added, so a turn adds only what is new (a job of a thousand turns
        spent a millisecond a turn going over them all); built again after a compaction."""
        start = self.compacted_at()
        limit = self.s.settings.tool_result_context_chars
        sizes, messages = self.index(), self.messages
        at = (self._latest, limit)
        if self._kept is None or self._kept_at != at:
            self._kept, self._kept_at = [], at
            self._kept_upto, self._kept_chars = start, 0
            if self._latest >= 0:
                head = Message(role="user", text=SUMMARY_HEAD + messages[self._latest].text)
                self._kept.append(head)
                self._kept_chars += _chars(head)
        kept, chars = self._kept, self._kept_chars
        for i in range(self._kept_upto, len(messages)):
            m = messages[i]
            if m.role == "compaction":
                continue
            if self._longest[i] > limit:
                turn = self._turn_of[i]
                m = m.model_copy(
                    update={"results": [self.cut(r, limit, m.job_id, turn) for r in m.results]}
                )
                chars += _chars(m)
            else:
                chars += sizes[i]
            kept.append(m)
        self._kept_upto, self._kept_chars = len(messages), chars
        out = list(kept)  # the request's own list: the kept one grows with the job
        self._view = out  # request_chars(out) is then known
        return out

    def release(self) -> None:
        super().release()
        self._sized = self._kept = self._view = None

    def cut(self, result: ToolResultBlock, limit: int, job_id: str, turn: int) -> ToolResultBlock:
        if len(result.content) <= limit:
            return result
        job = f', job_id="{job_id}"' if job_id and job_id != self.job_id else ""
        pointer = (
            f"\n\n[cut: {len(result.content)} characters in all, the first {limit} shown; "
            f'read_result(call_id="{result.call_id}", turn={turn}{job}, start_index={limit}) '
            "reads on]"
        )
        return result.model_copy(update={"content": result.content[:limit] + pointer})

    async def fitted(self, provider: ModelProvider, force: bool = False) -> list[Message]:
        """The view, compacted first when it would fill too much of the window."""
        view = self.view()
        limit = self.window() * self.s.settings.context_compact_at
        too_long = force or self.tokens(self.request_chars(view)) > limit
        if too_long and await self.compact(provider):
            view = self.view()
        return view

    def boundary(self) -> int:
        """Where the kept recent messages start: as many as fit `context_keep_recent` of
        the window, starting at a user or assistant message (never at tool results, whose
        calls would be cut off)."""
        keep = self.window() * self.s.settings.context_keep_recent
        start, used, cut = self.compacted_at(), 0, len(self.messages)
        sizes = self.index()
        for i in range(len(self.messages) - 1, start - 1, -1):
            m = self.messages[i]
            used += self.tokens(sizes[i])
            if used > keep:
                break
            if m.role in ("user", "assistant"):
                cut = i
        if cut == len(self.messages):  # the last message alone is too big: keep only it
            cut = next(
                (
                    i
                    for i in range(len(self.messages) - 1, start, -1)
                    if self.messages[i].role in ("user", "assistant")
                ),
                start,
            )
        return cut

    async def compact(self, provider: ModelProvider) -> bool:
        """Summarise the messages before the kept recent ones; False if there are none."""
        start, cut = self.compacted_at(), self.boundary()
        if cut <= start:
            return False
        older = [m for m in self.messages[:cut] if m.role == "compaction"][-1:]
        older += [m for m in self.messages[start:cut] if m.role != "compaction"]
        summariser = provider
        if model := self.s.settings.context_compact_model:
            summariser = provider_for(
                model,
                None,
                self.s.settings,
                self.s.http,
                self.s.redis,
                self.spec.agent_id,
                self.defer,
            )
            window = min(window_of(self.s.settings, link.name) for link in parse_chain(model))
        else:
            window = self.window()
        cap = min(RENDER_RESULT_CHARS, self.s.settings.tool_result_context_chars)
        summary = await self.summarise(summariser, render(older, cap), window)
        entry = Message(role="compaction", text=summary, covers=cut, job_id=self.job_id)
        await self.append(entry)
        self.defer("context_compacted", covers=cut, messages=cut - start, chars=len(summary))
        log.info(
            "job %s: %d messages compacted into %d characters",
            self.job_id,
            cut - start,
            len(summary),
        )
        return True

    async def summarise(self, summariser: ModelProvider, text: str, window: int) -> str:
        """A summary of `text` (at most a fifth of the window), folded chunk by chunk when
        it is longer than the summariser's window allows. A chunk refused as too long
        teaches the ratio and is sent again smaller."""
        s = self.s.settings
        summary, at = "", 0
        while at < len(text):
            room = int(window * (self.ratio or s.context_chars_per_token))  # in characters
            longest = min(s.context_summary_max_chars, room // 5)
            size = max(1000, int(room * 0.6) - len(summary) - len(SUMMARY_SYSTEM))
            chunk = text[at : at + size]
            given = f"Summary so far:\n{summary}\n\nWhat followed:\n{chunk}" if summary else chunk
            request = ModelRequest(
                system=SUMMARY_SYSTEM,
                messages=[Message(role="user", text=given)],
                turn=self.turns,
                purpose="summary",
            )
            try:
                reply = await summariser.complete(request)
            except ContextOverflow:
                if size <= 1000:
                    raise
                self.learn(len(SUMMARY_SYSTEM) + len(given), window)
                continue
            at += size
            if reply.usage is not None:
                await self.charge(usage=reply.usage, model=reply.model)
            summary = reply.text.strip()[:longest]
        return summary

    def learn(self, chars: int, window: int) -> None:
        """A request of `chars` characters held more than `window` tokens: fewer
        characters make a token than the estimate said."""
        ratio = self.ratio or self.s.settings.context_chars_per_token
        self.ratio = max(RATIO_BOUNDS[0], min(ratio, chars / window) * 0.9)

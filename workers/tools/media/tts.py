"""tts: text to speech, kept as an audio artifact (Ogg Opus or MP3) with its duration.

Providers are tried in `CLAWQ_TTS_PROVIDERS` order: espeak-ng (local and free, the
default), OpenAI's `/audio/speech`, ElevenLabs, and Microsoft Edge's read-aloud voices
(the `edge-tts` library). One that is not configured, fails, or is over its daily quota is
skipped with its reason; when all fail, one error names each reason. The text goes out in
requests of at most `CLAWQ_TTS_MAX_CHARS` characters, cut at sentence ends (a longer
sentence between words); ffmpeg joins the pieces and encodes them once, and ffprobe
measures the result. Commands run without a shell, with timeouts and a bare environment.

Permission "allow": a call only makes an artifact, and what paid providers can spend is
bounded by `CLAWQ_MEDIA_QUOTA_PER_DAY`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from broker.config.settings import Settings
from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult
from workers.tools.media.providers import ProviderError, check, send, take_quota

if TYPE_CHECKING:
    from workers.egress.client import Fetched, Resolver
    from workers.egress.netguard import EgressPolicy

Format = Literal["opus", "mp3"]
MIMES: dict[str, str] = {"opus": "audio/ogg", "mp3": "audio/mpeg"}
SUFFIXES: dict[str, str] = {"opus": "ogg", "mp3": "mp3"}
CODECS: dict[str, list[str]] = {
    "opus": ["-c:a", "libopus", "-b:a", "32k", "-f", "ogg"],
    "mp3": ["-c:a", "libmp3lame", "-b:a", "64k", "-f", "mp3"],
}
ENCODE_TIMEOUT_S = 120.0
# a sentence ends at . ! ? … (and closing quotes or brackets) before a space, at CJK full
# stops, or at a line break
CLOSERS = "\"')\\]\u201d\u2019\u300d\u300f"  # quotes and brackets after the stop
BOUNDARY = re.compile(rf"[.!?\u2026]+[{CLOSERS}]*(?=\s)|[\u3002\uff01\uff1f]+[{CLOSERS}]*|\n")
VOICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_+./:-]{0,79}$")


class TtsInput(ToolInput):
    text: str = Field(min_length=1, max_length=1_000_000, description="what to say, plain text")
    format: Format | None = Field(
        None, description="opus (in Ogg) or mp3; default: the configured one"
    )


def sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped, in order."""
    found, start = [], 0
    for match in BOUNDARY.finditer(text):
        if piece := text[start : match.end()].strip():
            found.append(piece)
        start = match.end()
    if tail := text[start:].strip():
        found.append(tail)
    return found


def _pack(pieces: Iterable[str], max_chars: int) -> list[str]:
    """Pieces of at most `max_chars`, joined by spaces into as few chunks as fit."""
    chunks, current = [], ""
    for piece in pieces:
        joined = f"{current} {piece}" if current else piece
        if len(joined) <= max_chars:
            current = joined
        else:
            chunks.append(current)
            current = piece
    if current:
        chunks.append(current)
    return chunks


def _words(sentence: str, max_chars: int) -> list[str]:
    """A sentence longer than `max_chars` in parts cut between words (a longer word inside)."""
    pieces = []
    for word in sentence.split():
        while len(word) > max_chars:
            pieces.append(word[:max_chars])
            word = word[max_chars:]
        if word:
            pieces.append(word)
    return _pack(pieces, max_chars)


def split_text(text: str, max_chars: int) -> list[str]:
    """The requests for `text`: whole sentences packed up to `max_chars` characters each."""
    return _pack(
        (
            part
            for sentence in sentences(text)
            for part in ([sentence] if len(sentence) <= max_chars else _words(sentence, max_chars))
        ),
        max_chars,
    )


def voice_for(setting: str, provider: str) -> str:
    """`CLAWQ_TTS_VOICE` for one provider: a plain name is every provider's;
    `openai:nova,espeak:en-us` names one per provider; '' means the provider's default.
    ElevenLabs takes only the second form (its own is `CLAWQ_ELEVENLABS_VOICE_ID`)."""
    setting = setting.strip()
    if ":" not in setting:
        return "" if provider == "elevenlabs" else setting
    for entry in setting.split(","):
        name, _, voice = entry.partition(":")
        if name.strip() == provider:
            return voice.strip()
    return ""


def _run(argv: list[str], timeout: float, stdin: bytes = b"") -> bytes:
    """A command without a shell, a bare environment and a timeout; its stdout."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise ProviderError(f"{argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise ProviderError(f"{argv[0]} took longer than {timeout:.0f} s") from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise ProviderError(f"{argv[0]} failed: {lines[-1] if lines else done.returncode}")
    return done.stdout


def _audio(fetched: Fetched, out: Path) -> None:
    """A provider's answer written to `out` when it is audio."""
    check(fetched)
    if fetched.content_type.startswith(("application/json", "text/")) or not fetched.body:
        raise ProviderError(f"answered {fetched.content_type or 'nothing'}, not audio")
    out.write_bytes(fetched.body)


class Speaker:
    """One provider: whether it can be used here, and one request's audio into a file."""

    def missing(self, settings: Settings) -> str:
        return ""

    def suffix(self, fmt: str) -> str:
        return "mp3"

    def speak(self, text: str, voice: str, fmt: str, out: Path, ctx: ToolContext) -> None:
        raise NotImplementedError


class Espeak(Speaker):
    def missing(self, settings: Settings) -> str:
        found = shutil.which("espeak-ng")
        return "" if found else "espeak-ng is not installed (Debian: apt-get install espeak-ng)"

    def suffix(self, fmt: str) -> str:
        return "wav"

    def speak(self, text: str, voice: str, fmt: str, out: Path, ctx: ToolContext) -> None:
        if voice and not VOICE.match(voice):
            raise ProviderError(f"'{voice}' is not a voice name")
        argv = ["espeak-ng", "-b", "1", "-v", voice or "en", "-w", str(out), "--stdin"]
        _run(argv, ctx.settings.tts_timeout_s, text.encode())  # stdin: text is never an option


class OpenAI(Speaker):
    def missing(self, settings: Settings) -> str:
        return "" if settings.openai_api_key else "not configured (CLAWQ_OPENAI_API_KEY is empty)"

    def suffix(self, fmt: str) -> str:
        return SUFFIXES[fmt]

    def speak(self, text: str, voice: str, fmt: str, out: Path, ctx: ToolContext) -> None:
        s = ctx.settings
        fetched = send(
            ctx,
            "POST",
            f"{s.openai_base_url.rstrip('/')}/audio/speech",
            headers={"Authorization": f"Bearer {s.openai_api_key}"},
            json_body={
                "model": s.openai_tts_model,
                "input": text,
                "voice": voice or "alloy",
                "response_format": fmt,
            },
            timeout_s=s.tts_timeout_s,
            max_bytes=s.artifact_max_bytes,
        )
        _audio(fetched, out)


class ElevenLabs(Speaker):
    def missing(self, settings: Settings) -> str:
        if not settings.elevenlabs_api_key:
            return "not configured (CLAWQ_ELEVENLABS_API_KEY is empty)"
        return ""

    def speak(self, text: str, voice: str, fmt: str, out: Path, ctx: ToolContext) -> None:
        from urllib.parse import quote

        s = ctx.settings
        voice_id = quote(voice or s.elevenlabs_voice_id, safe="")
        fetched = send(
            ctx,
            "POST",
            f"{s.elevenlabs_base_url.rstrip('/')}/v1/text-to-speech/{voice_id}",
            headers={"xi-api-key": s.elevenlabs_api_key, "Accept": "audio/mpeg"},
            json_body={"text": text, "model_id": s.elevenlabs_model},
            timeout_s=s.tts_timeout_s,
            max_bytes=s.artifact_max_bytes,
        )
        _audio(fetched, out)


class Edge(Speaker):
    """Edge's read-aloud service over a websocket (`edge-tts`, on aiohttp, not our egress
    client): the host passes the egress policy first, and every address aiohttp connects
    to is checked by a resolver of ours (behind `CLAWQ_WEB_PROXY`, the names beforehand).
    Unlike the egress client, edge-tts's session honours the environment's proxy variables.
    Microsoft's service is not reachable from the test machines: only refusals are tested."""

    HOST = "speech.platform.bing.com"
    PART_CHARS = 800  # at most 4,096 bytes after XML escaping: one websocket request each

    def missing(self, settings: Settings) -> str:
        import importlib.util

        found = importlib.util.find_spec("edge_tts")
        return "" if found else "the edge-tts package is not installed"

    def speak(self, text: str, voice: str, fmt: str, out: Path, ctx: ToolContext) -> None:
        import asyncio

        from workers.egress.client import checked_addresses
        from workers.egress.netguard import EgressError, EgressPolicy, check_host

        policy = EgressPolicy.from_settings(ctx.settings)
        timeout = ctx.settings.tts_timeout_s
        try:
            check_host(self.HOST, policy)
            if policy.proxy:
                checked_addresses(self.HOST, 443, policy)
            parts = split_text(text, self.PART_CHARS)
            audio = b"".join(
                asyncio.run(asyncio.wait_for(_edge_audio(p, voice, policy, timeout), timeout))
                for p in parts
            )
        except EgressError as exc:
            raise ProviderError(exc.reason) from None
        except TimeoutError:
            raise ProviderError(f"no answer within {timeout:.0f} s") from None
        except Exception as exc:  # aiohttp's and edge-tts's own errors
            raise ProviderError(f"{type(exc).__name__}: {exc}") from None
        if not audio:
            raise ProviderError("no audio came back")
        out.write_bytes(audio)


def guarded_connector(policy: EgressPolicy, resolver: Resolver | None = None) -> Any:
    """An aiohttp connector (made inside a running loop) that connects only to addresses
    the egress policy allows: its resolver answers with `checked_addresses`. aiohttp
    resolves no IP literals, so only names reach it; Edge's host is one."""
    import asyncio
    import socket

    import aiohttp
    import aiohttp.abc

    from workers.egress.client import checked_addresses, system_resolver

    lookup = resolver or system_resolver

    class Guarded(aiohttp.abc.AbstractResolver):
        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[aiohttp.abc.ResolveResult]:
            found = await asyncio.to_thread(checked_addresses, host, port, policy, lookup)
            return [
                aiohttp.abc.ResolveResult(
                    hostname=host,
                    host=a,
                    port=port,
                    family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                    proto=0,
                    flags=socket.AI_NUMERICHOST,
                )
                for a in found
            ]

        async def close(self) -> None:
            return None

    return aiohttp.TCPConnector(resolver=Guarded())


async def _edge_audio(text: str, voice: str, policy: EgressPolicy, timeout: float) -> bytes:
    import edge_tts

    communicate = edge_tts.Communicate(
        text,
        voice or edge_tts.constants.DEFAULT_VOICE,
        connector=None if policy.proxy else guarded_connector(policy),
        proxy=policy.proxy or None,
        connect_timeout=max(int(policy.connect_timeout_s), 1),
        receive_timeout=max(int(timeout), 1),
    )
    chunks = [c["data"] async for c in communicate.stream() if c["type"] == "audio" and "data" in c]
    return b"".join(chunks)


SPEAKERS: dict[str, Speaker] = {
    "espeak": Espeak(),
    "openai": OpenAI(),
    "elevenlabs": ElevenLabs(),
    "edge": Edge(),
}


def _encode(pieces: list[Path], fmt: str, workdir: Path) -> tuple[bytes, float]:
    """The pieces joined (ffmpeg's concat demuxer), encoded once, and the decoded length."""
    listing = workdir / "pieces.txt"
    listing.write_text("".join(f"file '{p.name}'\n" for p in pieces))
    out = workdir / f"speech.{SUFFIXES[fmt]}"
    quiet = ["-nostdin", "-hide_banner", "-loglevel", "error"]
    source = ["-f", "concat", "-i", str(listing), "-vn", "-ac", "1"]
    _run(["ffmpeg", *quiet, *source, *CODECS[fmt], "-y", str(out)], ENCODE_TIMEOUT_S)
    probe = ["ffprobe", "-v", "error", "-show_entries", "format=duration"]
    shown = _run([*probe, "-of", "default=nw=1:nk=1", str(out)], ENCODE_TIMEOUT_S)
    try:
        duration = float(shown.decode().strip())
    except ValueError:
        raise ProviderError("its audio has no measurable length") from None
    if duration <= 0:
        raise ProviderError("its audio is empty")
    return out.read_bytes(), duration


def _render(name: str, pieces: list[str], fmt: str, ctx: ToolContext) -> tuple[bytes, float]:
    """Every piece from one provider, joined: the audio and its length in seconds."""
    speaker = SPEAKERS[name]
    if why := speaker.missing(ctx.settings):
        raise ProviderError(why)
    voice = voice_for(ctx.settings.tts_voice, name)
    with tempfile.TemporaryDirectory(prefix="clawq-tts-") as tmp:
        paths = []
        for n, piece in enumerate(pieces):
            if stop := ctx.cancelled():
                raise ToolError(f"tts stopped: {stop}")
            take_quota(ctx, name)
            path = Path(tmp) / f"piece-{n:03d}.{speaker.suffix(fmt)}"
            speaker.speak(piece, voice, fmt, path, ctx)
            paths.append(path)
        return _encode(paths, fmt, Path(tmp))


class Tts(Tool[TtsInput]):
    name = "tts"
    description = (
        "Speak text aloud: returns an audio artifact (Ogg Opus, or mp3 with format=mp3) and "
        "its duration. Give plain text; long text is spoken in parts and joined."
    )
    group = Group.media
    input_model = TtsInput
    side_effect = SideEffect.idempotent
    default_permission = "allow"
    timeout_s = 120.0

    def summary(self, args: TtsInput) -> str:
        return f"tts({args.text[:60]})"

    def concurrency_safe(self, args: TtsInput) -> bool:
        return True

    def timeout(self, args: TtsInput, settings: Settings) -> float:
        """Every request of every provider at its own timeout, and the encoding."""
        text = args.text[: settings.tts_max_total_chars]
        requests = max(len(split_text(text, settings.tts_max_chars)), 1)
        providers = max(len(settings.tts_providers), 1)
        return min(30.0 + ENCODE_TIMEOUT_S + settings.tts_timeout_s * requests * providers, 1800)

    def run(self, args: TtsInput, ctx: ToolContext) -> ToolResult:
        settings = ctx.settings
        text = args.text.strip()
        if not text:
            raise ToolError("the text is empty")
        if len(text) > settings.tts_max_total_chars:
            raise ToolError(
                f"the text is {len(text)} characters; tts takes at most "
                f"{settings.tts_max_total_chars} a call: split it over several calls"
            )
        if not (shutil.which("ffmpeg") and shutil.which("ffprobe")):
            raise ToolError("tts needs ffmpeg on this worker (Debian: apt-get install ffmpeg)")
        fmt = args.format or settings.tts_format
        pieces = split_text(text, settings.tts_max_chars)
        reasons: list[str] = []
        for name in settings.tts_providers:
            try:
                data, duration = _render(name, pieces, fmt, ctx)
            except ProviderError as exc:
                reasons.append(f"{name}: {exc}")
                continue
            stored = ctx.keep_artifact(
                data, MIMES[fmt], f"speech.{SUFFIXES[fmt]}", duration_s=round(duration, 3)
            )
            count = len(pieces)
            body = f"{stored.describe()}\nspoken by {name} in {count} request"
            body += "s" if count != 1 else ""
            if reasons:
                body += "\n[note: skipped before it: " + "; ".join(reasons) + "]"
            return ToolResult(
                for_llm=body,
                for_user=f"speech, {duration:.1f} s ({name})",
                metadata={
                    "artifact_id": stored.id,
                    "provider": name,
                    "requests": count,
                    "duration_s": duration,
                    "format": fmt,
                    "mime": stored.mime,
                    "skipped": reasons,
                },
            )
        none = "no provider is configured (CLAWQ_TTS_PROVIDERS)"
        return ToolResult.error("tts failed: " + ("; ".join(reasons) or none))


TOOLS: list[type[Tool[Any]]] = [Tts]

"""What each browser action does, as coroutines on the engine's loop. They return an
`Outcome`; bytes that become an artifact are stored by the calling thread afterwards, so
the browser's loop never waits on the database."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workers.tool import ToolError
from workers.tools.ui import snapshot as snap

if TYPE_CHECKING:
    from workers.tools.ui.browser import BrowserInput
    from workers.tools.ui.engine import Engine, Keep, Owner, Session


@dataclass
class Outcome:
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    blob: tuple[bytes, str] | None = None  # (bytes, mime) to keep as an artifact
    untrusted: bool = False  # page content: wrapped before the model sees it


async def _where(session: Session) -> str:
    page = session.tab.page
    try:
        title = await page.title()
    except Exception:
        title = ""
    return f"tab {session.current}: {title!r} {page.url}"


def _notes(session: Session) -> str:
    notes = []
    if session.blocked:
        notes.append("blocked by the egress policy: " + "; ".join(session.blocked))
        session.blocked.clear()
    if session.downloads:
        notes.append("downloads: " + "; ".join(session.downloads))
        session.downloads.clear()
    return ("\n" + "\n".join(notes)) if notes else ""


async def _locator(session: Session, ref: str) -> Any:
    locator = session.tab.page.locator(f"aria-ref={ref}")
    if await locator.count() == 0:
        raise ToolError(f"ref {ref} is not on the page any more; take a new snapshot")
    return locator


async def run(engine: Engine, owner: Owner, keep: Keep, args: BrowserInput, lost: str) -> Outcome:
    """One action in `owner`'s session; `keep` stores what its pages download, for the
    session's owner (the engine asks the session, never the last caller)."""
    from playwright.async_api import Error as PlaywrightError

    key = owner.session_id
    session = await engine.session(owner, keep, create=args.action in ("navigate", "tabs"))
    if session is None:
        if args.action == "close":
            return Outcome("no browser session was open")
        raise ToolError("no browser session yet; navigate to a URL first")
    try:
        outcome = await _act(engine, session, key, args)
    except PlaywrightError as exc:
        message = str(exc).split("\n", 1)[0]
        raise ToolError(f"browser {args.action} failed: {message}") from None
    if lost:
        outcome.text = f"[{lost.split(';')[0]}; this is a new session]\n{outcome.text}"
    if args.action != "close":
        outcome.text += _notes(session)
    return outcome


async def _act(engine: Engine, session: Session, key: str, args: BrowserInput) -> Outcome:
    page = session.tab.page
    action = args.action
    if action == "navigate":
        response = await page.goto(args.url or "", wait_until="domcontentloaded")
        status = response.status if response is not None else "no response"
        return Outcome(f"navigated ({status}); {await _where(session)}")
    if action == "back":
        await page.go_back(wait_until="domcontentloaded")
        return Outcome(f"went back; {await _where(session)}")
    if action == "tabs":
        return await _tabs(engine, session, args)
    if action == "snapshot":
        scope = page.locator(args.selector) if args.selector else page
        tree = await scope.aria_snapshot(mode="ai")
        lines = snap.lines_of(tree, interactive=not args.full)
        cap = args.max_chars or engine.settings.browser_snapshot_max_chars
        before, session.tab.last_snapshot = session.tab.last_snapshot, lines
        body = snap.diff(before, lines) if args.diff and before else snap.cap(lines, cap)
        text = f"{await _where(session)}\n{body}"
        return Outcome(snap.cap(text.splitlines(), cap), {"lines": len(lines)}, untrusted=True)
    if action in ("click", "type", "fill", "select", "hover"):
        assert args.ref
        locator = await _locator(session, args.ref)
        if action == "click":
            await locator.click()
        elif action == "type":
            await locator.press_sequentially(args.text or "")
        elif action == "fill":
            await locator.fill(args.text or "")
        elif action == "select":
            chosen = await locator.select_option(args.values or [])
            return Outcome(f"selected {chosen} in {args.ref}; {await _where(session)}")
        else:
            await locator.hover()
        return Outcome(f"{action} {args.ref} done; {await _where(session)}")
    if action == "press":
        target = await _locator(session, args.ref) if args.ref else page.keyboard
        await target.press(args.key or "")
        return Outcome(f"pressed {args.key}; {await _where(session)}")
    if action == "wait_for":
        if args.selector:
            await page.wait_for_selector(args.selector)
        else:
            await page.get_by_text(args.text or "").first.wait_for()
        return Outcome(f"found it; {await _where(session)}")
    if action == "screenshot":
        raw = await page.screenshot(type="png", full_page=args.full_page)
        return Outcome(f"screenshot of {await _where(session)}", blob=(raw, "image/png"))
    if action == "pdf":
        return Outcome(
            f"pdf of {await _where(session)}", blob=(await page.pdf(), "application/pdf")
        )
    if action == "console":
        lines = list(session.tab.console)[-50:]
        return Outcome("\n".join(lines) or "[no console messages]", untrusted=True)
    if action == "evaluate":
        value = await page.evaluate(args.expression or "")
        return Outcome(json.dumps(value, default=str)[:20_000], untrusted=True)
    if action == "close":
        await engine.close(key)
        return Outcome("closed the browser session")
    raise ToolError(f"unknown action {action}")


async def _tabs(engine: Engine, session: Session, args: BrowserInput) -> Outcome:
    if args.tab_action == "open":
        await engine.open_tab(session, args.url)
    elif args.tab_action in ("focus", "close"):
        if args.tab is None or args.tab >= len(session.tabs):
            raise ToolError(f"no tab {args.tab}; tabs list shows {len(session.tabs)} tabs")
        if args.tab_action == "focus":
            session.current = args.tab
            await session.tab.page.bring_to_front()
        else:
            closing = session.tabs.pop(args.tab)
            await closing.page.close()
            if not session.tabs:
                await engine.open_tab(session)
            session.current = min(session.current, len(session.tabs) - 1)
    rows = []
    for i, tab in enumerate(session.tabs):
        mark = "*" if i == session.current else " "
        rows.append(f"{mark} {i}: {await tab.page.title()!r} {tab.page.url}")
    return Outcome("\n".join(rows))

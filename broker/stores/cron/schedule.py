"""When a scheduled job fires: `at` (one time), `every` (a period of at least 60 s) or
`cron` (an expression in a timezone, croniter on zoneinfo, so 09:00 in Berlin is 07:00 or
08:00 UTC by the season). Pure functions of a schedule and a time: reading a schedule
never moves it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field, model_validator

MIN_EVERY_S = 60


class Schedule(BaseModel):
    kind: Literal["at", "every", "cron"]
    at: datetime | None = Field(None, description="at: when (with an offset, or UTC)")
    every_s: int | None = Field(None, ge=MIN_EVERY_S, description="every: the period")
    cron: str | None = Field(None, description="cron: five fields, e.g. 0 9 * * 1-5")
    timezone: str = Field("UTC", description="cron: an IANA zone, e.g. Europe/Berlin")

    @model_validator(mode="after")
    def _complete(self) -> Schedule:
        from croniter import croniter

        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {self.timezone!r} is not an IANA zone") from None
        if self.kind == "at" and self.at is None:
            raise ValueError("an at schedule needs at")
        if self.kind == "every" and self.every_s is None:
            raise ValueError(f"an every schedule needs every_s (at least {MIN_EVERY_S})")
        if self.kind == "cron":
            if not self.cron or not croniter.is_valid(self.cron):
                raise ValueError(f"cron {self.cron!r} is not a valid expression")
            if len(self.cron.split()) != 5:
                raise ValueError("cron takes five fields: minute hour day month weekday")
        if self.at is not None and self.at.tzinfo is None:
            self.at = self.at.replace(tzinfo=UTC)
        return self

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


def next_after(
    schedule: Schedule, after: datetime, anchor: datetime | None = None
) -> datetime | None:
    """The first fire time strictly after `after` (None: an `at` already past).
    `every` counts from `anchor` (its first fire), so fire times never drift."""
    from croniter import croniter

    if schedule.kind == "at":
        assert schedule.at is not None
        return schedule.at if schedule.at > after else None
    if schedule.kind == "every":
        assert schedule.every_s is not None
        start = anchor or after
        if start > after:
            return start
        periods = int((after - start).total_seconds() // schedule.every_s) + 1
        return start + timedelta(seconds=periods * schedule.every_s)
    assert schedule.cron is not None
    local = after.astimezone(schedule.zone)
    fired: datetime = croniter(schedule.cron, local).get_next(datetime)
    return fired.astimezone(UTC)


def upcoming(
    schedule: Schedule, now: datetime, anchor: datetime | None, n: int = 3
) -> list[datetime]:
    out: list[datetime] = []
    t: datetime | None = now
    while len(out) < n and t is not None:
        t = next_after(schedule, t, anchor)
        if t is not None:
            out.append(t)
    return out


def describe(schedule: Schedule) -> str:
    """The schedule in words."""
    if schedule.kind == "at":
        assert schedule.at is not None
        return f"once at {schedule.at.isoformat()}"
    if schedule.kind == "every":
        assert schedule.every_s is not None
        seconds = schedule.every_s
        unit = next(
            (
                (n, u)
                for n, u in ((86400, "day"), (3600, "hour"), (60, "minute"))
                if seconds % n == 0
            ),
            (1, "second"),
        )
        count = seconds // unit[0]
        return f"every {count} {unit[1]}{'s' if count != 1 else ''}"
    from cron_descriptor import get_description

    return f"{get_description(schedule.cron or '')} ({schedule.timezone})"


def missed(
    schedule: Schedule, due: datetime, now: datetime, anchor: datetime | None
) -> list[datetime]:
    """Every fire time from `due` up to `now`, in order (what a downtime skipped)."""
    times = [due]
    while (t := next_after(schedule, times[-1], anchor)) is not None and t <= now:
        times.append(t)
        if len(times) > 10_000:
            break
    return times

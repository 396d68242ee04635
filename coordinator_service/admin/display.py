"""How people are shown values, by the console (its Jinja filters) and `sink-coordinator status`: an epoch that is
none yet, a duration, a time in milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime

# What stands for a value there is none of (a sink never committed).
NOTHING = "\N{EN DASH}"


def epoch(value: int) -> str:
    """An epoch number; -1, the log's "none yet" (nothing checkpointed or committed), as the word."""
    return "none" if value < 0 else str(value)


def duration(seconds: float) -> str:
    """A duration as a person reads it: 42 s, 5 min, 3 h, 2 d (whole units, rounded down)."""
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 120 * 60:
        return f"{seconds // 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds // 3600:.0f} h"
    return f"{seconds // 86400:.0f} d"


def milliseconds_time(value: str) -> str:
    """Milliseconds since the Unix epoch (a writer's kafka.valid-through-ms) as a UTC time; another value as it is."""
    try:
        moment = datetime.fromtimestamp(int(value) / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return value
    return f"{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond // 1000:03d} UTC"


def moment(value: datetime | None) -> str:
    """A time to the second, or NOTHING."""
    return NOTHING if value is None else f"{value:%Y-%m-%d %H:%M:%S}"

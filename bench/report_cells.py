"""How the report writes a figure: thousands separated, a median with its spread, a goal met or not."""

from __future__ import annotations


def figure(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def spread(cell: dict[str, float], digits: int = 0) -> str:
    return f"{figure(cell['median'], digits)} ({figure(cell['min'], digits)}-{figure(cell['max'], digits)})"


def goal_met(ok: bool) -> str:
    return "met" if ok else "NOT met"

"""How the ``fray`` commands show things: tables, durations, attempts, results."""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from fray_core.types import JobInfo

__all__ = [
    "age",
    "attempt_rows",
    "describe_resources",
    "duration",
    "first_line",
    "format_table",
    "print_attempts",
    "print_results",
    "timestamp",
]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns, two spaces apart; the last column is not padded.

    >>> print(format_table(["ID", "STATUS"], [["a", "RUNNING"], ["bb", "FAILED"]]))
    ID  STATUS
    a   RUNNING
    bb  FAILED
    """
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def age(seconds: float) -> str:
    """``12s``, ``5m``, ``3h``, ``2d``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def duration(seconds: float | None) -> str:
    """``1.4s``, ``2m03s``, ``1h05m``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def first_line(text: str | None) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


def timestamp(t: float | None) -> str:
    if not t:
        return "-"
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def attempt_rows(info: JobInfo) -> list[list[str]]:
    now = time.time()
    rows = []
    for a in info.attempts:
        end = a.ended_at if a.ended_at is not None else (now if a.outcome is None else None)
        dur = duration(end - a.started_at if end is not None and a.started_at else None)
        outcome = a.outcome.value if a.outcome else ("RUNNING" if a.slices else "WAITING")
        rows.append([str(a.index), ", ".join(a.slices) or "-", outcome, dur, first_line(a.cause)])
    return rows


def print_attempts(info: JobInfo, out: TextIO) -> None:
    if info.attempts:
        print(format_table(["ATTEMPT", "SLICES", "OUTCOME", "DURATION", "CAUSE"], attempt_rows(info)), file=out)


def print_results(info: JobInfo, out: TextIO, limit: int = 200) -> None:
    for i, r in enumerate(info.result or []):
        if r is None:
            continue
        text = repr(r)
        print(f"[fray] result[{i}]: {text if len(text) <= limit else text[:limit] + '...'}", file=out)


def describe_resources(summary: dict[str, Any]) -> str:
    dev = summary.get("device") or {}
    replicas = summary.get("replicas", 1)
    counts = "/".join(map(str, replicas)) if isinstance(replicas, list) else str(replicas)
    if dev.get("kind") == "tpu":
        what = f"{counts} x {dev.get('type')} ({dev.get('hosts')} host(s) per slice)"
    elif dev.get("kind") == "gpu":
        what = f"{counts} process(es) x {dev.get('count')} {dev.get('type')} GPU"
    else:
        what = f"{counts} process(es)"
    return f"{what}, cpu {summary.get('cpu')}, ram {summary.get('ram')}"

"""How the ``fray`` commands show things: tables, durations, attempts, results."""

from __future__ import annotations

import datetime
import os
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from fray_core.status import JobInfo

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
    """Plain aligned columns, two spaces apart; the last column is not padded (rendered by ``rich``).

    >>> print(format_table(["ID", "STATUS"], [["a", "RUNNING"], ["bb", "FAILED"]]))
    ID  STATUS
    a   RUNNING
    bb  FAILED
    """
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=100_000, color_system=None, force_terminal=False, highlight=False).print(
        _table(headers, rows, fit=False)
    )
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines())


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO, wrap: int | None = None) -> None:
    """A table on ``out``: bold headers and fitted to the width on a terminal, else :func:`format_table`.
    On a terminal, column ``wrap`` (default: the last) takes the room left and wraps; every other column
    keeps its text whole, so no column is ever dropped."""
    if not is_terminal(out):
        print(format_table(headers, rows), file=out)
        return
    from rich.console import Console

    console = Console(file=out, highlight=False)
    if (
        wrap is None and len(headers) > 8
    ):  # `--wide`: every column at its full width, wider than the terminal if need be
        console = Console(file=out, highlight=False, width=100_000)
    console.print(_table(headers, rows, fit=True, wrap=wrap))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], fit: bool, wrap: int | None = None) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="bold" if fit else "")
    cells = [[Text("" if c is None else safe(str(c))) for c in row] for row in rows]  # Text: no markup
    flexible = len(headers) - 1 if wrap is None else wrap
    for i, h in enumerate(headers):
        last = i == flexible
        # on a terminal the last column (names, causes) takes the room left and wraps; the others keep
        # their text whole
        widest = max([len(h)] + [len(r[i]) for r in cells if i < len(r)])
        if fit and last:  # never squeezed to nothing: at least its header, or its longest word
            words = [len(w) for r in cells if i < len(r) for w in r[i].plain.split()]
            table.add_column(Text(h), ratio=1, min_width=max([len(h), *words[:1000]]) if wrap is not None else None)
        else:
            table.add_column(Text(h), no_wrap=True, overflow="fold", min_width=widest)
    for row in cells:
        table.add_row(*row)
    return table


def is_terminal(out: TextIO) -> bool:
    """Whether ``out`` is a terminal that can redraw a line (not a pipe, a file, or ``TERM=dumb``)."""
    try:
        return bool(out.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def safe(text: str, keep_newlines: bool = False) -> str:
    r"""``text`` with terminal control characters (escape sequences, carriage returns, bidi overrides) shown
    escaped, so a job name or log line cannot move the cursor, recolour or rewrite the terminal.

    >>> safe("evil\x1b[2Jname")
    'evil\\x1b[2Jname'
    """
    pattern = _UNSAFE if keep_newlines else _UNSAFE_OR_NEWLINE  # keep_newlines also keeps tabs (log lines)
    return pattern.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


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


def one_line(text: str | None) -> str:
    """A multi-line message on one line: its first line, and when that line announces what follows (ends
    with ``:``, as ``...; last output:`` does) the last non-empty line of what follows, so the line never
    ends on a dangling colon.

    >>> one_line("CommandFailed: exit code 3; last output:\\none\\ntwo\\n")
    'CommandFailed: exit code 3; last output: two'
    """
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    head = lines[0]
    if head.endswith(":") and len(lines) > 1:
        head += f" {lines[-1]}"
    return head


def describe_error(info: JobInfo) -> str:
    """The job's error on one line. A backend's error can end with ``last output:`` while the output itself
    is only in the failed attempt's cause: the last line of that output is added from there."""
    error = one_line(info.error)
    if not error.endswith(":"):
        return error
    for a in reversed(info.attempts):
        lines = [line.strip() for line in (a.cause or "").strip().splitlines() if line.strip()]
        if len(lines) > 1 and error.endswith(lines[0]):
            return f"{error} {lines[-1]}"
    return error


def timestamp(t: float | None) -> str:
    if not t:
        return "-"
    try:
        return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, OverflowError, OSError):  # a planted record's year 28521834: that field, not the listing
        return f"{t:.0f} (not a date)"


def attempt_rows(info: JobInfo) -> list[list[str]]:
    now = time.time()
    rows = []
    for a in info.attempts:
        end = a.ended_at if a.ended_at is not None else (now if a.outcome is None else None)
        dur = duration(end - a.started_at if end is not None and a.started_at else None)
        outcome = a.outcome.value if a.outcome else ("RUNNING" if a.slices else "WAITING")
        rows.append([str(a.index), ", ".join(a.slices) or "-", outcome, dur, one_line(a.cause)])
    return rows


def print_attempts(info: JobInfo, out: TextIO) -> None:
    if info.attempts:
        print_table(["ATTEMPT", "SLICES", "OUTCOME", "DURATION", "CAUSE"], attempt_rows(info), out)


def print_results(results: Sequence[Any] | None, out: TextIO, limit: int = 200) -> None:
    """``[fray] result[i]: <repr>`` per process that returned something (long ones cut at ``limit``)."""
    for i, r in enumerate(results or []):
        if r is None:
            continue
        text = safe(repr(r))
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


# ------------------------------------------------------------------------------------------ timeline

_FILL = {
    "SUCCEEDED": "=",
    "PREEMPTED": "~",
    "FAILED": "x",
    "CANCELLED": "-",
    "UNSCHEDULABLE": "?",
    "RESIZED": "+",
    "STALLED": "!",
}
_LEGEND = [
    ("N", "attempt N starts"),
    ("=", "succeeded"),
    ("~", "preempted"),
    ("x", "failed"),
    ("-", "stopped"),
    ("?", "unschedulable"),
    ("+", "resized (stopped to grow)"),
    ("!", "stalled (no heartbeat)"),
    (">", "running"),
    (".", "waiting for slices"),
    ("P", "preemption"),
]
_NO_SLICE = "(no slice)"


def timeline(info: JobInfo, width: int = 60, now: float | None = None) -> list[str]:
    """The job's attempts drawn over time: one row per slice (``(no slice)`` for attempts that waited
    without getting any), each attempt a bar that starts with its index and is filled by its outcome, ``P``
    where a slice was preempted, a time axis from submission, and a legend of what is drawn.

    >>> from fray_core.types import Attempt, AttemptOutcome, JobInfo, JobStatus
    >>> info = JobInfo(job_id="j", name="j", status=JobStatus.SUCCEEDED, submitted_at=100.0, finished_at=104.0,
    ...     attempts=[Attempt(0, ["s-0", "s-1"], 100.0, 101.5, AttemptOutcome.PREEMPTED, "preempted on slice 1 (s-1)"),
    ...               Attempt(1, ["s-0", "s-1"], 102.0, 104.0, AttemptOutcome.SUCCEEDED)])
    >>> print(*timeline(info, width=21), sep=chr(10))
    s-0 |0~~~~~~~~ 1==========|
    s-1 |0~~~~~~~P 1==========|
         0s        2s        4s
    N attempt N starts  = succeeded  ~ preempted  P preemption
    """
    if not info.attempts:
        return []
    now = time.time() if now is None else now
    # a time of 0 is a missing one (records from older versions)
    t0 = min([t for t in [info.submitted_at, *(a.started_at for a in info.attempts)] if t] or [now])
    ends = [a.ended_at for a in info.attempts if a.ended_at is not None]
    t1 = info.finished_at if info.status.is_terminal() and info.finished_at else max([now, *ends])
    span = max(t1 - t0, 1e-6)

    def col(t: float) -> int:
        return min(width - 1, max(0, round((t - t0) / span * (width - 1))))

    rows: dict[str, list[str]] = {}
    used: set[str] = set()
    marks: list[tuple[str, int, str]] = []  # drawn last: attempt indices, then preemption instants
    notes: list[str] = []
    previous: int | None = None
    for a in info.attempts:
        end = a.ended_at if a.ended_at is not None else t1
        names = list(a.slices) or [_NO_SLICE]
        # an attempt whose hosts wait in the backend's own queue holds nothing yet (no acquired_at) while
        # the job says why it waits: drawn as waiting, not running
        queued = a.outcome is None and a.acquired_at is None and bool(info.pending_reason)
        if a.outcome is None:
            fill = ">" if a.slices and not queued else "."
        else:
            fill = _FILL.get(a.outcome.value, "?") if a.slices or a.outcome.value != "CANCELLED" else "."
        used.add(fill)
        c0, c1 = col(a.started_at or t0), col(end)
        # the attempt began when it began to wait for its slices: that wait is drawn as waiting
        ca = min(col(a.acquired_at), c1) if a.slices and a.acquired_at else c0
        if ca > c0:
            used.add(".")
        for name in names:
            row = rows.setdefault(name, [" "] * width)
            for c in range(c0, c1 + 1):
                row[c] = "." if c < ca else fill
            marks.append((name, c0, str(a.index % 10)))
        if a.outcome is not None and a.outcome.value == "PREEMPTED":
            hit = [n for n in a.slices if f"({n})" in (a.cause or "")] or names
            marks.extend((n, c1, "P") for n in hit)
            used.add("P")
        if a.slices:
            if previous is not None and len(a.slices) != previous:
                notes.append(f"attempt {a.index} resized {previous} -> {len(a.slices)} slices")
            previous = len(a.slices)
    for name, c, ch in sorted(marks, key=lambda m: m[2] == "P"):
        rows[name][c] = ch
    names = [n for n in rows if n != _NO_SLICE] + ([_NO_SLICE] if _NO_SLICE in rows else [])
    label = max(len(safe(n)) for n in names)
    lines = [f"{safe(n).ljust(label)} |{''.join(rows[n])}|" for n in names]
    lines.append(" " * (label + 2) + _axis(span, width))
    legend = [f"{ch} {what}" for ch, what in _LEGEND if ch == "N" or ch in used]
    lines.append("  ".join(legend + notes))
    return lines


def _axis(span: float, width: int) -> str:
    """Tick labels under the bars: about one every 10 columns, at round numbers of seconds (or minutes)."""
    raw = span / max(1, width // 10)
    step = next((m * 10**k for k in range(-2, 7) for m in (1, 2, 5) if m * 10**k >= raw), raw)
    axis = [" "] * (width + 8)
    end = -1
    t = 0.0
    while t <= span * 1.0001:
        c = round(t / span * (width - 1))
        text = _tick(t, step)
        if c > end and c + len(text) <= len(axis):
            axis[c : c + len(text)] = text
            end = c + len(text)
        t += step
    return "".join(axis).rstrip()


def _tick(t: float, step: float) -> str:
    if step >= 60 and t >= 60:
        return f"{t / 60:g}m"
    return f"{round(t, 2):g}s"


def print_timeline(info: JobInfo, out: TextIO) -> None:
    """:func:`timeline` on ``out``, as wide as the terminal allows (60 columns of bars when not a terminal)."""
    width = 60
    if is_terminal(out):
        import shutil

        label = max([len(safe(s)) for a in info.attempts for s in a.slices] + [len(_NO_SLICE)])
        width = max(20, min(120, shutil.get_terminal_size().columns - label - 4))
    for line in timeline(info, width=width):
        print(line, file=out)


# ------------------------------------------------------------------------------------------ JSON

#: the fields of a job in ``fray list --json`` / ``fray status --json`` (documented in docs/index.md)
JOB_FIELDS = (
    "job_id",
    "name",
    "status",
    "backend",
    "submitted_at",
    "finished_at",
    "progress",
    "error",
    "preemptions",
    "failures",
    "max_retries_preemption",
    "max_retries_failure",
    "request",
    "attempts",
    "pending_reason",
    "goodput",
    "kind",
    "calls",
    "last_step",
    "last_heartbeat_at",
)
ATTEMPT_FIELDS = ("index", "slices", "outcome", "started_at", "ended_at", "cause", "acquired_at", "hosts_started_at")


def job_json(info: JobInfo) -> dict[str, Any]:
    """A job as ``fray list/status --json`` print it: :data:`JOB_FIELDS`, times in seconds since the epoch,
    ``outcome``/``finished_at`` null while running. Never the results (``fray status --json --result``)."""
    summary = dict(info.request_summary or {})
    return {
        "job_id": str(info.job_id),
        "name": info.name,
        "status": info.status.value,
        "backend": info.backend,
        "submitted_at": info.submitted_at,
        "finished_at": info.finished_at,
        "progress": info.progress,
        "error": info.error,
        "preemptions": info.preemptions,
        "failures": info.failures,
        "max_retries_preemption": summary.get("max_retries_preemption"),
        "max_retries_failure": summary.get("max_retries_failure"),
        "request": summary,
        "attempts": [
            {
                "index": a.index,
                "slices": list(a.slices),
                "outcome": a.outcome.value if a.outcome else None,
                "started_at": a.started_at,
                "ended_at": a.ended_at,
                "cause": a.cause,
                "acquired_at": a.acquired_at,
                "hosts_started_at": a.hosts_started_at,
            }
            for a in info.attempts
        ],
        "pending_reason": info.pending_reason,
        "goodput": info.goodput.to_json() if info.goodput is not None else None,
        "kind": info.kind,
        "calls": info.calls,
        "last_step": info.last_step,
        "last_heartbeat_at": info.last_heartbeat_at,
    }


def describe_step(info: JobInfo, now: float | None = None) -> str | None:
    """``step 1200, 3s ago`` from the hosts' heartbeats (``fray_core.heartbeat``), else None."""
    if info.last_heartbeat_at is None:
        return None
    ago = age(max(0.0, (time.time() if now is None else now) - info.last_heartbeat_at))
    return f"step {info.last_step}, {ago} ago" if info.last_step is not None else f"heartbeat {ago} ago"


def describe_goodput(info: JobInfo) -> str | None:
    """``80% (productive 80.0s, pending 10.0s, lost 10.0s)`` of a job that ended, else None. A STOPPED job
    was never going to produce its result, so it has no ratio: what it ran and waited is said instead.

    >>> from fray_core.types import Goodput, JobInfo, JobStatus
    >>> describe_goodput(JobInfo(job_id="j", name="j", status=JobStatus.SUCCEEDED, goodput=Goodput(10.0, 80.0, 10.0)))
    '80% (productive 80.0s, pending 10.0s, lost 10.0s)'
    >>> describe_goodput(JobInfo(job_id="j", name="j", status=JobStatus.STOPPED, goodput=Goodput(2.0, 0.0, 8.0)))
    '- (stopped before it finished: ran 8.0s, pending 2.0s)'
    """
    from fray_core.status import JobStatus

    g = info.goodput
    if g is None:
        return None
    if info.status is JobStatus.STOPPED:
        return f"- (stopped before it finished: ran {g.lost_s + g.productive_s:.1f}s, pending {g.pending_s:.1f}s)"
    text = f"{g.ratio:.0%} (productive {g.productive_s:.1f}s, pending {g.pending_s:.1f}s, lost {g.lost_s:.1f}s"
    if g.productive_chip_s or g.lost_chip_s or g.pending_chip_s:
        text += f"; chip-seconds {g.chip_ratio:.0%} useful"
    return text + ")"


def describe_stop(info: JobInfo) -> str | None:
    """Why a job ended STOPPED, for people (the record says ``terminated``); None for any other job."""
    from fray_core.status import JobStatus

    if info.status is not JobStatus.STOPPED:
        return None
    if not info.error or info.error.strip() == "terminated":
        return "on request (fray stop, Cluster.terminate, or a signal to its supervisor)"
    return one_line(info.error)

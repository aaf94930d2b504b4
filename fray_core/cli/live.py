"""Following a job while it runs (``fray launch --wait``, ``fray sim``): the job's output as it comes, a line
per attempt that ended, and its state: redrawn in place on one line on a terminal (``rich``), plain
``[fray] ...`` lines when the output is a pipe or a file."""

from __future__ import annotations

import re
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from fray_core.cli.common import EXIT_INTERRUPTED, exit_code, load_results
from fray_core.cli.output import (
    describe_error,
    describe_goodput,
    duration,
    is_terminal,
    print_attempts,
    print_results,
    print_timeline,
    safe,
)
from fray_core.cluster import MonitorView, describe_attempt, describe_progress

if TYPE_CHECKING:
    from fray_core.cluster import Cluster
    from fray_core.status import Attempt, JobInfo

__all__ = ["LiveView", "PlainView", "follow", "status_line"]

_HOSTS_STARTED = re.compile(r"\b\d+ of \d+ hosts?\b")


def _hosts(info: JobInfo) -> int | None:
    """How many processes the current attempt runs (hosts of every slice it holds, or replicas)."""
    att = info.current_attempt
    summary = info.request_summary or {}
    device = summary.get("device") or {}
    if att is None or not att.slices:
        return None
    if device.get("kind") == "tpu" and device.get("hosts"):
        return int(device["hosts"]) * len(att.slices)
    replicas = summary.get("replicas")
    return replicas if isinstance(replicas, int) else None


def status_line(info: JobInfo, elapsed: float) -> str:
    """The live one-line status: time since the command started following, state, preemptions and
    failures so far against their budgets, then the attempt (and hosts started, when the backend says).

    >>> from fray_core.types import Attempt, JobInfo, JobStatus
    >>> info = JobInfo(job_id="j-1", name="j", status=JobStatus.RUNNING, preemptions=1,
    ...     attempts=[Attempt(1, ["v4-16-0", "v4-16-1"])], progress="attempt 1: running on v4-16-0, v4-16-1",
    ...     request_summary={"device": {"kind": "tpu", "hosts": 2}, "max_retries_preemption": 3})
    >>> status_line(info, 12.34)
    '12.3s | RUNNING | preemptions 1/3, failures 0 | attempt 1: running on v4-16-0, v4-16-1 (4 hosts)'
    """
    summary = info.request_summary or {}

    def budget(used: int, key: str) -> str:
        allowed = summary.get(key)
        return f"{used}/{allowed}" if allowed is not None else str(used)

    parts = [
        duration(elapsed),
        info.status.value,
        f"preemptions {budget(info.preemptions, 'max_retries_preemption')}, "
        f"failures {budget(info.failures, 'max_retries_failure')}",
    ]
    att = info.current_attempt
    what = (
        info.progress
        if info.progress and not info.status.is_terminal()
        else (f"attempt {att.index}" if att is not None else "")
    )
    n = _hosts(info)
    if what and n and not _HOSTS_STARTED.search(what) and not info.status.is_terminal():
        what += f" ({n} host{'s' if n != 1 else ''})"
    if what:
        parts.append(what)
    return safe(" | ".join(parts))


def attempt_line(attempt: Attempt) -> str:
    """:func:`describe_attempt`, escaped, and never ending on a dangling ``last output:``: the output's
    last line follows it."""
    text = describe_attempt(attempt)
    lines = [line.strip() for line in (attempt.cause or "").strip().splitlines() if line.strip()]
    if text.endswith(":") and len(lines) > 1:
        text += f" {lines[-1]}"
    return safe(text)


def progress_line(info: JobInfo) -> str:
    """:func:`describe_progress`, escaped (a job's error is its own bytes), its error on one line."""
    text = describe_progress(info)
    if info.error and info.status.is_terminal() and text.endswith(info.error):
        text = text[: len(text) - len(info.error)] + describe_error(info)
    return safe(text)


class PlainView(MonitorView):
    """Plain lines (a pipe, a file): what :class:`MonitorView` prints, with control characters escaped (the
    final progress line quotes the job's error, its exception's message)."""

    def log(self, line: str) -> None:
        super().log(safe(line, keep_newlines=True))

    def format_attempt(self, attempt: Attempt) -> str:
        return attempt_line(attempt)

    def format_progress(self, info: JobInfo) -> str:
        return progress_line(info)

    def close(self, info: JobInfo | None) -> None:
        """Nothing left to draw: every state change was printed as it came."""


class LiveView(MonitorView):
    """On a terminal: output and ended attempts scroll as lines; the job's state is one line at the
    bottom, redrawn in place about four times a second with the elapsed time."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        super().__init__(out)
        self.console = Console(file=out, highlight=False, soft_wrap=True)
        self.started = time.monotonic()
        self.info: JobInfo | None = None
        self.live = Live(console=self.console, get_renderable=self._render, refresh_per_second=4, transient=True)
        self.live.start()

    def _render(self) -> Any:
        from rich.text import Text

        if self.info is None:
            return Text("[fray] waiting for the job's first record...", style="dim")
        line = "[fray] " + status_line(self.info, time.monotonic() - self.started)
        return Text(line, style="bold", no_wrap=True, overflow="ellipsis")  # always one line

    def log(self, line: str) -> None:
        from rich.text import Text

        self.console.print(Text(safe(line, keep_newlines=True)))

    def attempt_ended(self, attempt: Attempt) -> None:
        from rich.text import Text

        style = {"SUCCEEDED": "green", "PREEMPTED": "yellow", "FAILED": "red"}.get(
            attempt.outcome.value if attempt.outcome else "", ""
        )
        self.console.print(Text(f"[fray] {attempt_line(attempt)}", style=style))

    def progress(self, info: JobInfo) -> None:
        self.info = info

    def close(self, info: JobInfo | None) -> None:
        """Remove the live line; leave the final state as a plain line."""
        self.live.stop()
        if info is not None:
            print(f"[fray] {progress_line(info)}", file=self.out, flush=True)


def follow(cluster: Cluster, job_id: str, out: TextIO, stop_on_interrupt: bool, always_table: bool = False) -> int:
    """Show the job until it ends (output, attempts, live status), then its attempts table, its timeline
    and its results; the exit code of its final status."""
    view: PlainView | LiveView = LiveView(out) if is_terminal(out) else PlainView(out)
    info = None
    try:
        info = cluster.monitor(job_id, view=view)
    except KeyboardInterrupt:
        view.close(None)
        if stop_on_interrupt:
            print(f"\nfray: interrupted; stopping {job_id}", file=sys.stderr)
            cluster.terminate(job_id)
        else:
            print(
                f"\nfray: stopped following {job_id}; it keeps running (fray logs -f {job_id}, fray stop {job_id})",
                file=sys.stderr,
            )
        return EXIT_INTERRUPTED
    except BaseException:
        view.close(None)
        raise
    view.close(info)
    if always_table or len(info.attempts) > 1 or info.status.value != "SUCCEEDED":
        print(file=out)
        print_attempts(info, out)
    print(file=out)
    print_timeline(info, out)
    goodput = describe_goodput(info)
    if goodput:
        print(f"[fray] goodput {goodput}", file=out)
    print_results(load_results(cluster, info), out)  # `launch --wait` and `sim` show results; list and status do not
    return exit_code(info.status)

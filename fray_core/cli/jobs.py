"""``fray list``, ``fray status``, ``fray logs``, ``fray stop``: look at and stop jobs in the job store."""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from fray_core.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    UsageError,
    add_cluster_option,
    at_least_one,
    backend_name,
    cluster_of,
    cluster_of_jobs,
    exit_code,
    load_results,
    positive_int,
)
from fray_core.cli.output import (
    age,
    describe_error,
    describe_goodput,
    describe_resources,
    describe_step,
    describe_stop,
    is_terminal,
    job_json,
    one_line,
    print_attempts,
    print_results,
    print_table,
    print_timeline,
    safe,
    timestamp,
)
from fray_core.status import JobStatus

if TYPE_CHECKING:
    from fray_core.cluster import Cluster
    from fray_core.records import JobStore
    from fray_core.status import JobInfo

__all__ = ["add_parsers", "cmd_list", "cmd_logs", "cmd_prune", "cmd_rm", "cmd_status", "cmd_stop"]


def _statuses(text: str) -> list[str]:
    """``--status running,failed`` -> ``["RUNNING", "FAILED"]``."""
    allowed = [s.value for s in JobStatus]
    wanted = [w.strip().upper() for w in text.split(",") if w.strip()]
    bad = [w for w in wanted if w not in allowed]
    if not wanted or bad:
        raise argparse.ArgumentTypeError(
            f"expected one or more of {', '.join(allowed)} (comma-separated), got {text!r}"
        )
    return wanted


_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _since(text: str) -> float:
    """``--since 30m`` (ago: s, m, h, d, w) or ``--since 2025-01-31`` / ``2025-01-31T12:00`` (local time)
    -> seconds since the epoch."""
    m = _AGO.match(text.strip().lower())
    if m:
        return time.time() - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration ago (30s, 10m, 2h, 1d, 1w) or a date/time (2025-01-31, "
            f"2025-01-31T12:00), got {text!r}"
        ) from None


def select(infos: list[JobInfo], args: argparse.Namespace) -> list[JobInfo]:
    """``fray list`` filters: ``--status`` (any of), ``--name`` (glob), ``--since``, then the ``--limit``
    most recently submitted, oldest first."""
    out = sorted(infos, key=lambda i: i.submitted_at)
    if args.status:
        wanted = {s for group in args.status for s in group}
        out = [i for i in out if i.status.value in wanted]
    if args.name is not None:
        out = [i for i in out if fnmatch.fnmatchcase(i.name, args.name)]
    if args.since is not None:
        out = [i for i in out if i.submitted_at >= args.since]
    if args.limit is not None:
        out = out[-args.limit :]
    return out


def list_rows(
    infos: list[JobInfo], wide: bool, compact: bool = False, now: float | None = None
) -> tuple[list[str], list[list[Any]], int]:
    """``fray list``'s headers, rows and the column that may wrap (STATUS, with a pending job's reason).
    ``wide`` adds GOODPUT and SUBMITTED; ``compact`` (a terminal, without ``--wide``) leaves out KIND and
    CALLS and says ``session, N calls`` in STATUS instead, so that every other column fits in 80."""
    now = time.time() if now is None else now
    headers = ["ID", "NAME", "KIND", "STATUS", "ATTEMPTS", "CALLS", "PREEMPT/FAIL", "AGE"]
    if wide:
        headers += ["GOODPUT", "SUBMITTED"]
    elif compact:
        headers = ["ID", "NAME", "STATUS", "ATTEMPTS", "PREEMPT/FAIL", "AGE"]
    rows: list[list[Any]] = []
    for i in infos:
        status = i.status.value
        notes = [f"session, {i.calls} call(s)"] if compact and not wide and i.kind == "session" else []
        if i.pending_reason and not i.status.is_terminal():
            notes.append(i.pending_reason)
        if notes:
            status += f" ({'; '.join(notes)})"
        cells = {
            "ID": i.job_id,
            "NAME": i.name,
            "KIND": i.kind,
            "STATUS": status,
            "ATTEMPTS": len(i.attempts),
            "CALLS": i.calls if i.kind == "session" else "-",
            "PREEMPT/FAIL": f"{i.preemptions}/{i.failures}",
            "AGE": age(now - i.submitted_at),
        }
        if wide:
            cells["GOODPUT"] = (describe_goodput(i) or "-").split(" ", 1)[0]
            cells["SUBMITTED"] = timestamp(i.submitted_at)
        rows.append([cells[h] for h in headers])
    return headers, rows, headers.index("STATUS")


def _list_text(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> bool:
    """The table of ``fray list`` on ``out``; False when no job matched (nothing printed)."""
    infos = select(cluster.list_jobs(), args)
    if not infos:
        return False
    headers, rows, wrap = list_rows(infos, args.wide, compact=is_terminal(sys.stdout))
    print_table(headers, rows, out, wrap=None if args.wide else wrap)
    return True


def cmd_list(args: argparse.Namespace) -> int:
    """``fray list [--json] [--status S] [--name GLOB] [--since WHEN] [--limit N] [--wide] [-w]``: jobs, oldest
    first (KIND: ``job``, or ``session`` for a held session, with its CALLS so far)."""
    cluster = cluster_of(args)
    if args.watch:
        return watch(lambda out: _list_text(cluster, args, out) or print("(no jobs)", file=out), args.interval)
    infos = select(cluster.list_jobs(), args)
    if args.json:
        print(json.dumps([job_json(i) for i in infos], indent=1))
        return EXIT_OK
    if not infos:
        root = getattr(getattr(cluster, "store", None), "root", "the job store")
        filtered = any(v is not None for v in (args.status, args.name, args.since, args.limit))
        print(f"fray: no jobs {'match the filters ' if filtered else ''}under {safe(str(root))}", file=sys.stderr)
        return EXIT_OK
    headers, rows, wrap = list_rows(infos, args.wide, compact=is_terminal(sys.stdout))
    print_table(headers, rows, sys.stdout, wrap=None if args.wide else wrap)
    return EXIT_OK


def watch(render: Callable[[TextIO], Any], interval: float, done: Callable[[], bool] | None = None) -> int:
    """Show ``render(out)`` again every ``interval`` seconds until Ctrl-C (exit 130) or ``done()``: redrawn in
    place on a terminal (rich), else printed again, after a blank line, each time it changed."""
    import io

    out = sys.stdout
    live = None
    if is_terminal(out):
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        live = Live(console=Console(file=out, highlight=False), auto_refresh=False, transient=False)
        live.start()
    last = None
    try:
        while True:
            finished = done() if done is not None else False
            buf = io.StringIO()
            render(buf)
            text = buf.getvalue()
            if live is not None:  # the last frame stays on screen: it says what is, not to press Ctrl-C
                stamp = "" if finished else f"\n\nevery {interval:g}s, {timestamp(time.time())} (Ctrl-C to stop)"
                live.update(Text(text.rstrip("\n") + stamp), refresh=True)
            elif text != last:
                print(("\n" if last is not None else "") + text.rstrip("\n"), flush=True)
            last = text
            if finished:
                return EXIT_OK
            time.sleep(interval)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        if live is not None:
            live.stop()


def cmd_status(args: argparse.Namespace) -> int:
    """``fray status ID [--json] [--result] [-w]``: the job, its attempts and their timeline."""
    cluster = cluster_of_jobs(args, [args.job_id])
    info = cluster.poll(args.job_id)
    if args.watch:
        state: dict[str, Any] = {"info": info}

        def ended() -> bool:
            state["info"] = cluster.poll(args.job_id)
            return state["info"].status.is_terminal()

        code = watch(lambda out: print_status(state["info"], out), args.interval, done=ended)
        return code if code != EXIT_OK else exit_code(state["info"].status)
    results = load_results(cluster, info) if args.result else None
    if args.json:
        record = job_json(info)
        if args.result:
            record["result"] = results
        print(json.dumps(record, indent=1, default=repr))
        return EXIT_OK
    print_status(info, sys.stdout)
    if args.result:
        if info.status is JobStatus.SUCCEEDED:
            print()
            print_results(results, sys.stdout)
        else:
            print(f"fray: no results: the job is {info.status.value}", file=sys.stderr)
    return EXIT_OK


def print_status(info: JobInfo, out: TextIO) -> None:
    """``fray status ID``'s fields, attempts table and timeline on ``out``."""
    s = info.request_summary
    status = info.status.value
    if info.progress and not info.status.is_terminal():
        status += f" ({info.progress})"
    fields = [
        ("job", info.job_id),
        ("name", info.name),
        ("status", status),
        ("backend", info.backend),
    ]
    if info.kind == "session":
        fields.insert(2, ("kind", f"session (held slices), {info.calls} call(s) so far"))
    if s:
        fields += [
            ("entrypoint", s.get("entrypoint", "-")),
            ("resources", describe_resources(s)),
            (
                "retries",
                f"preemptions {info.preemptions} of {s.get('max_retries_preemption')} allowed, "
                f"failures {info.failures} of {s.get('max_retries_failure')} allowed",
            ),
        ]
    else:
        fields.append(("retries", f"preemptions {info.preemptions}, failures {info.failures}"))
    ago = f" ({age(time.time() - info.submitted_at)} ago)" if info.submitted_at else ""
    fields.append(("submitted", timestamp(info.submitted_at) + ago))
    if info.finished_at:
        fields.append(("finished", timestamp(info.finished_at)))
    if info.pending_reason and not info.status.is_terminal():
        fields.append(("pending", info.pending_reason))
    if (step := describe_step(info)) is not None:
        fields.append(("last step", step))
    stopped = describe_stop(info)
    if stopped:
        fields.append(("stopped", stopped))
    elif info.error:
        fields.append(("error", describe_error(info)))
    goodput = describe_goodput(info)
    if goodput:
        fields.append(("goodput", goodput))
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        print(f"{k.ljust(width)}  {safe(str(v))}", file=out)
    if info.attempts:
        print(file=out)
        print_attempts(info, out)
        print(file=out)
        print_timeline(info, out)


_TAG = re.compile(rb"^\[a(\d+) (?:s(\d+)/h(\d+)|r(\d+))\]")


def _host_arg(text: str) -> tuple[int, int] | int:
    """``--host 1/0`` (slice 1, host 0 of a TPU job) or ``--host r2`` / ``--host 2`` (replica 2 of a CPU/GPU job)."""
    t = text.strip().lower()
    s_, slash, h = t.partition("/")
    try:
        if slash:
            return int(s_.lstrip("s")), int(h.lstrip("h"))
        return int(t.lstrip("r"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected SLICE/HOST (e.g. 1/0) or a replica (r2 or 2), got {text!r}"
        ) from None


def log_filter(host: tuple[int, int] | int | None, attempt: int | None) -> Any:
    """``keep(first_bytes)`` for log lines of one host and/or attempt (by their ``[a0 s1/h0]`` tag), or None.

    >>> keep = log_filter((1, 0), None)
    >>> keep(b"[a0 s1/h0] step 1"), keep(b"[a0 s0/h0] step 1"), keep(b"[fray] note")
    (True, False, False)
    >>> log_filter(2, 1)(b"[a1 r2] hi")
    True
    """
    if host is None and attempt is None:
        return None

    def keep(head: bytes) -> bool:
        m = _TAG.match(head)
        if m is None:
            return False
        if attempt is not None and int(m.group(1)) != attempt:
            return False
        if isinstance(host, tuple):
            return m.group(2) is not None and (int(m.group(2)), int(m.group(3))) == host
        if host is not None:
            return m.group(4) is not None and int(m.group(4)) == host
        return True

    return keep


def check_log_selection(info: JobInfo, host: tuple[int, int] | int | None, attempt: int | None) -> None:
    """Refuse (:class:`UsageError`) a ``--host`` of the wrong form for the job (``SLICE/HOST`` for a TPU job,
    a replica for a CPU/GPU job) or beyond its shape, and an ``--attempt`` a finished job never had: else
    the log is empty and says nothing of why.

    >>> from fray_core.status import JobInfo, JobStatus
    >>> tpu = JobInfo(job_id="j", name="j", status=JobStatus.RUNNING,
    ...               request_summary={"device": {"kind": "tpu", "hosts": 2}, "replicas": 2})
    >>> check_log_selection(tpu, (1, 1), None)
    >>> check_log_selection(tpu, (2, 0), None)
    Traceback (most recent call last):
    ...
    fray_core.cli.common.UsageError: --host 2/0: job j has slices 0-1 of 2 hosts each (0/0 to 1/1)
    """
    summary = info.request_summary or {}
    device = summary.get("device") or {}
    job = safe(info.job_id)
    replicas = summary.get("replicas")
    most = max(replicas) if isinstance(replicas, list) and replicas else replicas
    if host is not None and isinstance(most, int) and most > 0:
        if device.get("kind") == "tpu":
            per = device.get("hosts")
            if not isinstance(host, tuple):
                raise UsageError(f"--host r{host}: job {job} is a TPU job; give SLICE/HOST (e.g. 0/0)")
            if isinstance(per, int) and per > 0 and not (0 <= host[0] < most and 0 <= host[1] < per):
                raise UsageError(
                    f"--host {host[0]}/{host[1]}: job {job} has slices 0-{most - 1} of {per} hosts each "
                    f"(0/0 to {most - 1}/{per - 1})"
                )
        elif isinstance(host, tuple):
            raise UsageError(
                f"--host {host[0]}/{host[1]}: job {job} runs replicas, not TPU slices; give a replica "
                f"(r0 to r{most - 1})"
            )
        elif not 0 <= host < most:
            raise UsageError(f"--host r{host}: job {job} has replicas r0 to r{most - 1}")
    if attempt is not None and info.status.is_terminal() and not 0 <= attempt < len(info.attempts):
        n = len(info.attempts)
        had = "no attempt" if n == 0 else "attempt 0 only" if n == 1 else f"attempts 0-{n - 1}"
        raise UsageError(f"--attempt {attempt}: job {job} ended with {had}")


def cmd_logs(args: argparse.Namespace) -> int:
    """``fray logs ID [-f] [--tail N] [--host S/H] [--attempt N]``: the job's output, one line per host line,
    tagged ``[a<attempt> s<slice>/h<host>]``; read in pieces, so a log of any size costs the same memory."""
    from fray_core.records import JobStore, stream_log

    cluster = cluster_of_jobs(args, [args.job_id])
    info = cluster.poll(args.job_id)  # an unknown id is an error, not an empty log
    check_log_selection(info, args.host, args.attempt)  # so is a host or attempt the job does not have
    keep = log_filter(args.host, args.attempt)
    store = getattr(cluster, "store", None)
    if isinstance(store, JobStore):
        lines: Any = stream_log(
            store,
            str(args.job_id),
            follow=args.follow,
            tail=args.tail,
            keep=keep,
            is_done=lambda: cluster.poll(args.job_id).status.is_terminal(),
        )
    else:  # a backend without a job store: its own lines, cut here (the tail held as N lines)
        lines = _cut(cluster.logs(args.job_id, follow=args.follow), keep, args.tail, args.follow)
    try:
        for line in lines:
            print(safe(line, keep_newlines=True), flush=args.follow)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        close = getattr(lines, "close", None)
        if close is not None:
            close()
    if args.follow:
        return exit_code(cluster.poll(args.job_id).status)
    return EXIT_OK


def _cut(lines: Any, keep: Any, tail: int | None, follow: bool) -> Any:
    import collections

    kept = (line for line in lines if keep is None or keep(line[:64].encode("utf-8", "replace")))
    if tail is None or follow:
        yield from kept
        return
    yield from collections.deque(kept, maxlen=tail)


def _live(info: JobInfo) -> bool:
    """The job has not ended (a record that cannot be read, UNKNOWN, is neither live nor ended)."""
    return not info.status.is_terminal() and info.status is not JobStatus.UNKNOWN


def _ended(info: JobInfo) -> bool:
    return info.status.is_terminal()


def _matching(cluster: Cluster, args: argparse.Namespace, keep: Callable[[JobInfo], bool]) -> list[JobInfo]:
    """Every job the ``--status``/``--name``/``--since`` filters keep that ``keep`` accepts (``stop``/``rm``
    with ``--all``, ``prune``): no ``--limit``, a command acts on every match."""
    args.limit = None
    return [i for i in select(cluster.list_jobs(), args) if keep(i)]


def _chosen(cluster: Cluster, args: argparse.Namespace, what: str, keep: Callable[[JobInfo], bool]) -> list[JobInfo]:
    """The jobs a ``stop``/``rm`` names: its IDs, or with ``--all`` every job that the filters and ``keep``
    keep."""
    if args.all and args.job_ids:
        raise UsageError("give job ids or --all (with filters), not both")
    if not args.all and not args.job_ids:
        raise UsageError(f"the following arguments are required: ID (or --all to {what} every job the filters keep)")
    if not args.all and any(v is not None for v in (args.status, args.name, args.since)):
        raise UsageError("--status, --name and --since choose jobs with --all; with job ids they are not used")
    if args.all:
        return _matching(cluster, args, keep)
    return [_poll_or_unknown(cluster, job_id) for job_id in dict.fromkeys(args.job_ids)]


def _store_of(cluster: Cluster, what: str) -> JobStore:
    """The cluster's job store (``rm``/``prune`` delete from it), else a usage error naming the backend."""
    from fray_core.records import JobStore

    store = getattr(cluster, "store", None)
    if not isinstance(store, JobStore):
        raise UsageError(f"the {backend_name(cluster)!r} backend has no job store to {what}")
    return store


def _poll_or_unknown(cluster: Cluster, job_id: str) -> JobInfo:
    """The job, or an UNKNOWN entry for one whose record cannot be read (so ``fray rm`` can clear it)."""
    from fray_core.errors import RecordError
    from fray_core.status import JobId, JobInfo

    try:
        return cluster.poll(job_id)
    except RecordError as e:
        return JobInfo(job_id=JobId(job_id), name="?", status=JobStatus.UNKNOWN, error=str(e))


def _confirm(args: argparse.Namespace, verb: str, infos: list[JobInfo]) -> bool:
    """``--all`` touches many jobs at once: ``-y``, else a yes on a terminal; never a silent mass change."""
    if args.yes or not args.all:
        return True
    names = ", ".join(i.job_id for i in infos[:5]) + (f" and {len(infos) - 5} more" if len(infos) > 5 else "")
    if not (is_terminal(sys.stdin) if hasattr(sys.stdin, "isatty") else False):
        raise UsageError(f"refusing to {verb} {len(infos)} job(s) ({safe(names)}) without -y (stdin is not a terminal)")
    answer = input(f"{verb} {len(infos)} job(s): {safe(names)}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def cmd_stop(args: argparse.Namespace) -> int:
    """``fray stop ID... | --all [--status S] [--name GLOB] [--since WHEN] [-y]``: stop every host, release every
    slice; each job ends STOPPED. A supervisor that does not answer within ``--timeout`` is exit code 4."""
    cluster = cluster_of_jobs(args, args.job_ids or [])
    infos = _chosen(cluster, args, "stop", _live)
    running = [i for i in infos if _live(i)]
    for info in infos:
        if info.status.is_terminal() and not args.all:
            print(f"{safe(info.job_id)}: already ended {info.status.value}")
    if args.all and not running:
        print("fray: no running or pending job matches", file=sys.stderr)
        return EXIT_OK
    if not _confirm(args, "stop", running):
        print("fray: nothing stopped", file=sys.stderr)
        return EXIT_OK
    backend = backend_name(cluster)
    code = EXIT_OK
    for info in running:
        if info.backend != backend:
            raise UsageError(f"job {info.job_id} runs on the {info.backend!r} backend; pass --cluster {info.backend}")
        problem = _terminate(cluster, info.job_id, args.timeout)
        if problem:
            print(f"fray stop: error: {safe(problem)}", file=sys.stderr)
            code = EXIT_TIMEOUT
            continue
        print(f"{safe(info.job_id)}: {cluster.poll(info.job_id).status.value}")
    return code


def _terminate(cluster: Cluster, job_id: str, timeout: float) -> str | None:
    """``cluster.terminate(job_id)`` with a deadline; what went wrong when the job did not stop in time.

    The wait runs in a daemon thread: a supervisor that is frozen (SIGSTOP, a hung disk) cannot hold the
    command past ``timeout``. The stop request stays written, so the job still stops if its supervisor wakes.
    """
    import threading

    from fray_core.errors import JobNotFoundError, RecordError

    outcome: dict[str, BaseException | None] = {}

    def run() -> None:
        try:
            cluster.terminate(job_id)
            outcome["error"] = None
        except BaseException as e:  # reported below, in the command's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True, name=f"fray-stop-{job_id}")
    thread.start()
    thread.join(timeout)
    if "error" not in outcome:
        return (
            f"job {job_id} did not stop within {timeout:g} s: its supervisor does not answer (frozen or "
            f"overloaded); the stop request stays, so it stops if the supervisor resumes (fray status {job_id})"
        )
    error = outcome["error"]
    if isinstance(error, (JobNotFoundError, RecordError)):
        raise error
    if error is not None:
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise error
        return f"job {job_id}: {one_line(str(error))}"
    return None


def cmd_rm(args: argparse.Namespace) -> int:
    """``fray rm ID... | --all [filters] [-y]``: delete ended jobs' records, logs and results. A job that has
    not ended is refused (stop it first); ``--all`` only ever picks ended jobs."""
    from fray_core.records import delete_job

    cluster = cluster_of(args)
    store = _store_of(cluster, "remove records from")
    infos = _chosen(cluster, args, "remove", _ended)
    if not args.all:
        live = [i for i in infos if _live(i)]
        if live:
            raise UsageError(
                f"job {live[0].job_id} is {live[0].status.value}: only a job that ended can be removed "
                f"(fray stop {live[0].job_id} first)"
            )
    if not infos:
        print("fray: no ended job matches", file=sys.stderr)
        return EXIT_OK
    if not _confirm(args, "remove", infos):
        print("fray: nothing removed", file=sys.stderr)
        return EXIT_OK
    for info in infos:
        delete_job(store, str(info.job_id))
        print(f"removed {safe(info.job_id)}")
    return EXIT_OK


def _older_than(text: str) -> float:
    """``--older-than 7d`` -> seconds (s, m, h, d, w)."""
    m = _AGO.match(text.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"expected a duration (30m, 12h, 7d, 2w), got {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2)]


def cmd_prune(args: argparse.Namespace) -> int:
    """``fray prune --older-than 7d [--status S] [--name GLOB] [--dry-run]``: delete jobs that ended more than
    that long ago. Never a job that has not ended."""
    from fray_core.records import delete_job

    cluster = cluster_of(args)
    store = _store_of(cluster, "prune")
    args.since = None
    cutoff = time.time() - args.older_than

    def ended_long_ago(info: JobInfo) -> bool:
        when = info.finished_at or info.submitted_at
        return _ended(info) and bool(when) and when < cutoff

    old = _matching(cluster, args, ended_long_ago)
    for info in old:
        if not args.dry_run:
            delete_job(store, str(info.job_id))
        print(
            f"{'would remove' if args.dry_run else 'removed'} {safe(info.job_id)} ({info.status.value}, "
            f"ended {age(time.time() - (info.finished_at or info.submitted_at))} ago)"
        )
    if not old:
        print("fray: no ended job is that old", file=sys.stderr)
    return EXIT_OK


def _wide(text: str) -> bool:
    if text != "wide":
        raise argparse.ArgumentTypeError(f"expected wide, got {text!r}")
    return True


def _add_watch(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("-w", "--watch", action="store_true", help=f"{what} every --interval seconds (Ctrl-C to stop)")
    p.add_argument(
        "--interval", metavar="S", type=_interval, default=2.0, help="seconds between redraws with -w (default 2)"
    )


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds between 0.1 and 3600, got {text!r}")
    return value


def add_parsers(sub: Any, fmt: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "list",
        help="list jobs",
        description="Jobs in the job store, oldest first. Never loads a job's results.",
        epilog="examples:\n  fray list --status running,pending\n  fray list --name 'train*' --since 2h --limit 5\n"
        "  fray list --json | jq -r '.[].job_id'",
        formatter_class=fmt,
    )
    p.add_argument("--json", action="store_true", help="a JSON array of jobs (fields: see docs/index.md)")
    p.add_argument(
        "--status",
        metavar="S[,S]",
        type=_statuses,
        action="append",
        help="only jobs in these states (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED; any case; repeatable)",
    )
    p.add_argument("--name", metavar="GLOB", help="only jobs whose name matches, e.g. 'train*'")
    p.add_argument(
        "--since", metavar="WHEN", type=_since, help="only jobs submitted since: 30m, 2h, 1d ago, or 2025-01-31[T12:00]"
    )
    p.add_argument(
        "--limit", metavar="N", type=at_least_one, help="only the N most recently submitted (after the filters)"
    )
    p.add_argument(
        "--wide",
        "-o",
        nargs="?",
        const=True,
        type=_wide,
        default=False,
        metavar="wide",
        help="every column (adds GOODPUT and SUBMITTED), never fitted to the terminal (also: -o wide)",
    )
    _add_watch(p, "redraw the list")
    add_cluster_option(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "status",
        help="a job, its attempts and their timeline",
        description="A job, its budgets, its attempts and their timeline (one row per slice). Loads the "
        "job's results only with --result.",
    )
    p.add_argument("job_id", metavar="ID")
    p.add_argument("--json", action="store_true", help="the job as JSON (fields: see docs/index.md)")
    p.add_argument("--result", action="store_true", help="also show the results of a SUCCEEDED job (unpickles them)")
    _add_watch(p, "redraw until the job ends, then exit with its status")
    add_cluster_option(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "logs",
        help="a job's output, tagged with attempt/slice/host",
        description="A job's output; every line is tagged [a<attempt> s<slice>/h<host>] (TPU) or "
        "[a<attempt> r<replica>] (CPU/GPU). With -f, follow until the job ends and exit with its status. "
        "The log is read in pieces: any size costs the same memory.",
        epilog="examples:\n  fray logs ID --tail 50\n  fray logs ID -f --host 1/0\n  fray logs ID --attempt 2 "
        "--host r0",
        formatter_class=fmt,
    )
    p.add_argument("job_id", metavar="ID")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    p.add_argument(
        "-n",
        "--tail",
        metavar="N",
        type=positive_int,
        help="only the last N lines (of those the filters keep), then follow with -f",
    )
    p.add_argument("--host", metavar="S/H|rN", type=_host_arg, help="only slice S host H (TPU), or replica N (CPU/GPU)")
    p.add_argument("--attempt", metavar="N", type=positive_int, help="only attempt N's lines")
    add_cluster_option(p)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser(
        "stop",
        help="stop jobs",
        description="Stop every host of the jobs and release their slices; they end STOPPED.",
        epilog="examples:\n  fray stop ID\n  fray stop ID1 ID2\n  fray stop --all --name 'sweep-*' -y",
        formatter_class=fmt,
    )
    _add_selection(p, "stop")
    p.add_argument(
        "--timeout",
        metavar="S",
        type=_interval,
        default=60.0,
        help="seconds to wait for each job to stop (default 60); past it: exit code 4",
    )
    add_cluster_option(p)
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser(
        "rm",
        help="delete ended jobs' records and logs",
        description="Delete the records, logs and results of jobs that ended. A job that has not ended is refused.",
        epilog="examples:\n  fray rm ID\n  fray rm --all --status failed -y",
        formatter_class=fmt,
    )
    _add_selection(p, "remove")
    add_cluster_option(p)
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser(
        "prune",
        help="delete jobs that ended long ago",
        description="Delete the records, logs and results of jobs that ended more than --older-than ago. Never a "
        "job that has not ended.",
        epilog="examples:\n  fray prune --older-than 7d\n  fray prune --older-than 12h --status failed --dry-run",
        formatter_class=fmt,
    )
    p.add_argument("--older-than", metavar="AGE", type=_older_than, required=True, help="30m, 12h, 7d, 2w")
    p.add_argument(
        "--status", metavar="S[,S]", type=_statuses, action="append", help="only jobs that ended in these states"
    )
    p.add_argument("--name", metavar="GLOB", help="only jobs whose name matches")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    add_cluster_option(p)
    p.set_defaults(func=cmd_prune)


def _add_selection(p: argparse.ArgumentParser, verb: str) -> None:
    p.add_argument("job_ids", metavar="ID", nargs="*", help=f"the jobs to {verb}")
    p.add_argument("--all", action="store_true", help=f"{verb} every job the filters keep (asks, unless -y)")
    p.add_argument(
        "--status", metavar="S[,S]", type=_statuses, action="append", help="with --all: only jobs in these states"
    )
    p.add_argument("--name", metavar="GLOB", help="with --all: only jobs whose name matches")
    p.add_argument("--since", metavar="WHEN", type=_since, help="with --all: only jobs submitted since")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask")

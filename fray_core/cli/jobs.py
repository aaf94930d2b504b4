"""``fray list``, ``fray status``, ``fray logs``, ``fray stop``: look at and stop jobs in the job store."""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from fray_core.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    UsageError,
    add_cluster_option,
    backend_name,
    cluster_of,
    at_least_one,
    exit_code,
    load_results,
)
from fray_core.cli.output import (
    age,
    describe_goodput,
    describe_resources,
    describe_step,
    job_json,
    print_attempts,
    print_results,
    print_table,
    print_timeline,
    safe,
    timestamp,
)
from fray_core.types import JobStatus

if TYPE_CHECKING:
    from fray_core.types import JobInfo

__all__ = ["add_parsers", "cmd_list", "cmd_logs", "cmd_status", "cmd_stop"]


def _statuses(text: str) -> list[str]:
    """``--status running,failed`` -> ``["RUNNING", "FAILED"]``."""
    allowed = [s.value for s in JobStatus]
    wanted = [w.strip().upper() for w in text.split(",") if w.strip()]
    bad = [w for w in wanted if w not in allowed]
    if not wanted or bad:
        raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(allowed)} (comma-separated), got {text!r}")
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
            f"expected a duration ago (30s, 10m, 2h, 1d, 1w) or a date/time (2025-01-31, 2025-01-31T12:00), got {text!r}"
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
        out = out[-args.limit:]
    return out


def cmd_list(args: argparse.Namespace) -> int:
    """``fray list [--json] [--status S] [--name GLOB] [--since WHEN] [--limit N]``: jobs, oldest first (KIND:
    ``job``, or ``session`` for a held session, with its CALLS so far)."""
    cluster = cluster_of(args)
    infos = select(cluster.list_jobs(), args)
    if args.json:
        print(json.dumps([job_json(i) for i in infos], indent=1))
        return EXIT_OK
    if not infos:
        root = getattr(getattr(cluster, "store", None), "root", "the job store")
        filtered = any(v is not None for v in (args.status, args.name, args.since, args.limit))
        print(f"fray: no jobs {'match the filters ' if filtered else ''}under {safe(str(root))}", file=sys.stderr)
        return EXIT_OK
    now = time.time()
    rows = [
        [
            i.job_id,
            i.name,
            i.kind,
            i.status.value + (f" ({i.pending_reason})" if i.pending_reason and not i.status.is_terminal() else ""),
            len(i.attempts),
            i.calls if i.kind == "session" else "-",
            f"{i.preemptions}/{i.failures}",
            age(now - i.submitted_at),
        ]
        for i in infos
    ]
    print_table(["ID", "NAME", "KIND", "STATUS", "ATTEMPTS", "CALLS", "PREEMPT/FAIL", "AGE"], rows, sys.stdout)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """``fray status ID [--json] [--result]``: the job, its attempts and their timeline."""
    cluster = cluster_of(args)
    info = cluster.poll(args.job_id)
    results = load_results(cluster, info) if args.result else None
    if args.json:
        record = job_json(info)
        if args.result:
            record["result"] = results
        print(json.dumps(record, indent=1, default=repr))
        return EXIT_OK
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
    if info.error:
        fields.append(("error", info.error))
    goodput = describe_goodput(info)
    if goodput:
        fields.append(("goodput", goodput))
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        print(f"{k.ljust(width)}  {safe(str(v))}")
    if info.attempts:
        print()
        print_attempts(info, sys.stdout)
        print()
        print_timeline(info, sys.stdout)
    if args.result:
        if info.status is JobStatus.SUCCEEDED:
            print()
            print_results(results, sys.stdout)
        else:
            print(f"fray: no results: the job is {info.status.value}", file=sys.stderr)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """``fray logs ID [-f]``: the job's output, one line per host line, tagged ``[a<attempt> s<slice>/h<host>]``."""
    cluster = cluster_of(args)
    try:
        for line in cluster.logs(args.job_id, follow=args.follow):
            print(safe(line, keep_newlines=True), flush=args.follow)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if args.follow:
        return exit_code(cluster.poll(args.job_id).status)
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """``fray stop ID``: stop every host, release every slice; the job ends STOPPED."""
    cluster = cluster_of(args)
    info = cluster.poll(args.job_id)
    if info.status.is_terminal():
        print(f"{info.job_id}: already ended {info.status.value}")
        return EXIT_OK
    backend = backend_name(cluster)
    if info.backend != backend:
        raise UsageError(f"job {info.job_id} runs on the {info.backend!r} backend; pass --cluster {info.backend}")
    cluster.terminate(args.job_id)
    info = cluster.poll(args.job_id)
    print(f"{info.job_id}: {info.status.value}")
    return EXIT_OK


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
        "--status", metavar="S[,S]", type=_statuses, action="append",
        help="only jobs in these states (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED; any case; repeatable)",
    )
    p.add_argument("--name", metavar="GLOB", help="only jobs whose name matches, e.g. 'train*'")
    p.add_argument("--since", metavar="WHEN", type=_since, help="only jobs submitted since: 30m, 2h, 1d ago, or 2025-01-31[T12:00]")
    p.add_argument("--limit", metavar="N", type=at_least_one, help="only the N most recently submitted (after the filters)")
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
    add_cluster_option(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "logs",
        help="a job's output, tagged with attempt/slice/host",
        description="A job's output; every line is tagged [a<attempt> s<slice>/h<host>] (TPU) or "
        "[a<attempt> r<replica>] (CPU/GPU). With -f, follow until the job ends and exit with its status.",
    )
    p.add_argument("job_id", metavar="ID")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    add_cluster_option(p)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("stop", help="stop a job", description="Stop every host of the job and release its slices.")
    p.add_argument("job_id", metavar="ID")
    add_cluster_option(p)
    p.set_defaults(func=cmd_stop)

"""``fray list``, ``fray status``, ``fray logs``, ``fray stop``: look at and stop jobs in the job store."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from fray_core.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    UsageError,
    add_cluster_option,
    backend_name,
    cluster_of,
    exit_code,
)
from fray_core.cli.output import age, describe_resources, format_table, print_attempts, timestamp

__all__ = ["add_parsers", "cmd_list", "cmd_logs", "cmd_status", "cmd_stop"]


def cmd_list(args: argparse.Namespace) -> int:
    """``fray list [--json]``: every job in the store, oldest first."""
    cluster = cluster_of(args)
    infos = cluster.list_jobs()
    if args.json:
        print(json.dumps([i.to_json() for i in infos], indent=1))
        return EXIT_OK
    if not infos:
        root = getattr(getattr(cluster, "store", None), "root", "the job store")
        print(f"fray: no jobs under {root}", file=sys.stderr)
        return EXIT_OK
    now = time.time()
    rows = [
        [i.job_id, i.name, i.status.value, len(i.attempts), f"{i.preemptions}/{i.failures}", age(now - i.submitted_at)]
        for i in infos
    ]
    print(format_table(["ID", "NAME", "STATUS", "ATTEMPTS", "PREEMPT/FAIL", "AGE"], rows))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """``fray status ID [--json]``: the job and its attempts."""
    cluster = cluster_of(args)
    info = cluster.poll(args.job_id)
    if args.json:
        record = info.to_json()
        record["result"] = info.result
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
    if info.error:
        fields.append(("error", info.error))
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        print(f"{k.ljust(width)}  {v}")
    if info.attempts:
        print()
        print_attempts(info, sys.stdout)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """``fray logs ID [-f]``: the job's output, one line per host line, tagged ``[a<attempt> s<slice>/h<host>]``."""
    cluster = cluster_of(args)
    try:
        for line in cluster.logs(args.job_id, follow=args.follow):
            print(line, flush=args.follow)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `fray logs ID | head`
        sys.stdout = open(os.devnull, "w")
        return EXIT_OK
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
    p = sub.add_parser("list", help="list jobs", description="Every job in the job store, oldest first.")
    p.add_argument("--json", action="store_true", help="JSON records instead of a table")
    add_cluster_option(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("status", help="a job and its attempts", description="A job, its budgets and its attempts.")
    p.add_argument("job_id", metavar="ID")
    p.add_argument("--json", action="store_true", help="the JSON record (with the results when it succeeded)")
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

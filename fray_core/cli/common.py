"""What every ``fray`` command shares: exit codes, :class:`UsageError`, argument types, the cluster of a
command. Backend-neutral: a cluster comes from its spec through the backend registry."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fray_core.cluster import Cluster
    from fray_core.types import JobInfo, JobStatus

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STOPPED",
    "EXIT_USAGE",
    "UsageError",
    "add_cluster_option",
    "backend_name",
    "cluster_of",
    "exit_code",
    "load_results",
    "positive_int",
    "tpu_type",
]

EXIT_OK = 0  # success (and, for commands that wait, a job that SUCCEEDED)
EXIT_FAILED = 1  # a job that ended FAILED
EXIT_USAGE = 2  # bad arguments, invalid request, unknown job id, unknown cluster spec
EXIT_STOPPED = 3  # a job that ended STOPPED
EXIT_INTERRUPTED = 130  # Ctrl-C


class UsageError(Exception):
    """A mistake in what the user asked for: reported as one line on stderr, exit code 2."""


def exit_code(status: JobStatus) -> int:
    """The exit code of a command that waited for a job that ended with ``status``."""
    from fray_core.types import JobStatus

    return {JobStatus.SUCCEEDED: EXIT_OK, JobStatus.FAILED: EXIT_FAILED, JobStatus.STOPPED: EXIT_STOPPED}.get(
        status, EXIT_OK
    )


def cluster_of(args: argparse.Namespace) -> Cluster:
    """``--cluster SPEC``, else ``current_cluster()`` (``$FRAY_CLUSTER_SPEC``, else local)."""
    from fray_core.cluster import cluster_from_spec, current_cluster

    return cluster_from_spec(args.cluster) if args.cluster else current_cluster()


def load_results(cluster: Cluster, info: JobInfo) -> list[Any] | None:
    """A SUCCEEDED job's results, loaded (unpickled) only when a command is asked to show them."""
    if info.status.value != "SUCCEEDED":
        return None
    loader = getattr(cluster, "result", None)  # backends that load results lazily
    if callable(loader):
        return loader(info.job_id)
    # Backends that load results eagerly may write the result file just after the record says SUCCEEDED:
    # give it a moment (bounded) rather than report no results.
    deadline = time.monotonic() + RESULT_GRACE
    while True:
        results = cluster.poll(info.job_id).result
        if results is not None or time.monotonic() >= deadline:
            return results
        time.sleep(0.05)


#: seconds ``load_results`` waits for a SUCCEEDED job's results to appear
RESULT_GRACE = 5.0


def backend_name(cluster: Cluster) -> str:
    from fray_core.cluster import parse_spec

    return parse_spec(cluster.spec or "local")[0]


def add_cluster_option(p: argparse.ArgumentParser, top: bool = False) -> None:
    """``--cluster SPEC``, accepted before or after the command."""
    # SUPPRESS keeps a subcommand from resetting the top-level value
    p.add_argument(
        "--cluster",
        metavar="SPEC",
        default=None if top else argparse.SUPPRESS,
        help="local, local?tpu=v4-16:2, local?jobs_dir=DIR, ray, ray?address=...&namespace=... "
        "(default: $FRAY_CLUSTER_SPEC, else local)",
    )


# ------------------------------------------------------------------------------------ argument types


def tpu_type(text: str) -> str:
    """``--tpu TYPE``: a TPU pod type of the catalog."""
    from fray_core.types import TpuConfig

    try:
        return TpuConfig(type=text).type
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_int(text: str) -> int:
    """An int >= 0 (retry budgets, fault counts)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return n

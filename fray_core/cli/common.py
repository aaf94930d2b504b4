"""What every ``fray`` command shares: exit codes, :class:`UsageError`, argument types, the cluster of a
command. Backend-neutral: a cluster comes from its spec through the backend registry."""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fray_core.cli.output import safe
from fray_core.errors import ResultUnavailableError
from fray_core.limits import MAX_SECONDS, show_text

if TYPE_CHECKING:
    from fray_core.cluster import Cluster
    from fray_core.status import JobInfo, JobStatus

__all__ = [
    "describe_os_error",
    "check_default_jobs_dir",
    "job_name",
    "probability",
    "non_negative_float",
    "at_least_one",
    "int_in",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STOPPED",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "UsageError",
    "add_cluster_option",
    "backend_name",
    "cluster_of",
    "cluster_of_jobs",
    "exit_code",
    "load_results",
    "positive_int",
    "tpu_type",
]

EXIT_OK = 0  # success (and, for commands that wait, a job that SUCCEEDED)
EXIT_FAILED = 1  # a job that ended FAILED
EXIT_USAGE = 2  # bad arguments, invalid request, unknown job id, unknown cluster spec
EXIT_STOPPED = 3  # a job that ended STOPPED
EXIT_TIMEOUT = 4  # timed out or internal: the cluster or a job's supervisor did not answer in time
EXIT_INTERRUPTED = 130  # Ctrl-C


class UsageError(Exception):
    """A mistake in what the user asked for: reported as one line on stderr, exit code 2."""


def exit_code(status: JobStatus) -> int:
    """The exit code of a command that waited for a job that ended with ``status``."""
    from fray_core.status import JobStatus

    return {JobStatus.SUCCEEDED: EXIT_OK, JobStatus.FAILED: EXIT_FAILED, JobStatus.STOPPED: EXIT_STOPPED}.get(
        status, EXIT_OK
    )


def cluster_of(args: argparse.Namespace) -> Cluster:
    """The command's cluster: ``--cluster SPEC``, ``--address ADDR`` (Ray), ``$FRAY_CLUSTER_SPEC``,
    ``$RAY_ADDRESS``, the config file's ``cluster``, else ``local`` (:func:`fray_core.cli.config.resolve_spec`).

    A jobs dir that cannot be used (not a directory, not writable, under a missing ``$HOME``) is a
    :class:`UsageError` naming it, not a traceback.
    """
    from fray_core.cli.config import resolve_spec

    spec, _ = resolve_spec(getattr(args, "cluster", None), getattr(args, "address", None))
    check_default_jobs_dir(spec)
    return _build(spec)


def _build(spec: str) -> Cluster:
    from fray_core.cluster import cluster_from_spec

    try:
        return cluster_from_spec(spec)
    except OSError as e:
        raise UsageError(
            f"cannot use cluster {spec!r}: {describe_os_error(e)} (check FRAY_JOBS_DIR or the spec's jobs_dir)"
        ) from None


#: where a spec given on the command line comes from: it is used as given, never replaced by a record's
_EXPLICIT = ("--cluster", "--address")


def cluster_of_jobs(args: argparse.Namespace, job_ids: Sequence[str]) -> Cluster:
    """The cluster of a command about given jobs (``fray status/logs/stop ID``): the cluster the first job's
    record names (``owner.cluster``, kept by backends whose jobs run elsewhere, such as Ray, with the store
    the record was found in), unless ``--cluster``/``--address`` name one; else :func:`cluster_of`.

    So ``fray stop ID`` after a Ctrl-C of ``fray launch --address HEAD:6379 --wait ...`` needs no flags: the
    default store holds the record, and the record says where the job runs.

    >>> cluster = cluster_of_jobs(args, ["ray-20250131-abcd"])  # doctest: +SKIP
    """
    from fray_core.cli.config import resolve_spec
    from fray_core.cluster import parse_spec
    from fray_core.errors import FrayError
    from fray_core.records import JobStore

    spec, source = resolve_spec(getattr(args, "cluster", None), getattr(args, "address", None))
    check_default_jobs_dir(spec)
    cluster = _build(spec)
    store = getattr(cluster, "store", None)
    if source in _EXPLICIT or not isinstance(store, JobStore):
        return cluster
    for job_id in job_ids:
        try:
            info, record = store.read_info(str(job_id))
        except (FrayError, OSError):
            continue  # unknown or unreadable here: the command says so with the cluster it has
        owner = record.get("owner")
        target = owner.get("cluster") if isinstance(owner, dict) else None
        if not isinstance(target, str) or not target.strip() or info.backend == backend_name(cluster):
            return cluster
        scheme, params = parse_spec(target)
        if scheme != info.backend:
            return cluster  # a record that contradicts itself: not a cluster to connect to
        if "jobs_dir" not in params:  # the record was found in this store: the job's cluster uses it too
            target += ("&" if "?" in target else "?") + urllib.parse.urlencode({"jobs_dir": store.root})
        return _build(target)
    return cluster


def check_default_jobs_dir(spec: str) -> None:
    """Refuse to make the default jobs dir (``~/.cache/fray/jobs``) under a home that does not exist."""
    from fray_core.cluster import parse_spec

    if parse_spec(spec)[1].get("jobs_dir") or os.environ.get("FRAY_JOBS_DIR") or os.environ.get("XDG_CACHE_HOME"):
        return
    home = os.path.expanduser("~")
    if not os.path.isdir(home):
        raise UsageError(
            f"the default jobs dir is under $HOME ({home}), which is not a directory; set FRAY_JOBS_DIR to a "
            "directory for job records (or pass --cluster 'local?jobs_dir=DIR')"
        )


def describe_os_error(e: OSError) -> str:
    """``Not a directory: '/x/jobs'`` (the reason and the path, without ``[Errno N]``)."""
    reason = e.strerror or str(e)
    if isinstance(e, FileExistsError) and e.filename and not os.path.isdir(e.filename):
        reason = "Not a directory"  # makedirs over a file
    return f"{reason}: {e.filename!r}" if e.filename else reason


def load_results(cluster: Cluster, info: JobInfo) -> list[Any] | None:
    """A SUCCEEDED job's results, loaded (unpickled) only when a command is asked to show them.

    ``None`` for a job that did not succeed; results that cannot be loaded (a module missing here, a
    refused jobs dir, results never stored) are one ``[fray] result cannot be loaded: ...`` line on
    stderr, not a failed command: the job itself succeeded.
    """
    if info.status.value != "SUCCEEDED":
        return None
    try:
        return cluster.result(info.job_id)
    except ResultUnavailableError as e:
        print(f"[fray] result cannot be loaded: {safe(str(e))}", file=sys.stderr)
        return None


def backend_name(cluster: Cluster) -> str:
    from fray_core.cluster import parse_spec

    return parse_spec(cluster.spec or "local")[0]


def add_cluster_option(p: argparse.ArgumentParser, top: bool = False) -> None:
    """``--cluster SPEC`` and ``--address ADDR``, accepted before or after the command."""
    # SUPPRESS keeps a subcommand from resetting the top-level value
    p.add_argument(
        "--cluster",
        metavar="SPEC",
        default=None if top else argparse.SUPPRESS,
        help="local, local?tpu=v4-16:2, local?jobs_dir=DIR, ray, ray?address=...&namespace=... "
        "(default: $FRAY_CLUSTER_SPEC, $RAY_ADDRESS, the config file's cluster, else local)",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        default=None if top else argparse.SUPPRESS,
        help="the Ray cluster at ADDR, as `ray job --address` takes it (same as --cluster 'ray?address=ADDR')",
    )


# ------------------------------------------------------------------------------------ argument types


def tpu_type(text: str) -> str:
    """``--tpu TYPE``: a TPU pod type of the catalog."""
    from fray_core.request import TpuConfig

    try:
        return TpuConfig(type=text).type
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _number(text: str, kind: type, ok: Callable[[Any], bool], expected: str) -> Any:
    """``kind(text)`` when it parses and ``ok`` accepts it, else an argparse error naming what is expected (and
    the text given, cut when long: 5,000 digits are named, not repeated)."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {show_text(text)}")
    return value


def at_least_one(text: str) -> int:
    """An int >= 1 (replicas, slices, steps, limits)."""
    return _number(text, int, lambda n: n >= 1, "an int >= 1")


def positive_int(text: str) -> int:
    """An int >= 0 (retry budgets, fault counts)."""
    return _number(text, int, lambda n: n >= 0, "an int >= 0")


def int_in(minimum: int, maximum: int) -> Callable[[str], int]:
    """The argument type of an int in ``[minimum, maximum]``: a count with a limit (``fray_core.limits``) is
    refused as the command line is read, naming the option, instead of by a constructor deep inside.

    >>> int_in(0, 100_000)("7")
    7
    """

    def parse(text: str) -> int:
        value = _number(text, int, lambda n: n >= minimum, f"an int >= {minimum}")
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"expected an int >= {minimum} (at most {maximum:,}), got {show_text(text)}"
            )
        return value

    return parse


def non_negative_float(text: str) -> float:
    """A number of seconds: finite, >= 0 and at most :data:`~fray_core.limits.MAX_SECONDS` (more overflows a
    sleep or a deadline inside, far from the option)."""
    value = _number(text, float, lambda x: 0 <= x < float("inf"), "a number >= 0")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 (at most {MAX_SECONDS:g}), got {show_text(text)}")
    return value


def probability(text: str) -> float:
    """A float in [0, 1]."""
    return _number(text, float, lambda x: 0 <= x <= 1, "a probability between 0 and 1")


def job_name(text: str) -> str:
    """``--name``: a non-empty job name."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a non-empty job name, got {text!r}")
    return text

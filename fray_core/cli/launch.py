"""``fray launch``: build a :class:`JobRequest` from the command line, launch it, optionally follow it."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fray_core.cli.common import (
    EXIT_OK,
    UsageError,
    add_cluster_option,
    at_least_one,
    backend_name,
    cluster_of,
    job_name,
    positive_int,
    tpu_type,
)
from fray_core.cli.live import follow

if TYPE_CHECKING:
    from fray_core.cluster import Cluster
    from fray_core.request import JobRequest

__all__ = ["add_parser", "build_request", "cmd_launch", "parse_call_args"]

_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _parse_value(text: str) -> Any:
    """A command-line value: JSON if it parses (``10``, ``true``, ``[1, 2]``), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_call_args(items: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
    """``["3", "steps=10", "name=a"]`` -> ``([3], {"steps": 10, "name": "a"})``."""
    pos: list[Any] = []
    kw: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if eq and key.isidentifier():
            kw[key] = _parse_value(value)
        else:
            if kw:
                raise UsageError(f"positional argument {item!r} after keyword arguments")
            pos.append(_parse_value(item))
    return pos, kw


def _import_callable(target: str, code_dir: str | None = None) -> Callable[..., Any]:
    """``module:function``, imported with the current directory (and ``code_dir``, ``--working-dir``, before
    it) on ``sys.path``."""
    import importlib

    mod_name, _, attr = target.partition(":")
    for path in (os.getcwd(), code_dir):
        if path and path not in sys.path:
            sys.path.insert(0, path)
    # What the module writes to stderr while it is imported is held back: a module that exits at import
    # (sys.exit, argparse's parse_args() reading fray's own argv) must not print its usage lines as if they
    # were fray's. Written out as it came when the import ends any other way.
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            obj: Any = importlib.import_module(mod_name)
    except SystemExit as e:  # not KeyboardInterrupt: ^C stays ^C
        said = [line for line in held.getvalue().splitlines() if line.strip()]
        last = f"; its last line on stderr: {said[-1][:200]!r}" if said else ""
        code = repr(e.code) if len(repr(e.code)) <= 200 else f"{repr(e.code)[:200]}..."
        raise UsageError(
            f"cannot import module {mod_name!r}: it exited at import (SystemExit({code})){last} "
            "(move code that parses sys.argv or calls sys.exit() under if __name__ == '__main__':)"
        ) from None
    except Exception as e:
        sys.stderr.write(held.getvalue())
        where = "the current directory" + (f" and {code_dir}" if code_dir else "")
        raise UsageError(f"cannot import module {mod_name!r} ({where} on sys.path): {type(e).__name__}: {e}") from None
    sys.stderr.write(held.getvalue())
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{target} is not callable (got {type(obj).__name__})")
    return obj


def _slices_arg(text: str) -> int | list[int]:
    try:
        counts = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"expected a slice count N or acceptable counts N,M (ints >= 1), got {text!r}")
    return counts[0] if len(counts) == 1 else counts


def _directory(text: str) -> str:
    """``--working-dir DIR``: an existing directory, made absolute (the job may start elsewhere)."""
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isdir(path):
        raise argparse.ArgumentTypeError(
            f"expected a directory, got {text!r} ({'not a directory' if os.path.exists(path) else 'no such directory'})"
        )
    return path


def _env_arg(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _gpu_arg(text: str) -> tuple[str, int]:
    """``--gpu A100`` -> ``("A100", 1)``; ``--gpu A100:8`` -> ``("A100", 8)``; ``auto`` takes any type."""
    kind, colon, count = text.partition(":")
    n = None
    if count.strip().isdigit():
        n = int(count)
    if not kind.strip() or (colon and (n is None or n < 1)):
        raise argparse.ArgumentTypeError(
            f"expected TYPE or TYPE:N (e.g. A100, A100:8, auto:2; N an int >= 1), got {text!r}"
        )
    return kind.strip(), n if n is not None else 1


def default_name(target: str, rest: Sequence[str]) -> str:
    """The job's name when ``--name`` is not given: distinct enough to tell jobs apart in ``fray list``.

    >>> default_name("train:main", []), default_name("pkg.eval:main", [])
    ('train-main', 'eval-main')
    >>> default_name("scripts/train.py", []), default_name("python", ["-u", "train.py"]), default_name(
    ...     "bash", ["-c", "x"]
    ... )
    ('train', 'python-train', 'bash')
    """
    if _CALLABLE_RE.match(target) and not target.endswith(".py"):
        mod, _, attr = target.partition(":")
        return f"{mod.rpartition('.')[2]}-{attr.rpartition('.')[2]}"
    if target.endswith(".py"):
        return os.path.basename(target)[:-3] or "script"
    name = os.path.basename(target) or target
    # `python train.py`, `bash run.sh`: the file the command runs says more than the interpreter
    script = next((a for a in rest if not a.startswith("-")), None) if rest and rest[0] != "-c" else None
    if script and ("." in os.path.basename(script) or "/" in script):
        stem = os.path.splitext(os.path.basename(script))[0]
        if stem:
            name += f"-{stem}"
    return name


def build_request(args: argparse.Namespace, on_this_machine: bool) -> JobRequest:
    """The :class:`JobRequest` that ``fray launch`` arguments describe.

    ``TARGET`` is ``module:function`` (imported with the current directory on ``sys.path``; ``ARGS`` are
    ``value`` or ``key=value``, parsed as JSON when they parse), a ``script.py`` (run as ``python script.py
    ARGS``) or any other command. ``on_this_machine``: the job's processes run here, so a script or command
    must exist here and a script runs with this Python.
    """
    from fray_core.request import Entrypoint, GpuConfig, JobRequest, ResourceConfig, TpuConfig, create_environment

    if args.target is None:
        raise UsageError("the following arguments are required: TARGET (module:function, script.py or a command)")

    # the resources first: a mistake in the options is reported before one in the function's arguments
    res_kw: dict[str, Any] = {}
    if args.cpu is not None:
        res_kw["cpu"] = args.cpu
    if args.ram is not None:
        res_kw["ram"] = args.ram
    gpu = getattr(args, "gpu", None)
    if args.tpu:
        if args.replicas is not None:
            raise UsageError("--replicas is for CPU/GPU jobs; with --tpu use --slices")
        if gpu is not None:
            raise UsageError("--gpu and --tpu cannot be combined: a job runs on one kind of device")
        resources = ResourceConfig(device=TpuConfig(type=args.tpu), replicas=args.slices or 1, **res_kw)
    else:
        if args.slices is not None:
            raise UsageError("--slices needs --tpu TYPE (for CPU or GPU processes use --replicas N)")
        if gpu is not None:
            res_kw["device"] = GpuConfig(type=gpu[0], count=gpu[1])
        resources = ResourceConfig(replicas=1 if args.replicas is None else args.replicas, **res_kw)
    target: str = args.target
    rest: list[str] = list(args.args or [])
    if rest and rest[0] == "--":
        rest = rest[1:]
    if _CALLABLE_RE.match(target) and not target.endswith(".py"):
        fn = _import_callable(target, getattr(args, "working_dir", None))
        pos, kw = parse_call_args(rest)
        entry = Entrypoint(callable=fn, function_args=kw, args=tuple(pos))
    elif target.endswith(".py"):
        if on_this_machine and not os.path.isfile(target):
            raise UsageError(f"no such script: {target!r}")
        entry = Entrypoint(binary=sys.executable if on_this_machine else "python", args=[target, *rest])
    else:
        if on_this_machine and shutil.which(target) is None:
            raise UsageError(f"command not found: {target!r} (give module:function, a script.py or a command on PATH)")
        entry = Entrypoint(binary=target, args=rest)

    env = dict(args.env or [])
    pip = list(getattr(args, "pip", None) or [])
    code_dir = getattr(args, "working_dir", None)
    req_kw: dict[str, Any] = {}
    if args.max_retries_preemption is not None:
        req_kw["max_retries_preemption"] = args.max_retries_preemption
    if args.max_retries_failure is not None:
        req_kw["max_retries_failure"] = args.max_retries_failure
    return JobRequest(
        name=args.name or default_name(target, rest),
        entrypoint=entry,
        resources=resources,
        environment=create_environment(env_vars=env, pip_packages=pip, workspace=code_dir)
        if env or pip or code_dir
        else None,
        **req_kw,
    )


def check_fits(cluster: Cluster, request: JobRequest) -> None:
    """A TPU request that the cluster's fixed fleet can never serve (more slices of a type than exist, a type
    it has none of) is a :class:`UsageError` naming what the fleet has, before anything is launched. Fleets
    that make slices on demand, and backends whose capacity is not known here, accept every request (the
    runner still reports a request that never fits as UNSCHEDULABLE)."""
    from fray_core.fleet import simulated_fleet

    device = request.resources.device
    fleet = simulated_fleet(cluster)
    if getattr(device, "kind", None) != "tpu" or fleet is None or fleet.on_demand:
        return
    replicas = request.resources.replicas
    counts = [int(n) for n in replicas] if isinstance(replicas, (list, tuple)) else [int(replicas)]
    need = min(counts)
    have = fleet.capacity()  # slices per type that exist (free, busy, or preempted and coming back)
    if have.get(device.type, 0) >= need:
        return
    what = ", ".join(f"{n} x {t}" for t, n in sorted(have.items())) or "no slices"
    asked = ",".join(map(str, counts))
    fewest = f" (even the fewest, {need})" if len(counts) > 1 else ""
    raise UsageError(
        f"--tpu {device.type} --slices {asked} can never fit{fewest}: the fleet of "
        f"{cluster.spec or 'this cluster'} has {what}"
    )


def cmd_launch(args: argparse.Namespace) -> int:
    """``fray launch [options] TARGET [ARGS...]``: print the job id, or with ``--wait`` follow the job."""
    cluster = cluster_of(args)
    request = build_request(args, cluster.runs_on_this_machine)
    check_fits(cluster, request)
    job_id = str(cluster.launch_detached(request))
    if not args.wait:
        print(job_id)
        return EXIT_OK
    print(f"[fray] launched {job_id} on {cluster.spec or backend_name(cluster)}", flush=True)
    return follow(cluster, job_id, sys.stdout, stop_on_interrupt=False)


def add_parser(sub: Any, fmt: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "launch",
        help="launch a job (module:function, script.py or command)",
        description="Launch a job and print its id (alone on stdout: ID=$(fray launch ...)). With --wait, "
        "stream its logs and progress and exit with its status. The job keeps running after this command "
        "returns (on the local backend it runs under a detached supervisor process).",
        epilog="examples:\n  fray launch train:main steps=100\n  fray launch --wait --tpu v4-16 --slices 2 \\\n"
        "      --cluster 'local?tpu=v4-16:2' train:main\n  fray launch --env WANDB_MODE=offline train.py --lr 3e-4\n\n"
        + epilog,
        formatter_class=fmt,
    )
    p.add_argument("target", metavar="TARGET", nargs="?", help="module:function, script.py, or a command")
    p.add_argument(
        "args",
        metavar="ARGS",
        nargs=argparse.REMAINDER,
        help="for module:function: VALUE or KEY=VALUE (JSON when it parses); otherwise the command's arguments",
    )
    p.add_argument("--name", type=job_name, help="job name (default: the function, script or command name)")
    p.add_argument("--tpu", metavar="TYPE", type=tpu_type, help="TPU pod type, e.g. v4-16, v5litepod-4, v6e-16")
    p.add_argument(
        "--slices",
        metavar="N|N,M",
        type=_slices_arg,
        help="TPU slices (default 1); N,M: acceptable counts, largest that fits wins",
    )
    p.add_argument("--replicas", metavar="N", type=at_least_one, help="CPU/GPU processes started together (default 1)")
    p.add_argument(
        "--gpu",
        metavar="TYPE[:N]",
        type=_gpu_arg,
        help="N GPUs of TYPE per process (A100, H100:8, auto:2; default N 1)",
    )
    p.add_argument("--cpu", type=float, help="CPUs per process (default 1)")
    p.add_argument("--ram", help="memory per process, e.g. 16g, 512m (default 4g)")
    p.add_argument(
        "--env", metavar="K=V", type=_env_arg, action="append", help="env var for every process (repeatable)"
    )
    p.add_argument(
        "--pip",
        metavar="PKG",
        action="append",
        help="a pip requirement the job needs (repeatable; the Ray backend installs it, the local backend warns "
        "if missing)",
    )
    p.add_argument(
        "--working-dir",
        metavar="DIR",
        type=_directory,
        help="the job's code and working directory: on Ray, DIR is shipped to the cluster with the job "
        "(EnvironmentConfig.working_dir; default: the directory of TARGET's module when it is not installed)",
    )
    p.add_argument(
        "--max-retries-preemption",
        metavar="N",
        type=positive_int,
        help="N retries after preemptions: at most N+1 such attempts (default 100)",
    )
    p.add_argument(
        "--max-retries-failure",
        metavar="N",
        type=positive_int,
        help="N retries after failures: at most N+1 failed attempts (default 0)",
    )
    p.add_argument(
        "--wait", action="store_true", help="stream logs and progress until the job ends; exit with its status"
    )
    add_cluster_option(p)
    p.set_defaults(func=cmd_launch)

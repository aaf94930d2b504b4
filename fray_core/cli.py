"""The ``fray`` command line: launch jobs, watch them, stop them, and run a simulated multislice demo.

::

    fray launch --tpu v4-16 --slices 2 train:main steps=100   # prints the job id, returns at once
    fray launch --wait train.py --lr 3e-4                      # streams logs, exits with the job's code
    fray list
    fray status ID [--json]
    fray logs ID [-f]
    fray stop ID
    fray sim --tpu v4-16 --slices 2 --preemptions 1

Every command takes ``--cluster SPEC`` (default: ``$FRAY_CLUSTER_SPEC``, else ``local``, the same resolution
as ``current_cluster()``); job records live under ``$FRAY_JOBS_DIR``.

On the local backend a job is supervised by a thread of the process that launched it. So that ``fray launch``
can return while the job runs, it starts a detached supervisor process (``python -m fray_core.cli _supervise``,
in its own session) that launches the job and lives until the job ends; ``fray stop`` asks it to stop the job,
and a job whose supervisor was killed is reported FAILED by ``fray status``. On Ray the job's supervisor is a
detached actor, so ``fray launch`` just launches.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

if TYPE_CHECKING:
    from fray_core.cluster import Cluster
    from fray_core.types import JobInfo, JobRequest, JobStatus

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_STOPPED", "EXIT_USAGE", "format_table", "main"]

EXIT_OK = 0  # success (and, for commands that wait, a job that SUCCEEDED)
EXIT_FAILED = 1  # a job that ended FAILED
EXIT_USAGE = 2  # bad arguments, invalid request, unknown job id, unknown cluster spec
EXIT_STOPPED = 3  # a job that ended STOPPED
EXIT_INTERRUPTED = 130  # Ctrl-C

EPILOG = """\
exit codes:
  0  success; for `launch --wait`, `logs -f` and `sim`: the job SUCCEEDED
  1  the job ended FAILED
  2  bad usage or input (invalid request, unknown job id, unknown cluster spec)
  3  the job ended STOPPED
  130  interrupted (Ctrl-C); a launched job keeps running

cluster: --cluster SPEC, else $FRAY_CLUSTER_SPEC, else `local`. Specs: local, local?tpu=v4-16:2,
  local?jobs_dir=DIR, ray, ray?address=HOST:PORT&namespace=NS&jobs_dir=DIR. Records: $FRAY_JOBS_DIR.
local backend: `fray launch` starts a detached supervisor process that runs the job until it ends.
set FRAY_DEBUG=1 to see tracebacks of errors.
"""

_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_SUPERVISE = "_supervise"


class UsageError(Exception):
    """A mistake in what the user asked for: reported as one line on stderr, exit code 2."""


# ------------------------------------------------------------------------------------------- output


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


def _age(seconds: float) -> str:
    """``12s``, ``5m``, ``3h``, ``2d``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _duration(seconds: float | None) -> str:
    """``1.4s``, ``2m03s``, ``1h05m``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _first_line(text: str | None) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


def _timestamp(t: float | None) -> str:
    if not t:
        return "-"
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _exit_code(status: JobStatus) -> int:
    from fray_core.types import JobStatus

    return {JobStatus.SUCCEEDED: EXIT_OK, JobStatus.FAILED: EXIT_FAILED, JobStatus.STOPPED: EXIT_STOPPED}.get(
        status, EXIT_OK
    )


def _attempt_rows(info: JobInfo) -> list[list[str]]:
    now = time.time()
    rows = []
    for a in info.attempts:
        end = a.ended_at if a.ended_at is not None else (now if a.outcome is None else None)
        dur = _duration(end - a.started_at if end is not None and a.started_at else None)
        outcome = a.outcome.value if a.outcome else ("RUNNING" if a.slices else "WAITING")
        rows.append([str(a.index), ", ".join(a.slices) or "-", outcome, dur, _first_line(a.cause)])
    return rows


def _print_attempts(info: JobInfo, out: TextIO) -> None:
    if info.attempts:
        print(format_table(["ATTEMPT", "SLICES", "OUTCOME", "DURATION", "CAUSE"], _attempt_rows(info)), file=out)


def _print_results(info: JobInfo, out: TextIO, limit: int = 200) -> None:
    for i, r in enumerate(info.result or []):
        if r is None:
            continue
        text = repr(r)
        print(f"[fray] result[{i}]: {text if len(text) <= limit else text[:limit] + '...'}", file=out)


def _describe_resources(summary: dict[str, Any]) -> str:
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


# ------------------------------------------------------------------------------------------ clusters


def _cluster(args: argparse.Namespace) -> Cluster:
    """``--cluster SPEC``, else ``current_cluster()`` (``$FRAY_CLUSTER_SPEC``, else local)."""
    from fray_core.cluster import cluster_from_spec, current_cluster

    return cluster_from_spec(args.cluster) if args.cluster else current_cluster()


def _backend_name(cluster: Cluster) -> str:
    from fray_core.cluster import parse_spec

    return parse_spec(cluster.spec or "local")[0]


def _is_local(cluster: Cluster) -> bool:
    mod = sys.modules.get("fray_local.cluster")
    return mod is not None and isinstance(cluster, mod.LocalCluster)


# -------------------------------------------------------------------------------------------- launch


def _parse_value(text: str) -> Any:
    """A command-line value: JSON if it parses (``10``, ``true``, ``[1, 2]``), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parse_call_args(items: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
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


def _import_callable(target: str) -> Callable[..., Any]:
    import importlib

    mod_name, _, attr = target.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as e:
        raise UsageError(f"cannot import module {mod_name!r} (the current directory is on sys.path): "
                         f"{type(e).__name__}: {e}") from None
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


def _tpu_arg(text: str) -> str:
    from fray_core.types import TpuConfig

    try:
        return TpuConfig(type=text).type
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _env_arg(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return n


def build_request(args: argparse.Namespace, local: bool) -> JobRequest:
    """The :class:`JobRequest` that ``fray launch`` arguments describe.

    ``TARGET`` is ``module:function`` (imported with the current directory on ``sys.path``; ``ARGS`` are
    ``value`` or ``key=value``, parsed as JSON when they parse), a ``script.py`` (run as ``python script.py
    ARGS``) or any other command.
    """
    from fray_core.types import Entrypoint, JobRequest, ResourceConfig, TpuConfig, create_environment

    target: str = args.target
    rest: list[str] = list(args.args or [])
    if rest and rest[0] == "--":
        rest = rest[1:]
    if _CALLABLE_RE.match(target) and not target.endswith(".py"):
        fn = _import_callable(target)
        pos, kw = _parse_call_args(rest)
        entry = Entrypoint(callable=fn, function_args=kw, args=tuple(pos))
        default_name = target.rpartition(":")[2].rpartition(".")[2]
    elif target.endswith(".py"):
        if local and not os.path.isfile(target):
            raise UsageError(f"no such script: {target!r}")
        entry = Entrypoint(binary=sys.executable if local else "python", args=[target, *rest])
        default_name = os.path.basename(target)[:-3]
    else:
        if local and shutil.which(target) is None:
            raise UsageError(f"command not found: {target!r} (give module:function, a script.py or a command on PATH)")
        entry = Entrypoint(binary=target, args=rest)
        default_name = os.path.basename(target)

    res_kw: dict[str, Any] = {}
    if args.cpu is not None:
        res_kw["cpu"] = args.cpu
    if args.ram is not None:
        res_kw["ram"] = args.ram
    if args.tpu:
        if args.replicas is not None:
            raise UsageError("--replicas is for CPU/GPU jobs; with --tpu use --slices")
        resources = ResourceConfig(device=TpuConfig(type=args.tpu), replicas=args.slices or 1, **res_kw)
    else:
        if args.slices is not None:
            raise UsageError("--slices needs --tpu TYPE (for CPU processes use --replicas N)")
        resources = ResourceConfig(replicas=args.replicas or 1, **res_kw)
    env = dict(args.env or [])
    req_kw: dict[str, Any] = {}
    if args.max_retries_preemption is not None:
        req_kw["max_retries_preemption"] = args.max_retries_preemption
    if args.max_retries_failure is not None:
        req_kw["max_retries_failure"] = args.max_retries_failure
    return JobRequest(
        name=args.name or default_name,
        entrypoint=entry,
        resources=resources,
        environment=create_environment(env_vars=env) if env else None,
        **req_kw,
    )


def _launch_detached(spec: str, request: JobRequest) -> str:
    """Launch on the local backend through a detached supervisor process; returns the job id."""
    import cloudpickle

    try:
        payload = cloudpickle.dumps(request)
    except Exception as e:
        raise UsageError(f"the job's entrypoint cannot be pickled: {type(e).__name__}: {e}") from None
    env = dict(os.environ)
    env["FRAY_CLI_SYS_PATH"] = json.dumps([os.getcwd()] + [p for p in sys.path if p])
    proc = subprocess.Popen(
        [sys.executable, "-m", "fray_core.cli", _SUPERVISE, spec],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # never the caller's: `ID=$(fray launch ...)` must not wait for the job
        start_new_session=True,  # Ctrl-C or a closed terminal does not reach the job
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(payload)
    proc.stdin.close()
    job_id = None
    for raw in proc.stdout:
        msg = json.loads(raw)
        if "warning" in msg:
            print(f"fray: warning: {msg['warning']}", file=sys.stderr)
        elif "error" in msg:
            proc.wait()
            raise UsageError(msg["error"])
        elif "job_id" in msg:
            job_id = msg["job_id"]
            break
    proc.stdout.close()
    if job_id is None:
        raise RuntimeError(f"the job's supervisor process exited (code {proc.wait()}) before launching the job")
    proc.returncode = 0  # detached on purpose: do not warn that it is still running
    return job_id


def _supervise(argv: Sequence[str]) -> int:
    """The detached local supervisor: read a pickled JobRequest on stdin, launch it on ``argv[0]``'s
    cluster, report the job id (JSON lines on stdout), then supervise the job until it ends."""
    import cloudpickle

    from fray_core.cluster import cluster_from_spec
    from fray_core.errors import WaitTimeoutError

    for p in reversed(json.loads(os.environ.pop("FRAY_CLI_SYS_PATH", "[]"))):
        if p not in sys.path:
            sys.path.insert(0, p)
    channel = os.fdopen(os.dup(1), "w")

    def send(**msg: str) -> None:
        channel.write(json.dumps(msg) + "\n")
        channel.flush()

    try:
        request = cloudpickle.loads(sys.stdin.buffer.read())
        cluster = cluster_from_spec(argv[0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            job_id = cluster.launch(request)
    except Exception as e:
        send(error=f"{type(e).__name__}: {e}" if not isinstance(e, (ValueError, TypeError)) else str(e))
        return EXIT_USAGE
    for w in caught:
        send(warning=str(w.message))
    # From here on our output goes to the job's supervisor.log (a crash of the supervisor lands there).
    store = getattr(cluster, "store", None)
    log_path = store._p(job_id, "supervisor.log") if store is not None and store.is_local else os.devnull
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    send(job_id=job_id)
    channel.close()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # `kill PID` of the supervisor stops the job cleanly
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while True:
            if stop.is_set():
                cluster.terminate(job_id)
            try:
                cluster.wait(job_id, timeout=0.5)
                break
            except WaitTimeoutError:
                continue
    finally:
        cluster.close()
    return EXIT_OK


def _follow(cluster: Cluster, job_id: str, out: TextIO, stop_on_interrupt: bool, always_table: bool = False) -> int:
    """Stream logs and progress until the job ends; the exit code of its final status."""
    try:
        info = cluster.monitor(job_id, out=out)
    except KeyboardInterrupt:
        if stop_on_interrupt:
            print(f"\nfray: interrupted; stopping {job_id}", file=sys.stderr)
            cluster.terminate(job_id)
        else:
            print(
                f"\nfray: stopped following {job_id}; it keeps running (fray logs -f {job_id}, fray stop {job_id})",
                file=sys.stderr,
            )
        return EXIT_INTERRUPTED
    if always_table or len(info.attempts) > 1 or info.status.value != "SUCCEEDED":
        print(file=out)
        _print_attempts(info, out)
    _print_results(info, out)
    return _exit_code(info.status)


def cmd_launch(args: argparse.Namespace) -> int:
    """``fray launch [options] TARGET [ARGS...]``: print the job id, or with ``--wait`` follow the job."""
    cluster = _cluster(args)
    local = _is_local(cluster)
    request = build_request(args, local)
    job_id = _launch_detached(cluster.spec or "local", request) if local else str(cluster.launch(request))
    if not args.wait:
        print(job_id)
        return EXIT_OK
    print(f"[fray] launched {job_id} on {cluster.spec or _backend_name(cluster)}", flush=True)
    return _follow(cluster, job_id, sys.stdout, stop_on_interrupt=False)


# ------------------------------------------------------------------------------------- other commands


def cmd_list(args: argparse.Namespace) -> int:
    """``fray list [--json]``: every job in the store, oldest first."""
    cluster = _cluster(args)
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
        [i.job_id, i.name, i.status.value, len(i.attempts), f"{i.preemptions}/{i.failures}", _age(now - i.submitted_at)]
        for i in infos
    ]
    print(format_table(["ID", "NAME", "STATUS", "ATTEMPTS", "PREEMPT/FAIL", "AGE"], rows))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """``fray status ID [--json]``: the job and its attempts."""
    cluster = _cluster(args)
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
            ("resources", _describe_resources(s)),
            (
                "retries",
                f"preemptions {info.preemptions} of {s.get('max_retries_preemption')} allowed, "
                f"failures {info.failures} of {s.get('max_retries_failure')} allowed",
            ),
        ]
    else:
        fields.append(("retries", f"preemptions {info.preemptions}, failures {info.failures}"))
    age = f" ({_age(time.time() - info.submitted_at)} ago)" if info.submitted_at else ""
    fields.append(("submitted", _timestamp(info.submitted_at) + age))
    if info.finished_at:
        fields.append(("finished", _timestamp(info.finished_at)))
    if info.error:
        fields.append(("error", info.error))
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        print(f"{k.ljust(width)}  {v}")
    if info.attempts:
        print()
        _print_attempts(info, sys.stdout)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """``fray logs ID [-f]``: the job's output, one line per host line, tagged ``[a<attempt> s<slice>/h<host>]``."""
    cluster = _cluster(args)
    try:
        for line in cluster.logs(args.job_id, follow=args.follow):
            print(line, flush=args.follow)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `fray logs ID | head`
        sys.stdout = open(os.devnull, "w")
        return EXIT_OK
    if args.follow:
        return _exit_code(cluster.poll(args.job_id).status)
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """``fray stop ID``: stop every host, release every slice; the job ends STOPPED."""
    cluster = _cluster(args)
    info = cluster.poll(args.job_id)
    if info.status.is_terminal():
        print(f"{info.job_id}: already ended {info.status.value}")
        return EXIT_OK
    backend = _backend_name(cluster)
    if info.backend != backend:
        raise UsageError(f"job {info.job_id} runs on the {info.backend!r} backend; pass --cluster {info.backend}")
    cluster.terminate(args.job_id)
    info = cluster.poll(args.job_id)
    print(f"{info.job_id}: {info.status.value}")
    return EXIT_OK


# ------------------------------------------------------------------------------------------------ sim


def sim_train(steps: int, step_time: float) -> str:
    """The stand-in training loop of ``fray sim``: prints a line per step, returns a summary."""
    slice_id = os.environ.get("FRAY_SLICE_ID", "0")
    host = os.environ.get("TPU_WORKER_ID", "0")
    coordinator = os.environ.get("MEGASCALE_COORDINATOR_ADDRESS", "-")
    for step in range(steps):
        print(f"step {step + 1}/{steps} on {os.environ.get('TPU_NAME')} (slice {slice_id} host {host}, "
              f"coordinator {coordinator})", flush=True)
        time.sleep(step_time)
    return f"slice {slice_id} host {host}: {steps} steps"


def sim_fault_plan(
    slices: int, preemptions: int, failures: int, seed: int, chaos: float | None, steps: int = 6, step_time: float = 0.3
) -> tuple[Any, list[str]]:
    """The fault plan of ``fray sim`` and a description of it, reproducible from ``seed``."""
    from fray_local.fleet import FailHost, FaultPlan, PreemptSlice

    if chaos is not None:
        plan = FaultPlan.chaos(seed, chaos, max_slices=slices, horizon=0.9 * steps * step_time)
        return plan, [f"chaos: each slice preempted with probability {chaos} per attempt (seed {seed})"]
    rng = random.Random(seed)
    faults: list[Any] = []
    desc = []
    for a in range(preemptions):
        # lands while the hosts are still stepping: 50-90% into the steps (host start-up only adds to it)
        s, after = rng.randrange(slices), round(rng.uniform(0.5, 0.9) * steps * step_time, 2)
        faults.append(PreemptSlice(attempt=a, slice_index=s, after=after))
        desc.append(f"attempt {a}: preempt slice {s} after {after}s")
    for i in range(failures):
        a = preemptions + i
        faults.append(FailHost(attempt=a, slice_index=0, host_index=0, message=f"injected failure in attempt {a}"))
        desc.append(f"attempt {a}: fail host 0 of slice 0")
    return FaultPlan(faults, seed=seed), desc or ["no faults"]


def cmd_sim(args: argparse.Namespace) -> int:
    """``fray sim``: a multislice job on a simulated fleet with injected faults, attempts shown live."""
    from fray_core.cluster import parse_spec
    from fray_core.types import Entrypoint, JobRequest, ResourceConfig
    from fray_local.cluster import LocalCluster
    from fray_local.fleet import TpuFleet

    scheme, params = parse_spec(args.cluster or os.environ.get("FRAY_CLUSTER_SPEC") or "local")
    if scheme != "local" or "tpu" in params:
        raise UsageError("fray sim makes its own simulated fleet (--tpu/--slices); --cluster may only be "
                         "'local' or 'local?jobs_dir=DIR'")
    plan, desc = sim_fault_plan(
        args.slices, args.preemptions, args.failures, args.seed, args.chaos, args.steps, args.step_time
    )
    fleet = TpuFleet({args.tpu: args.slices}, fault_plan=plan)
    cluster = LocalCluster(fleet=fleet, jobs_dir=params.get("jobs_dir") or None)
    budget = args.max_retries_preemption
    if budget is None:
        budget = 20 if args.chaos is not None else args.preemptions
    request = JobRequest(
        name=f"sim-{args.tpu}x{args.slices}",
        entrypoint=Entrypoint(callable=sim_train, function_args={"steps": args.steps, "step_time": args.step_time}),
        resources=ResourceConfig.with_tpu(args.tpu, slice_count=args.slices),
        max_retries_preemption=budget,
        max_retries_failure=args.failures,
    )
    hosts = request.resources.device.hosts  # type: ignore[union-attr]
    print(f"[fray] simulated fleet: {args.slices} x {args.tpu} ({hosts} host processes per slice)")
    for line in desc:
        print(f"[fray] injected: {line}")
    print(f"[fray] budgets: max_retries_preemption={budget}, max_retries_failure={args.failures}")
    try:
        job_id = cluster.launch(request)
        print(f"[fray] launched {job_id}", flush=True)
        return _follow(cluster, job_id, sys.stdout, stop_on_interrupt=True, always_table=True)
    finally:
        cluster.close()


# ----------------------------------------------------------------------------------------------- main


def _add_cluster(p: argparse.ArgumentParser, top: bool = False) -> None:
    # accepted before or after the command; SUPPRESS keeps a subcommand from resetting the top-level value
    p.add_argument(
        "--cluster",
        metavar="SPEC",
        default=None if top else argparse.SUPPRESS,
        help="local, local?tpu=v4-16:2, local?jobs_dir=DIR, ray, ray?address=...&namespace=... "
        "(default: $FRAY_CLUSTER_SPEC, else local)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``fray`` (also used to render ``fray --help``)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="fray",
        description="Launch and watch ML jobs (CPU, GPU, multi-host TPU slices) on the local backend, a "
        "simulated TPU fleet, or Ray.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    _add_cluster(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "launch",
        help="launch a job (module:function, script.py or command)",
        description="Launch a job and print its id (alone on stdout: ID=$(fray launch ...)). With --wait, "
        "stream its logs and progress and exit with its status. On the local backend the job runs under a "
        "detached supervisor process, so it keeps running after this command returns.",
        epilog="examples:\n  fray launch train:main steps=100\n  fray launch --wait --tpu v4-16 --slices 2 "
        "--cluster 'local?tpu=v4-16:2' train:main\n  fray launch --env WANDB_MODE=offline train.py --lr 3e-4\n\n"
        + EPILOG,
        formatter_class=fmt,
    )
    p.add_argument("target", metavar="TARGET", help="module:function, script.py, or a command")
    p.add_argument(
        "args",
        metavar="ARGS",
        nargs=argparse.REMAINDER,
        help="for module:function: VALUE or KEY=VALUE (JSON when it parses); otherwise the command's arguments",
    )
    p.add_argument("--name", help="job name (default: the function, script or command name)")
    p.add_argument("--tpu", metavar="TYPE", type=_tpu_arg, help="TPU pod type, e.g. v4-16, v5litepod-4, v6e-16")
    p.add_argument(
        "--slices", metavar="N|N,M", type=_slices_arg, help="TPU slices (default 1); N,M: acceptable counts, largest that fits wins"
    )
    p.add_argument("--replicas", metavar="N", type=int, help="CPU/GPU processes started together (default 1)")
    p.add_argument("--cpu", type=float, help="CPUs per process (default 1)")
    p.add_argument("--ram", help="memory per process, e.g. 16g, 512m (default 4g)")
    p.add_argument("--env", metavar="K=V", type=_env_arg, action="append", help="env var for every process (repeatable)")
    p.add_argument(
        "--max-retries-preemption", metavar="N", type=_positive_int, help="N retries after preemptions: at most N+1 such attempts (default 100)"
    )
    p.add_argument("--max-retries-failure", metavar="N", type=_positive_int, help="N retries after failures: at most N+1 failed attempts (default 0)")
    p.add_argument("--wait", action="store_true", help="stream logs and progress until the job ends; exit with its status")
    _add_cluster(p)
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("list", help="list jobs", description="Every job in the job store, oldest first.")
    p.add_argument("--json", action="store_true", help="JSON records instead of a table")
    _add_cluster(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("status", help="a job and its attempts", description="A job, its budgets and its attempts.")
    p.add_argument("job_id", metavar="ID")
    p.add_argument("--json", action="store_true", help="the JSON record (with the results when it succeeded)")
    _add_cluster(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "logs",
        help="a job's output, tagged with attempt/slice/host",
        description="A job's output; every line is tagged [a<attempt> s<slice>/h<host>] (TPU) or "
        "[a<attempt> r<replica>] (CPU/GPU). With -f, follow until the job ends and exit with its status.",
    )
    p.add_argument("job_id", metavar="ID")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    _add_cluster(p)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("stop", help="stop a job", description="Stop every host of the job and release its slices.")
    p.add_argument("job_id", metavar="ID")
    _add_cluster(p)
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser(
        "sim",
        help="a multislice demo on a simulated fleet with injected preemptions",
        description="Run a multislice job on a simulated TPU fleet (real host processes) with injected "
        "preemptions and failures, showing every attempt as it ends. Faults are reproducible from --seed.",
        formatter_class=fmt,
        epilog=EPILOG,
    )
    p.add_argument("--tpu", metavar="TYPE", type=_tpu_arg, default="v4-16", help="TPU pod type (default v4-16)")
    p.add_argument("--slices", metavar="N", type=int, default=2, help="slices of the job and of the fleet (default 2)")
    p.add_argument("--preemptions", metavar="N", type=_positive_int, default=1, help="attempts to preempt (default 1)")
    p.add_argument("--failures", metavar="N", type=_positive_int, default=0, help="attempts to fail after those (default 0)")
    p.add_argument("--chaos", metavar="RATE", type=float, help="random preemptions instead: probability per slice per attempt")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault plan (default 0)")
    p.add_argument("--steps", type=int, default=6, help="training steps per attempt (default 6)")
    p.add_argument("--step-time", type=float, default=0.3, help="seconds per step (default 0.3)")
    p.add_argument("--max-retries-preemption", metavar="N", type=_positive_int, help="default: --preemptions")
    _add_cluster(p)
    p.set_defaults(func=cmd_sim)
    return parser


def _fail(command: str, e: BaseException) -> int:
    text = str(e) if not isinstance(e, KeyError) or e.args == () else str(e.args[0])
    text = " ".join(text.split("\n")[:1]) if isinstance(e, UsageError) else text.strip().replace("\n", " | ")
    print(f"fray {command}: error: {text}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fray`` console script. Returns the exit code (see ``fray --help``).

    >>> main(["list"])  # doctest: +SKIP
    0
    """
    from fray_core.errors import FrayError

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [_SUPERVISE]:
        return _supervise(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2, --help exits 0
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (UsageError, FrayError, ValueError, TypeError, KeyError) as e:
        if os.environ.get("FRAY_DEBUG"):
            raise
        return _fail(args.command, e)


def _exit(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())

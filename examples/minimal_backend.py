"""A minimal fray backend: what a new backend (Kubernetes, SkyPilot, ...) writes, and nothing more.

Two classes: a :class:`~fray_core.provider.SliceProvider` that runs every host as a subprocess on a fixed
pool of pretend TPU slices, and a :class:`~fray_core.cluster.Cluster` that runs each job with fray's GangRunner
in a thread and keeps its records in memory. All the policy (gangs, per-host env, retries, budgets, cancelling
siblings, classification) is the runner's. It passes the conformance kit (tests/test_minimal_backend.py).

    >>> cluster = MinimalCluster({"v4-16": 2})
    >>> job_id = cluster.launch(JobRequest(name="hi", entrypoint=Entrypoint.from_binary("true"),
    ...                                    resources=ResourceConfig.with_tpu("v4-16", slice_count=2)))
    >>> cluster.wait(job_id, timeout=60).status.value
    'SUCCEEDED'
    >>> cluster.close()
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import cloudpickle

from fray_core.cluster import Cluster
from fray_core.errors import JobNotFoundError, Unschedulable
from fray_core.provider import HostOutcome, HostOutcomeKind, HostRun, HostSpec, SliceLease, SliceProvider
from fray_core.records import new_job_id
from fray_core.runner import GangRunner, RetryPolicy
from fray_core.tpu import get_tpu_spec
from fray_core.types import Entrypoint, JobId, JobInfo, JobRequest, JobStatus, ResourceConfig, TpuConfig

# What a host process runs: load the entrypoint, run it, write ("ok", value) or ("error", text) atomically.
HOST_CODE = """
import os, sys, traceback, cloudpickle
entry = cloudpickle.load(open(sys.argv[1], "rb"))
def put(x):
    with open(sys.argv[2] + ".tmp", "wb") as f:
        cloudpickle.dump(x, f)
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
if entry.binary is not None:
    os.execvp(entry.command[0], entry.command)  # the host becomes the command: its exit (or signal) is ours
try:
    put(("ok", entry.callable(*entry.positional, **entry.function_args)))
except BaseException as e:
    put(("error", f"{type(e).__name__}: {e}\\n{traceback.format_exc()}"))
    sys.exit(1)
"""


class SlicePool:
    """The cluster's pretend TPU slices (``{"v4-16": 2}`` gives ``v4-16-0``, ``v4-16-1``), shared by its jobs."""

    def __init__(self, slices: dict[str, int]) -> None:
        self.free = {get_tpu_spec(t).name: [f"{t}-{i}" for i in range(n)] for t, n in slices.items()}
        self.type_of = {name: t for t, names in self.free.items() for name in names}
        self.kills: dict[str, list[Any]] = {}  # slice -> how to kill the hosts running on it (preempt)
        self.cond = threading.Condition()

    def take(self, tpu_type: str, counts: Sequence[int], deadline: float) -> list[str]:
        """All or nothing: the largest count in ``counts`` that is free, waiting until ``deadline``."""
        total = sum(t == tpu_type for t in self.type_of.values())
        if min(counts) > total:
            raise Unschedulable(f"asked: {min(counts)} x {tpu_type}; the pool has {total}", permanent=True)
        with self.cond:
            while True:
                free = self.free[tpu_type]
                fits = [c for c in counts if c <= len(free)]
                if fits:
                    got, self.free[tpu_type] = free[: fits[0]], free[fits[0] :]
                    return got
                if time.monotonic() >= deadline:
                    raise Unschedulable(f"asked: {'/'.join(map(str, counts))} x {tpu_type}; {len(free)} free")
                self.cond.wait(min(deadline - time.monotonic(), 0.5))

    def give(self, name: str) -> None:
        with self.cond:
            self.kills.pop(name, None)
            self.free[self.type_of[name]].append(name)
            self.cond.notify_all()

    def preempt(self, name: str, restore_after: float | None = 0.0) -> None:
        """Kill every host on the slice now (the slice comes back at once when its lease is released)."""
        with self.cond:
            kills = self.kills.pop(name, [])
        for kill in kills:
            kill()


@attrs.define(eq=False)
class _Host:
    proc: subprocess.Popen
    result: str
    log: str
    cancelled: bool = False
    lost: bool = False
    reported: bool = False

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the host and whatever it started
        except ProcessLookupError:
            pass
        self.proc.wait()


class SubprocessProvider(SliceProvider):
    """One job's slices (from the pool) and hosts (one subprocess each, in its own process group)."""

    def __init__(self, pool: SlicePool, job_dir: str) -> None:
        self.pool = pool
        self.job_dir = job_dir
        self.hosts: list[_Host] = []

    def acquire(self, resources: ResourceConfig, counts: Sequence[int], deadline: float) -> list[SliceLease]:
        dev = resources.device
        if not isinstance(dev, TpuConfig):  # a CPU/GPU gang: one pseudo-slice of `replicas` processes
            n = int(resources.replicas)  # type: ignore[arg-type]
            return [SliceLease(name="gang", device_type=dev.kind, hosts=n, host_addresses=("127.0.0.1",) * n)]
        spec = get_tpu_spec(dev.type)
        names, addrs = self.pool.take(spec.name, counts, deadline), ("127.0.0.1",) * spec.hosts
        return [
            SliceLease(name=n, device_type=spec.name, hosts=spec.hosts, host_addresses=addrs, handle=[n]) for n in names
        ]

    def start(self, lease: SliceLease, hosts: list[HostSpec], entrypoint: Entrypoint) -> list[HostRun]:
        payload = os.path.join(self.job_dir, f"entry-a{hosts[0].attempt}.pkl")
        with open(payload, "wb") as f:
            cloudpickle.dump(entrypoint, f)
        runs: list[HostRun] = []
        try:
            for spec in hosts:
                name = f"a{spec.attempt}-s{spec.slice_index}-h{spec.host_index}"
                result, log = os.path.join(self.job_dir, name + ".result"), os.path.join(self.job_dir, name + ".log")
                env = {**os.environ, **spec.env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
                with open(log, "wb") as out:
                    proc = subprocess.Popen(
                        [sys.executable, "-c", HOST_CODE, payload, result],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                host = _Host(proc, result, log)
                self.hosts.append(host)
                runs.append(HostRun(lease, spec.slice_index, spec.host_index, handle=host))
                if lease.handle is not None:
                    with self.pool.cond:
                        self.pool.kills.setdefault(lease.name, []).append(lambda host=host: self._lose(host))
        except BaseException:  # all or nothing: stop the hosts this call started
            for run in runs:
                run.handle.kill()
            raise
        return runs

    @staticmethod
    def _lose(host: _Host) -> None:
        host.lost = True
        host.kill()

    def wait_any(self, runs: list[HostRun], timeout: float) -> list[HostOutcome]:
        deadline = time.monotonic() + timeout
        while True:
            ended = [r for r in runs if not r.handle.reported and r.handle.proc.poll() is not None]
            if ended or time.monotonic() >= deadline:
                for r in ended:
                    r.handle.reported = True
                return [self._outcome(r) for r in ended]
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    @staticmethod
    def _outcome(run: HostRun) -> HostOutcome:
        host: _Host = run.handle
        if host.lost:
            return HostOutcome(run, HostOutcomeKind.PREEMPTED, error=f"Preempted: slice {run.lease.name} was preempted")
        if host.cancelled:
            return HostOutcome(run, HostOutcomeKind.CANCELLED)
        if os.path.exists(host.result):
            with open(host.result, "rb") as f:
                status, value = cloudpickle.load(f)
            if status == "ok":
                return HostOutcome(run, HostOutcomeKind.SUCCEEDED, result=value)
            return HostOutcome(run, HostOutcomeKind.FAILED, error=value)
        if host.proc.returncode == 0:
            return HostOutcome(run, HostOutcomeKind.SUCCEEDED)
        with open(host.log, errors="replace") as f:
            tail = "".join(f.readlines()[-20:])
        rc = host.proc.returncode  # a signal by its name, as every backend says it (killed by SIGKILL)
        end = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        return HostOutcome(run, HostOutcomeKind.FAILED, error=f"CommandFailed: {end}; last output:\n{tail}")

    def cancel(self, runs: list[HostRun], grace: float | None = None) -> None:
        live = [r.handle for r in runs if r.handle.proc.poll() is None]
        for host in live:
            host.cancelled = True
            try:
                os.killpg(host.proc.pid, signal.SIGTERM)  # ask first: `grace` seconds to checkpoint
            except ProcessLookupError:
                pass
        end = time.monotonic() + (grace or 0.0)
        for host in live:
            try:
                host.proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            host.kill()

    def release(self, leases: list[SliceLease]) -> None:
        for lease in leases:
            if lease.handle:  # a TPU lease: handle is [name] until released, [] after
                self.pool.give(lease.handle.pop())

    def close(self) -> None:
        for host in self.hosts:
            if host.proc.poll() is None:
                host.kill()


@attrs.define(eq=False)
class _Job:
    runner: GangRunner
    provider: SubprocessProvider
    thread: threading.Thread | None = None


class MinimalCluster(Cluster):
    """Jobs run by :class:`GangRunner` threads on a :class:`SlicePool`; records kept in memory."""

    runs_on_this_machine = True

    def __init__(self, slices: dict[str, int], retry_policy: RetryPolicy | None = None) -> None:
        self.pool = SlicePool(slices)
        self.policy = retry_policy or RetryPolicy(backoff_initial=0.05, backoff_max=0.2, poll_interval=0.1)
        self.root = tempfile.mkdtemp(prefix="fray-minimal-")
        self.jobs: dict[str, _Job] = {}

    def launch(self, request: JobRequest) -> JobId:
        if not isinstance(request, JobRequest):
            raise TypeError(f"launch: expected a JobRequest, got {request!r}")
        try:  # bad input fails here, in the caller, not in a host
            cloudpickle.dumps(request.entrypoint)
        except Exception as e:
            raise TypeError(f"Entrypoint.callable: {request.entrypoint.callable!r} cannot be pickled: {e}") from None
        job_id = new_job_id(request.name)
        os.makedirs(os.path.join(self.root, job_id))
        provider = SubprocessProvider(self.pool, os.path.join(self.root, job_id))
        info = JobInfo(job_id=job_id, name=request.name, status=JobStatus.PENDING, backend="minimal")
        job = _Job(GangRunner(job_id, request, provider, policy=self.policy, info=info), provider)
        job.thread = threading.Thread(target=self._run, args=(job,), daemon=True, name=f"fray-{job_id}")
        self.jobs[job_id] = job
        job.thread.start()
        return job_id

    @staticmethod
    def _run(job: _Job) -> None:
        try:
            job.runner.run()
        except BaseException as e:  # a bug must not leave the job RUNNING
            job.runner.info.status, job.runner.info.error = JobStatus.FAILED, f"internal error: {e!r}"
        finally:
            job.provider.close()

    def _job(self, job_id: JobId | str) -> _Job:
        try:
            return self.jobs[str(job_id)]
        except KeyError:
            raise JobNotFoundError(f"no job {job_id!r} on this cluster") from None

    def poll(self, job_id: JobId | str) -> JobInfo:
        info = self._job(job_id).runner.info
        return attrs.evolve(info, attempts=[attrs.evolve(a) for a in info.attempts])

    def terminate(self, job_id: JobId | str) -> None:
        job = self._job(job_id)
        job.runner.stop()
        assert job.thread is not None
        job.thread.join(60)

    def list_jobs(self) -> list[JobInfo]:
        return sorted((self.poll(j) for j in list(self.jobs)), key=lambda i: i.submitted_at)

    def logs(self, job_id: JobId | str, follow: bool = False) -> Iterator[str]:
        job_dir = os.path.join(self.root, str(self._job(job_id).runner.job_id))
        for name in sorted(n for n in os.listdir(job_dir) if n.endswith(".log")):
            with open(os.path.join(job_dir, name), errors="replace") as f:
                yield from (f"[{name[:-4]}] {line.rstrip()}" for line in f)

    def close(self) -> None:
        for job_id, job in list(self.jobs.items()):
            if not job.runner.info.status.is_terminal():
                self.terminate(job_id)
        shutil.rmtree(self.root, ignore_errors=True)

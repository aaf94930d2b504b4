"""``LocalCluster``: every job runs for real in subprocesses on this machine; TPU slices are simulated.

::

    from fray_local import LocalCluster, TpuFleet

    cluster = LocalCluster(fleet=TpuFleet({"v4-16": 2}))
    job_id = cluster.launch(JobRequest(name="train", entrypoint=Entrypoint(callable=train),
                                       resources=ResourceConfig.with_tpu("v4-16", slice_count=2)))
    info = cluster.wait(job_id, timeout=120)
    info.result            # one entry per host, in (slice, host) order
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import cloudpickle

from fray_core._scratch import scratch_dir
from fray_core.cluster import check_spec_keys
from fray_core.errors import FrayError, RecordError
from fray_core.joblog import LogSink
from fray_core.limits import check_flag, check_number, check_path
from fray_core.records import JobStore, owner_info, pid_alive
from fray_core.request import GpuConfig, JobRequest, TpuConfig
from fray_core.runner import RetryPolicy
from fray_core.status import JobId, JobInfo, JobStatus, summarize_request
from fray_core.supervisor import RecordCluster, Supervisor, check_picklable, launch_error
from fray_local import _gpu
from fray_local._detached import SYS_PATH_ENV
from fray_local.fleet import TpuFleet, parse_fleet
from fray_local.provider import HostBudget, LocalSliceProvider

if TYPE_CHECKING:
    from fray_core.context import JobContext

__all__ = [
    "LocalCluster",
    "LocalClusterConfig",
    "DEFAULT_LOCAL_POLICY",
    "check_picklable",
]  # check_picklable: moved to fray_core.supervisor

DEFAULT_LOCAL_POLICY = RetryPolicy(
    backoff_initial=0.2, backoff_max=5.0, schedule_timeout=300.0, poll_interval=0.2, cancel_grace=5.0
)


def check_environment(request: JobRequest) -> None:
    """The local backend installs nothing: warn about pip packages this Python does not have, and
    reject a workspace that does not exist."""
    env = request.environment
    if env is None:
        return
    if env.workspace is not None and not os.path.isdir(env.workspace):
        raise ValueError(f"EnvironmentConfig.workspace: {env.workspace!r} is not a directory")
    missing = []
    for spec in env.pip_packages:
        name = re.split(r"[\s\[<>=!~;@]", spec.strip(), maxsplit=1)[0]
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(spec)
    if missing:
        warnings.warn(
            f"EnvironmentConfig.pip_packages: {', '.join(map(repr, missing))} not installed in {sys.executable}; "
            "the local backend does not install packages (the Ray backend does, through runtime_env)",
            stacklevel=3,
        )


def _check_fleet(field: str, value: Any) -> None:
    # a fleet of another kind failed at the first TPU launch (an AttributeError inside the provider)
    if value is not None and not isinstance(value, TpuFleet):
        raise TypeError(f"{field}: expected a TpuFleet({{'v4-16': 2}}) or None (slices made on demand), got {value!r}")


def _check_policy(field: str, value: Any) -> None:
    # read by every job's runner: a wrong kind failed inside the first job's thread
    if value is not None and not isinstance(value, RetryPolicy):
        raise TypeError(f"{field}: expected a RetryPolicy(...) or None (DEFAULT_LOCAL_POLICY), got {value!r}")


# Memory the local backend allows each host process when it bounds a job's hosts (``default_max_hosts``): a
# CPU replica's guardian and worker measured ~17 MiB PSS together (bench/NOTES.md, 2026-12-07), twice that for
# what the job's own code loads. Not a reservation: a job that loads more is not refused for it.
HOST_MEMORY = 32 * 2**20
MAX_HOSTS_SPEC = "max_hosts"  # the cluster spec's option: local?max_hosts=N


def default_max_hosts() -> int:
    """The most host processes a ``LocalCluster``'s jobs run at once on this machine: its memory at
    :data:`HOST_MEMORY` a host, and a quarter of its process limits (the kernel's ``pid_max`` and this
    user's ``RLIMIT_NPROC``: each host is a guardian, a worker and whatever the job forks), at least 1.

    A cluster-sized request run on a laptop (``v4-2048`` x 4 is 1,024 hosts; ``fray sim --slices 10000``
    20,000) forked until memory or pids ran out, then retried every host that could not start as a
    preemption. ``LocalCluster(max_hosts=N)`` (or ``local?max_hosts=N``) sets another bound.

    >>> default_max_hosts() >= 1
    True
    """
    bounds = []
    try:
        bounds.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // HOST_MEMORY)
    except (ValueError, OSError):
        pass
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            bounds.append(int(f.read()) // 4)
    except (OSError, ValueError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        if soft != resource.RLIM_INFINITY:
            bounds.append(soft // 4)
    except (ImportError, OSError, ValueError):
        pass
    return max(1, min(bounds)) if bounds else 4096


def check_max_hosts(request: JobRequest, max_hosts: int, field: str = "LocalCluster(max_hosts=...)") -> None:
    """Refuse, in the caller, a job that starts more host processes at once than ``max_hosts``, naming the
    request's shape, the bound and how to change it. A job is checked by its fewest slices (or replicas)."""
    res = request.resources
    dev = res.device
    fewest = min(res.replica_counts)
    hosts = fewest * res.hosts_per_replica
    if hosts <= max_hosts:
        return
    if isinstance(dev, TpuConfig):
        shape = f"{fewest:,} x {dev.type} ({dev.hosts:,} host{'s' if dev.hosts != 1 else ''} a slice)"
        field_name, lower = "ResourceConfig.replicas (slices)", "fewer slices or a smaller TPU type"
        if len(res.replica_counts) > 1:
            shape = f"at least {shape}"
    else:
        shape = f"{fewest:,} replicas"
        field_name, lower = "ResourceConfig.replicas", "fewer replicas"
    raise ValueError(
        f"launch: {field_name}: {shape} is {hosts:,} host processes at once; the local backend runs at most "
        f"{max_hosts:,} at once on this machine; ask for {lower}, or raise the bound with {field}"
    )


def _check_max_hosts(field: str, value: Any) -> int | None:
    if value is None:
        return None
    return int(check_number(field, value, minimum=1, integer=True))


def _jobs_dir(field: str, value: Any) -> str | None:
    """A jobs dir given as a path, a ``pathlib.Path`` or an fsspec URL (a str), or None (the default)."""
    return check_path(field, value, what="a directory path or URL")


@attrs.frozen
class LocalClusterConfig:
    """``LocalCluster``'s settings as one value (marin's ``LocalCluster(LocalClusterConfig(...))``).

    - ``log_to``: where ``monitor`` shows the job's output by default: ``"stdout"`` (Fray's default) or
      ``"logging"`` (marin's: ``[replica-N] line`` through Python logging, see ``LoggingMonitorView``).
    - ``use_isolated_env``: marin's per-job venv; only ``False`` is supported (jobs use this Python).
    - ``max_hosts``: the most host processes the cluster's jobs run at once (default :func:`default_max_hosts`).

    >>> LocalCluster(LocalClusterConfig(log_to="logging")).log_to
    'logging'
    """

    fleet: TpuFleet | None = attrs.field(
        default=None, validator=lambda _i, _a, v: _check_fleet("LocalClusterConfig.fleet", v)
    )
    jobs_dir: str | None = attrs.field(default=None, converter=lambda v: _jobs_dir("LocalClusterConfig.jobs_dir", v))
    retry_policy: RetryPolicy | None = attrs.field(
        default=None, validator=lambda _i, _a, v: _check_policy("LocalClusterConfig.retry_policy", v)
    )
    log_to: str = attrs.field(default="stdout")
    use_isolated_env: bool = attrs.field(
        default=False, validator=lambda _i, _a, v: check_flag("LocalClusterConfig.use_isolated_env", v)
    )
    max_hosts: int | None = attrs.field(
        default=None, converter=lambda v: _check_max_hosts("LocalClusterConfig.max_hosts", v)
    )

    @log_to.validator
    def _check_log_to(self, _a: attrs.Attribute, value: Any) -> None:
        if value not in ("stdout", "logging"):
            raise ValueError(f"LocalClusterConfig.log_to: expected 'stdout' or 'logging', got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.use_isolated_env:
            raise ValueError(
                "LocalClusterConfig.use_isolated_env: True is not supported (the local backend runs jobs with this "
                "Python and installs nothing); list the packages in EnvironmentConfig.pip_packages and use the Ray "
                "backend to install them. Allowed: False"
            )


class LocalCluster(RecordCluster):
    """Runs jobs as subprocesses of this process (one per replica, or one per TPU host).

    - ``fleet``: the simulated TPU fleet that serves TPU requests; by default slices are made on demand.
    - ``jobs_dir``: where job records and logs go (any fsspec URL; default ``$FRAY_JOBS_DIR`` or
      ``~/.cache/fray/jobs``). Another ``LocalCluster`` (or process) with the same dir sees the jobs.
    - ``retry_policy``: backoff and deadlines of the shared runner.
    - ``max_hosts``: the most host processes this cluster's jobs run at once, together (default
      :func:`default_max_hosts`: this machine's memory and process limits). A job that needs more on its own
      is refused at ``launch``; jobs that fit wait in line for their hosts (PENDING, saying so), first come,
      first served, as for a fleet's slices.
    """

    session_transport = "unix"  # held sessions (Cluster.hold): every host runs on this machine

    def __init__(
        self,
        fleet: TpuFleet | None = None,
        jobs_dir: str | None = None,
        retry_policy: RetryPolicy | None = None,
        config: LocalClusterConfig | None = None,
        max_hosts: int | None = None,
    ) -> None:
        if isinstance(fleet, LocalClusterConfig):  # marin's LocalCluster(LocalClusterConfig(...))
            fleet, config = None, fleet
        # checked before anything is made, naming the argument: each failed only when first used (jobs_dir=5
        # as an AttributeError from str.rstrip, a fleet of another kind at the first TPU launch)
        if config is not None and not isinstance(config, LocalClusterConfig):
            raise TypeError(f"LocalCluster.config: expected a LocalClusterConfig(...) or None, got {config!r}")
        _check_fleet("LocalCluster.fleet", fleet)
        jobs_dir = _jobs_dir("LocalCluster.jobs_dir", jobs_dir)
        _check_policy("LocalCluster.retry_policy", retry_policy)
        max_hosts = _check_max_hosts("LocalCluster.max_hosts", max_hosts)
        if config is not None:
            fleet, jobs_dir = fleet or config.fleet, jobs_dir or config.jobs_dir
            retry_policy = retry_policy or config.retry_policy
            max_hosts = max_hosts or config.max_hosts
        self._max_hosts_given = max_hosts  # passed on to a detached supervisor (launch_detached)
        self.max_hosts = max_hosts or default_max_hosts()
        self._budget = HostBudget(self.max_hosts)  # every job's hosts at once, together
        self.log_to = config.log_to if config is not None else "stdout"
        self.fleet = fleet if fleet is not None else TpuFleet(on_demand=True)
        self.store = JobStore(jobs_dir)
        self.policy = retry_policy or DEFAULT_LOCAL_POLICY
        self.spec = "local"
        self.runs_on_this_machine = True
        self._jobs: dict[str, Supervisor] = {}
        self._lock = threading.Lock()
        self._spool_dir: str | None = None  # per-job scratch files, made on the first launch
        self._spool_cleanup: weakref.finalize | None = None
        self._owner = owner_info()
        self._watcher: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"LocalCluster(fleet={self.fleet!r}, jobs_dir={self.store.root!r})"

    # ---------------------------------------------------------------------------------------- launch

    def launch(self, request: JobRequest) -> JobId:
        if not isinstance(request, JobRequest):
            raise TypeError(f"launch: expected a JobRequest, got {request!r}")
        check_picklable(request)
        check_environment(request)
        check_max_hosts(request, self.max_hosts)
        gpu_devices = None
        if isinstance(request.resources.device, GpuConfig):
            replicas = request.resources.replicas
            gpu_devices = _gpu.assign(
                request.resources.device, replicas[0] if isinstance(replicas, tuple) else int(replicas)
            )
        # Threads first: a process that cannot start one fails here, before anything is recorded.
        self._ensure_watcher()
        try:
            job_id = self.store.new_job(request.name)  # the job's dir (created exclusively), log and reserve
        except OSError as e:  # nothing is left of it (new_job cleans up)
            raise launch_error(e, self.store) from None
        job_dir = None
        log = None
        try:
            job_dir = os.path.join(self._spool(), job_id)
            os.makedirs(job_dir)
            log_path = self.store.log_path(job_id) if self.store.is_local else os.path.join(job_dir, "job.log")
            log = LogSink(log_path)
            env = request.environment
            info = JobInfo(
                job_id=job_id,
                name=request.name,
                status=JobStatus.PENDING,
                backend="local",
                request_summary=summarize_request(request),
            )
            provider = LocalSliceProvider(
                self.fleet, job_id, job_dir, log, workspace=env.workspace if env else None, gpu_devices=gpu_devices,
                submitted_at=info.submitted_at, budget=self._budget,
            )  # fmt: skip
            sup = Supervisor(
                self.store, request, provider, log, info=info, policy=self.policy,
                owner={"owner": self._owner, "host": socket.gethostname()}, label="local", cleanup=provider.kill_all,
            )  # fmt: skip
            with self._lock:
                self._jobs[job_id] = sup
            sup.start()  # the PENDING record, and the runner in its thread: both or neither
        except BaseException as e:
            with self._lock:
                self._jobs.pop(job_id, None)
            if log is not None:
                log.close()
            if job_dir is not None:
                shutil.rmtree(job_dir, ignore_errors=True)
            self.store.discard(job_id)
            err = launch_error(e, self.store)
            if err is e:
                raise
            raise err from None
        return job_id

    def launch_detached(self, request: JobRequest) -> JobId:
        """Launch through a detached supervisor process (``python -m fray_local._detached SPEC``, its own
        session) that lives until the job ends, so the job outlives this process; returns the job id.

        The supervisor rebuilds the cluster from ``self.spec``, with this cluster's jobs dir (the record
        goes where ``self.store`` is); a fleet passed as an object is not shared with it.
        """
        if not isinstance(request, JobRequest):
            raise TypeError(f"launch_detached: expected a JobRequest, got {request!r}")
        check_max_hosts(request, self.max_hosts)  # here, in the caller, not in the supervisor process
        protocols = self.store.fs.protocol if isinstance(self.store.fs.protocol, tuple) else (self.store.fs.protocol,)
        if "memory" in protocols:
            raise ValueError(
                f"jobs dir {self.store.root!r} lives in one process's memory: a job launched to outlive this "
                "process would keep its record where no other process (`fray status`, `fray logs`) can see it; "
                "use a directory or a shared URL (FRAY_JOBS_DIR=/path or gs://bucket/fray)"
            )
        try:
            payload = cloudpickle.dumps(request)
        except Exception as e:
            raise TypeError(f"the job's entrypoint cannot be pickled: {type(e).__name__}: {e}") from None
        env = dict(os.environ)
        # the supervisor rebuilds the cluster from its spec: it must use this cluster's store, not the default
        env["FRAY_JOBS_DIR"] = self.store.root
        env["FRAY_JOBS_SHARED"] = "1" if self.store.shared else "0"
        env[SYS_PATH_ENV] = json.dumps([os.getcwd()] + [p for p in sys.path if p])
        proc = subprocess.Popen(
            [sys.executable, "-m", "fray_local._detached", self._detached_spec()],
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
                warnings.warn(msg["warning"], stacklevel=2)
            elif "error" in msg:
                proc.wait()
                raise FrayError(msg["error"])
            elif "job_id" in msg:
                job_id = msg["job_id"]
                break
        proc.stdout.close()
        if job_id is None:
            raise FrayError(f"the job's supervisor process exited (code {proc.wait()}) before launching the job")
        proc.returncode = 0  # detached on purpose: do not warn that it is still running
        return JobId(job_id)

    def _detached_spec(self) -> str:
        """This cluster's spec for a detached supervisor, with the ``max_hosts`` this object was given."""
        spec = self.spec or "local"
        if self._max_hosts_given is None or f"{MAX_HOSTS_SPEC}=" in spec:
            return spec
        return f"{spec}{'&' if '?' in spec else '?'}{MAX_HOSTS_SPEC}={self._max_hosts_given}"

    def _spool(self) -> str:
        with self._lock:
            if self._spool_dir is None:
                self._spool_dir = scratch_dir("fray-local-")
                # removed by close(), else when this object is collected or the interpreter exits
                self._spool_cleanup = weakref.finalize(self, shutil.rmtree, self._spool_dir, True)
            return self._spool_dir

    # ------------------------------------------------------------------------------------------ poll

    def live_info(self, job_id: str) -> JobInfo | None:
        job = self._jobs.get(job_id)
        if job is None:
            return None
        info = attrs.evolve(job.info, attempts=[attrs.evolve(a) for a in job.info.attempts])
        if info.kind == "session":  # its calls are counted by the session's client, beside the record
            info.calls = self.store.read_calls(job_id)
        return info

    def owner_gone(self, info: JobInfo, record: dict[str, Any]) -> str | None:
        """A job supervised by a process of this machine that died is FAILED, whatever its record says."""
        owner = record.get("owner")
        if owner is not None and (not isinstance(owner, dict) or not isinstance(owner.get("pid", 0), int)):
            raise RecordError(
                f"job {info.job_id}: record cannot be read: field 'owner': expected an object, got {owner!r}"
            )
        if not self._owner_dead(record):
            return None
        owner = owner or {}
        return (
            f"the process that supervised this job (pid {owner.get('pid')} on {owner.get('host')}) died "
            "before the job ended; its hosts were stopped with it"
        )

    @staticmethod
    def _owner_dead(record: dict[str, Any]) -> bool:
        owner = record.get("owner") or {}
        if owner.get("host") != socket.gethostname() or not owner.get("pid"):
            return False  # another machine's job: we cannot tell, trust the record
        started = owner.get("started")
        ticks = owner.get("start_ticks")
        return not pid_alive(
            int(owner["pid"]),
            started=float(started) if isinstance(started, (int, float)) else None,
            start_ticks=ticks if isinstance(ticks, int) and not isinstance(ticks, bool) else None,
        )

    # ------------------------------------------------------------------------------------- terminate

    def terminate(self, job_id: JobId | str) -> None:
        job = self._jobs.get(str(job_id))
        if job is not None:
            job.runner.stop()
            if not job.done.wait(60):
                job.provider.kill_all()  # type: ignore[attr-defined]
                raise FrayError(f"terminate: job {job_id} did not stop within 60 s; its processes were killed")
            return
        info, record = self.store.read_info(str(job_id))
        if info.status.is_terminal():
            return
        if self._owner_dead(record):
            return
        # Another live process supervises it: ask it to stop through the store and wait for it to.
        self.store.fs.touch(f"{self.store._p(str(job_id))}/stop")
        deadline = 60.0
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.poll(job_id).status.is_terminal():
                return
            time.sleep(0.1)
        raise FrayError(
            f"terminate: job {job_id} (supervised by pid {record.get('owner', {}).get('pid')}) did not "
            f"stop within {deadline:.0f} s"
        )

    def _ensure_watcher(self) -> None:
        """One thread per cluster honours stop requests written by other processes (``fray stop``)."""
        with self._lock:
            if self._watcher is not None:
                return
            self._watcher = threading.Thread(target=self._watch_stops, daemon=True, name="fray-stop-watcher")
            self._watcher.start()

    def _watch_stops(self) -> None:
        while True:
            with self._lock:
                active = [j for j in self._jobs.values() if not j.done.is_set()]
            for job in active:
                if self.store.fs.exists(f"{self.store._p(job.job_id)}/stop"):
                    job.runner.stop()
            threading.Event().wait(0.25)

    # ------------------------------------------------------------------------------------------ logs

    def _block(self, job_ids: Sequence[str], timeout: float) -> None:
        local = [self._jobs[j] for j in job_ids if j in self._jobs]
        if local:
            local[0].done.wait(timeout)
        else:
            super()._block(job_ids, timeout)

    def close(self) -> None:
        """Stop every job this object launched and remove its temporary files (also when a job does not stop)."""
        try:
            for job_id, job in list(self._jobs.items()):
                if not job.done.is_set():
                    self.terminate(job_id)
        finally:
            self.fleet.close()
            if self._spool_cleanup is not None:
                self._spool_cleanup()

    def job_context(self) -> JobContext:
        """Small tasks (``fray_job_ctx()``) run in threads of this process: every host runs on this machine."""
        from fray_core.context import LocalJobContext

        return LocalJobContext.shared()


def max_hosts_of_spec(params: dict[str, str]) -> int | None:
    """The spec's ``max_hosts`` option (``local?max_hosts=2000``), or ``None`` (the machine's default)."""
    raw = params.get(MAX_HOSTS_SPEC)
    if not raw:
        return None
    if not raw.isdecimal() or len(raw) > 9 or int(raw) < 1:
        raise ValueError(f"cluster spec for 'local': {MAX_HOSTS_SPEC}: expected an int >= 1, got {raw!r}")
    return int(raw)


def _from_spec(params: dict[str, str]) -> LocalCluster:
    """``local``, ``local?tpu=v4-16:2,v5litepod-4:4``, ``local?jobs_dir=/tmp/jobs``, ``local?max_hosts=2000``."""
    check_spec_keys(params, ["tpu", "jobs_dir", MAX_HOSTS_SPEC], "local")
    max_hosts = max_hosts_of_spec(params)
    fleet = TpuFleet(parse_fleet(params["tpu"])) if params.get("tpu") else None
    return LocalCluster(fleet=fleet, jobs_dir=params.get("jobs_dir") or None, max_hosts=max_hosts)

"""The backend contract (:class:`Cluster`), backend resolution and ``current_cluster()``.

A backend implements five verbs: ``launch``, ``poll``, ``terminate``, ``list_jobs``, ``logs``. ``wait`` and
``monitor`` are written once here. Backends register by name (a small table plus the ``fray.backends``
entry-point group) and are imported lazily, so ``import fray_core`` never imports ray.

Example::

    from fray_core import current_cluster, using_cluster
    from fray_local import LocalCluster

    with using_cluster(LocalCluster(jobs_dir="/tmp/fray-jobs")):
        cluster = current_cluster()          # the LocalCluster above
        job_id = cluster.launch(request)
        info = cluster.wait(job_id, timeout=60)
"""

from __future__ import annotations

import abc
import collections
import contextlib
import contextvars
import importlib
import logging
import os
import queue
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO, overload

from fray_core.errors import FrayError, JobFailedError, ResultUnavailableError, UnknownBackendError, WaitTimeoutError
from fray_core.limits import check_seconds
from fray_core.request import JobRequest
from fray_core.status import Attempt, JobId, JobInfo, JobStatus

if TYPE_CHECKING:
    from fray_core.context import JobContext
    from fray_core.request import EnvironmentConfig, ResourceConfig
    from fray_core.session import Session

__all__ = [
    "Cluster",
    "LoggingMonitorView",
    "MonitorView",
    "cluster_from_spec",
    "create_job_ctx",
    "current_cluster",
    "fray_job_ctx",
    "get_default_job_ctx",
    "parse_spec",
    "register_backend",
    "set_current_cluster",
    "using_cluster",
]


class Cluster(abc.ABC):
    """Where jobs run. Backends implement the five abstract verbs; ``wait``/``monitor`` are shared."""

    #: the spec string that recreates this cluster (``local``, ``ray?address=...``)
    spec: str = ""
    #: a launched job keeps running when this client process exits (Ray: a detached supervisor actor), so
    #: the default :meth:`launch_detached` just launches
    jobs_outlive_client: bool = False
    #: the job's processes run on this machine (the CLI checks that a script or command exists here)
    runs_on_this_machine: bool = False

    @abc.abstractmethod
    def launch(self, request: JobRequest) -> JobId:
        """Validate, persist a record and start the job; returns its id at once."""

    @abc.abstractmethod
    def poll(self, job_id: JobId | str) -> JobInfo:
        """The job's current state; raises :class:`~fray_core.errors.JobNotFoundError` for unknown ids."""

    @abc.abstractmethod
    def terminate(self, job_id: JobId | str) -> None:
        """Stop every host of the job and release every slice; the job ends STOPPED."""

    @abc.abstractmethod
    def list_jobs(self) -> list[JobInfo]:
        """Every job this cluster knows, oldest first."""

    @abc.abstractmethod
    def logs(self, job_id: JobId | str, follow: bool = False) -> Iterator[str]:
        """The job's output lines, each prefixed with its host tag (``[s0/h1]``, ``[r0]``)."""

    def result(self, job_id: JobId | str) -> list[Any]:
        """The results of a SUCCEEDED job, one entry per process in (slice, host) order, loaded now.

        Listing and polling never unpickle; this (or ``info.result``) is where results are loaded. Raises
        :class:`~fray_core.errors.ResultUnavailableError` when the job did not succeed or its results cannot
        be loaded (the message says why), :class:`~fray_core.errors.UnsafeJobsDirError` when the jobs dir is
        not safe to unpickle from.

        >>> cluster.result(job_id)  # doctest: +SKIP
        [{'loss': 0.12}, {'loss': 0.12}]
        """
        info = self.poll(job_id)
        if info.status is not JobStatus.SUCCEEDED:
            raise ResultUnavailableError(
                f"job {info.job_id} is {info.status.value}: only a SUCCEEDED job has results"
                + (f" (error: {info.error})" if info.error and info.status.is_terminal() else "")
            )
        result = info.result
        if result is None:  # a backend that attaches no results to a SUCCEEDED job
            raise ResultUnavailableError(f"job {info.job_id}: no results were recorded")
        return result

    def launch_detached(self, request: JobRequest) -> JobId:
        """Launch a job that keeps running after this process exits (what ``fray launch`` does).

        Backends whose jobs already outlive the client (``jobs_outlive_client``) just launch; others
        override this (the local backend hands the job to a detached supervisor process) or refuse.

        >>> job_id = cluster.launch_detached(request)  # doctest: +SKIP
        """
        if self.jobs_outlive_client:
            return self.launch(request)
        raise FrayError(
            f"{type(self).__name__} cannot keep a job running after the launching process exits (it has no "
            "detached launch); launch it with the Python API (cluster.launch + cluster.wait) in a process that stays"
        )

    #: how a held session's host workers reach this client: ``"unix"`` (every host runs on this machine: a Unix
    #: socket in a private dir), ``"tcp"`` (hosts on other machines: TCP on this machine's address), ``None``
    #: (``hold`` is not supported). Both are authenticated (HMAC challenge with a per-session key).
    session_transport: str | None = None

    def hold(
        self,
        resources: ResourceConfig,
        *,
        max_retries_preemption: int = 100,
        max_retries_failure: int = 0,
        fresh_process: bool = False,
        name: str | None = None,
        environment: EnvironmentConfig | None = None,
        timeout: float | None = None,
    ) -> Session:
        """Acquire ``resources`` once and keep one worker process per host: a :class:`~fray_core.session.Session`
        (a context manager) whose ``run``/``submit`` send calls to every host. The session is a job (kind
        ``session``) run by the shared runner, with these retry budgets; see :mod:`fray_core.session`.
        Returns once the slices are held and every host's worker is up; ``timeout`` (seconds) bounds that wait
        (the session is then stopped and :class:`~fray_core.errors.WaitTimeoutError` raised).

        >>> with cluster.hold(ResourceConfig.with_tpu("v4-16", slice_count=2)) as session:  # doctest: +SKIP
        ...     session.run(init_model); session.run(rollout, 8)
        """
        if self.session_transport is None:
            raise NotImplementedError(f"hold: {type(self).__name__} does not support held sessions yet")
        from fray_core.session import open_session

        return open_session(
            self,
            resources,
            max_retries_preemption=max_retries_preemption,
            max_retries_failure=max_retries_failure,
            fresh_process=fresh_process,
            name=name,
            environment=environment,
            timeout=timeout,
        )

    def job_context(self) -> JobContext:
        """The context for small tasks (``fray_job_ctx()``) on this backend.

        No default: threads of the launching process are right only for a backend whose hosts run on this
        machine (``LocalCluster`` returns :class:`~fray_core.context.LocalJobContext`), so a remote backend
        that does not say where its tasks run fails here rather than running them in the launcher.
        """
        raise NotImplementedError(
            f"job_context: {type(self).__name__} does not say where fray_job_ctx() tasks run; a backend implements "
            "job_context() (fray_core.context.LocalJobContext.shared() runs them in threads of this process)"
        )

    def close(self) -> None:
        """Release client-side resources (threads, connections). Jobs keep running where they can."""

    # ------------------------------------------------------------------------------- shared behaviour

    def _block(self, job_ids: Sequence[str], timeout: float) -> None:
        """Wait up to ``timeout`` for a change in any of ``job_ids``; backends may wait on an event."""
        time.sleep(min(timeout, 0.1))

    @overload
    def wait(self, job_ids: JobId | str, timeout: float | None = ..., raise_on_failure: bool = ...) -> JobInfo: ...

    @overload
    def wait(
        self, job_ids: Sequence[JobId | str], timeout: float | None = ..., raise_on_failure: bool = ...
    ) -> list[JobInfo]: ...

    def wait(
        self,
        job_ids: JobId | str | Sequence[JobId | str],
        timeout: float | None = None,
        raise_on_failure: bool = False,
    ) -> JobInfo | list[JobInfo]:
        """Block until the job(s) end; returns their final :class:`JobInfo` (a list for a list of ids).

        ``timeout`` (seconds) raises :class:`~fray_core.errors.WaitTimeoutError` when reached; the job keeps
        running. ``raise_on_failure`` raises :class:`~fray_core.errors.JobFailedError` for a job that ended
        FAILED or STOPPED.

        >>> info = cluster.wait(job_id, timeout=600, raise_on_failure=True)  # doctest: +SKIP
        """
        timeout = check_seconds("wait: timeout", timeout)
        single = isinstance(job_ids, str)
        try:
            given = [job_ids] if single else list(job_ids)  # type: ignore[arg-type]
        except TypeError:
            given = [job_ids]
        if not single and (isinstance(job_ids, bytes) or not all(isinstance(j, str) for j in given)):
            raise TypeError(f"wait: job_ids: expected a job id (str) or a list of job ids, got {job_ids!r}")
        ids = [str(j) for j in given]
        deadline = None if timeout is None else time.monotonic() + timeout
        infos: dict[str, JobInfo] = {}
        while True:
            for j in ids:
                if j not in infos:
                    info = self.poll(j)
                    if info.status.is_terminal():
                        infos[j] = info
            if len(infos) == len(ids):
                break
            if deadline is not None and time.monotonic() >= deadline:
                running = [j for j in ids if j not in infos]
                raise WaitTimeoutError(f"wait: job(s) {', '.join(running)} still running after {timeout}s")
            step = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            self._block([j for j in ids if j not in infos], step)
        result = [infos[j] for j in ids]
        if raise_on_failure:
            for info in result:
                if info.status is not JobStatus.SUCCEEDED:
                    raise JobFailedError(
                        f"job {info.job_id} ({info.name}) ended {info.status.value}: {info.error or 'no error text'}",
                        info,
                    )
        return result[0] if single else result

    def monitor(
        self,
        job_id: JobId | str,
        out: TextIO | None = None,
        timeout: float | None = None,
        view: MonitorView | None = None,
    ) -> JobInfo:
        """Stream the job's logs and progress (attempt, slices, preemptions/failures) until it ends.

        ``view`` decides how it is shown (default: :class:`MonitorView`, plain lines on ``out``); it is
        called with every log line, every attempt that ended, and the job's state a few times a second.

        >>> info = cluster.monitor(job_id)  # doctest: +SKIP
        """
        timeout = check_seconds("monitor: timeout", timeout)
        if view is None and out is None and getattr(self, "log_to", "stdout") == "logging":
            device = self.poll(job_id).request_summary.get("device") or {}
            view = LoggingMonitorView(hosts_per_slice=int(device.get("hosts") or 1))
        view = view if view is not None else MonitorView(out or sys.stdout)
        lines = _LinePipe(MONITOR_BUFFER_CHARS)
        failed: list[Exception] = []  # what stopped the log pump early (said after a poll: an unknown id raises)

        def pump() -> None:
            stream: Iterator[str] | None = None
            try:
                stream = iter(self.logs(job_id, follow=True))
                for line in stream:
                    if not lines.put(line):
                        break  # monitor() has returned or raised: stop reading
            except Exception as e:  # handed to monitor(), which says it: never printed by this thread
                failed.append(e)
            finally:
                lines.end()
                close = getattr(stream, "close", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        close()  # a generator's cleanup (its open log file) now, not when collected

        threading.Thread(target=pump, daemon=True, name=f"fray-monitor-{job_id}").start()
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            reported: set[int] = set()  # attempts whose end was shown
            pump_done = False
            while True:
                try:  # output first, so a job's last lines come before its final status
                    item = lines.get(timeout=0.2)
                    looked = time.monotonic() + 0.5  # a job that prints without pause still gets polled
                    while item is not None:
                        view.log(item)
                        if time.monotonic() > looked:
                            raise queue.Empty
                        item = lines.get()
                    pump_done = True
                except queue.Empty:
                    pass
                info = self.poll(job_id)
                if failed:
                    _log.warning(
                        "monitor: job %s: cannot read its log: %s: %s", job_id, type(failed[0]).__name__, failed[0]
                    )
                    failed.clear()
                # once the job ended, its final lines come out first: the log pump stops after draining the log
                if pump_done or not info.status.is_terminal():
                    for att in info.attempts:
                        if att.outcome is not None and att.index not in reported:
                            reported.add(att.index)
                            view.attempt_ended(att)
                    view.progress(info)
                    if info.status.is_terminal():
                        return info
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeoutError(f"monitor: job {job_id} still running after {timeout}s")
        finally:
            lines.close()  # monitor() returned or raised: a pump waiting for room stops now


#: characters of log lines :meth:`Cluster.monitor` holds that its view has not shown yet (plus one line): its
#: log pump waits for the view beyond that, so a job printing faster than the output sink takes costs no more
MONITOR_BUFFER_CHARS = 4 << 20

_ITEM_COST = 100

_log = logging.getLogger(__name__)


class _LinePipe:
    """Log lines from :meth:`Cluster.monitor`'s pump thread to the monitor, at most ``limit`` characters held
    (plus the line being added): :meth:`put` waits for room, and returns ``False`` once :meth:`close` was called
    (the monitor is done). :meth:`get` returns ``None`` after :meth:`end` (the log is drained), raises
    :class:`queue.Empty` when no line came in time.

    >>> p = _LinePipe(4)
    >>> p.put("ab"), p.end(), p.get(0.1), p.get(0.1)
    (True, None, 'ab', None)
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: collections.deque[str | None] = collections.deque()
        self._held = 0  # characters in _items, each line counted _ITEM_COST more (1M empty lines cost memory too)
        self._cond = threading.Condition()
        self._closed = False

    def put(self, line: str) -> bool:
        """Add ``line`` once there is room; ``False`` (dropped) when the reader is gone."""
        with self._cond:
            while self._held >= self.limit and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._items.append(line)
            self._held += _ITEM_COST + len(line)
            self._cond.notify_all()
            return True

    def end(self) -> None:
        """No more lines: the reader gets ``None`` after the last."""
        with self._cond:
            self._items.append(None)
            self._cond.notify_all()

    def get(self, timeout: float = 0.0) -> str | None:
        """The next line (``None``: the end), waiting up to ``timeout``; :class:`queue.Empty` when none came."""
        with self._cond:
            if not self._items and timeout > 0:
                self._cond.wait_for(lambda: bool(self._items), timeout)
            if not self._items:
                raise queue.Empty
            item = self._items.popleft()
            if item is not None:
                self._held -= _ITEM_COST + len(item)
                self._cond.notify_all()
            return item

    def close(self) -> None:
        """The reader is done: lines held are dropped and a :meth:`put` waiting returns ``False``."""
        with self._cond:
            self._closed = True
            self._items.clear()
            self._held = 0
            self._cond.notify_all()


class MonitorView:
    """How :meth:`Cluster.monitor` shows a job: plain lines on ``out`` (log lines as they come, a line per
    attempt that ended, the progress line whenever it changes and every 30 s while the job waits).
    Subclass it to show the job another way (the ``fray`` CLI draws a live status line on a terminal), or
    only to word its lines differently (:meth:`format_attempt`, :meth:`format_progress`).

    >>> info = cluster.monitor(job_id, view=MonitorView(sys.stderr))  # doctest: +SKIP
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._last = ""
        self._changed_at = self._printed_at = time.monotonic()

    def log(self, line: str) -> None:
        """A line of the job's output."""
        print(line, file=self.out, flush=True)

    def format_attempt(self, attempt: Attempt) -> str:
        """The line for an attempt that ended (:func:`describe_attempt`)."""
        return describe_attempt(attempt)

    def format_progress(self, info: JobInfo) -> str:
        """The line for the job's state (:func:`describe_progress`)."""
        return describe_progress(info)

    def attempt_ended(self, attempt: Attempt) -> None:
        """An attempt ended (called once per attempt)."""
        print(f"[fray] {self.format_attempt(attempt)}", file=self.out, flush=True)

    def progress(self, info: JobInfo) -> None:
        """The job's state, a few times a second until it ends (the last call has the final state)."""
        line = self.format_progress(info)
        now = time.monotonic()
        if line != self._last:
            print(f"[fray] {line}", file=self.out, flush=True)
            self._last, self._changed_at, self._printed_at = line, now, now
        elif info.status is JobStatus.PENDING and now - self._printed_at >= MONITOR_HEARTBEAT:
            # a long wait (e.g. for capacity): say again what the job waits for, and for how long
            print(f"[fray] {line} (still waiting after {now - self._changed_at:.0f}s)", file=self.out, flush=True)
            self._printed_at = now


#: seconds between repeated progress lines while a job waits (e.g. for capacity) without any change
MONITOR_HEARTBEAT = 30.0


_HOST_TAG = re.compile(r"^\[(?:a\d+ )?(?:r(\d+)|s(\d+)/h(\d+))\] ?")


class LoggingMonitorView(MonitorView):
    """:meth:`Cluster.monitor` through Python logging, as marin's Fray did: each line of a process's output
    is logged at INFO as ``[replica-N] line`` (``N``: the process's index in (slice, host) order), attempts and
    progress as ``[fray] ...``. ``LocalClusterConfig(log_to="logging")`` makes it the local default.

    >>> info = cluster.monitor(job_id, view=LoggingMonitorView())  # doctest: +SKIP
    """

    def __init__(self, logger: logging.Logger | None = None, hosts_per_slice: int = 1) -> None:
        super().__init__(sys.stderr)
        self.logger = logger or logging.getLogger("fray.job")
        self.hosts_per_slice = hosts_per_slice

    def replica_line(self, line: str) -> str:
        """``[a0 r2] hi`` -> ``[replica-2] hi``; ``[a1 s1/h0] hi`` -> ``[replica-4] hi`` on 4-host slices."""
        m = _HOST_TAG.match(line)
        if m is None:
            return line
        rank = int(m.group(1)) if m.group(1) is not None else int(m.group(2)) * self.hosts_per_slice + int(m.group(3))
        return f"[replica-{rank}] {line[m.end() :]}"

    def log(self, line: str) -> None:
        self.logger.info("%s", self.replica_line(line))

    def attempt_ended(self, attempt: Attempt) -> None:
        self.logger.info("[fray] %s", describe_attempt(attempt))

    def progress(self, info: JobInfo) -> None:
        line = describe_progress(info)
        if line != self._last:
            self.logger.info("[fray] %s", line)
            self._last = line


def describe_attempt(att: Attempt) -> str:
    """One line for an attempt that ended: ``attempt 0 PREEMPTED after 1.3s on v4-16-0, v4-16-1: <cause>``."""
    text = f"attempt {att.index} {att.outcome.value if att.outcome else 'RUNNING'}"
    if att.ended_at and att.started_at:
        text += f" after {att.ended_at - att.started_at:.1f}s"
    if att.slices:
        text += f" on {', '.join(att.slices)}"
    cause = (att.cause or "").strip()
    if cause:
        text += f": {cause.splitlines()[0]}"
    return text


def describe_progress(info: JobInfo) -> str:
    """One line: status, attempt, slices held, preemptions and failures, what it waits for."""
    parts = [f"{info.job_id}: {info.status.value}"]
    att = info.current_attempt
    if info.progress and not info.status.is_terminal():
        parts.append(info.progress)  # "attempt 1: waiting for 2 x v4-16", "attempt 0: running on ..."
    elif att is not None:
        parts.append(f"attempt {att.index}")
        if att.slices and att.outcome is None:
            parts.append(f"on {', '.join(att.slices)}")
    parts.append(f"preemptions {info.preemptions}, failures {info.failures}")
    if info.error and info.status.is_terminal():
        parts.append(f"error: {info.error}")
    return " | ".join(parts)


# ------------------------------------------------------------------------------------ backend registry

BackendFactory = Callable[[dict[str, str]], Cluster]
_BACKENDS: dict[str, str | BackendFactory] = {
    "local": "fray_local.cluster:_from_spec",
    "ray": "fray_ray.cluster:_from_spec",
}


#: what to install when a built-in backend's module cannot be imported
_INSTALL_HINTS: dict[str, str] = {
    "ray": "the Ray backend needs ray: install the package's `ray` extra (ray[default]>=2.60,<2.61)"
}


def register_backend(name: str, factory: str | BackendFactory) -> None:
    """Register a backend: ``factory(params) -> Cluster`` or a ``"module:function"`` string loaded lazily."""
    _BACKENDS[name] = factory


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"local?tpu=v4-16:2"`` -> ``("local", {"tpu": "v4-16:2"})``."""
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownBackendError(f"cluster spec: expected e.g. 'local' or 'ray?address=auto', got {spec!r}")
    scheme, _, query = spec.strip().partition("?")
    params: dict[str, str] = {}
    for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key in params:
            raise UnknownBackendError(f"cluster spec {spec!r}: option {key!r} given twice")
        params[key] = value
    if query and not params:
        raise UnknownBackendError(f"cluster spec {spec!r}: cannot parse options {query!r} (use key=value&...)")
    return scheme.lower(), params


def _resolve_factory(scheme: str, spec: str) -> BackendFactory:
    factory = _BACKENDS.get(scheme)
    if factory is None:
        from importlib.metadata import entry_points

        for ep in entry_points(group="fray.backends"):
            if ep.name == scheme:
                factory = ep.value
                break
    if factory is None:
        known = sorted(set(_BACKENDS))
        raise UnknownBackendError(
            f"cluster spec {spec!r}: unknown backend {scheme!r}; known backends: {', '.join(known)}"
        )
    if isinstance(factory, str):
        mod, _, attr = factory.partition(":")
        try:
            factory = getattr(importlib.import_module(mod), attr)
        except ImportError as e:
            hint = _INSTALL_HINTS.get(scheme, "")
            raise UnknownBackendError(
                f"cluster spec {spec!r}: the {scheme!r} backend cannot be loaded ({type(e).__name__}: {e})"
                + (f"; {hint}" if hint else "")
            ) from e
        _BACKENDS[scheme] = factory
    return factory  # type: ignore[return-value]


def check_spec_keys(spec_params: dict[str, str], allowed: Sequence[str], backend: str) -> None:
    """For backend factories: reject unknown options with a message naming them and the allowed ones."""
    unknown = sorted(set(spec_params) - set(allowed))
    if unknown:
        raise UnknownBackendError(
            f"cluster spec for {backend!r}: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(allowed) or 'none'}"
        )


def cluster_from_spec(spec: str) -> Cluster:
    """Build a cluster from a spec string: ``local``, ``local?tpu=v4-16:2,v5litepod-4:4``, ``ray``,
    ``ray?address=...&namespace=...``. Unknown backends or options raise ``UnknownBackendError``."""
    scheme, params = parse_spec(spec)
    cluster = _resolve_factory(scheme, spec)(params)
    cluster.spec = spec
    return cluster


# ------------------------------------------------------------------------------------ current cluster

_CURRENT: contextvars.ContextVar[Cluster | None] = contextvars.ContextVar("fray_current_cluster", default=None)
_GLOBAL: list[Cluster] = []  # set_current_cluster() outside any using_cluster()
_CACHE: dict[str, Cluster] = {}
_CACHE_LOCK = threading.Lock()


def _inside_ray() -> bool:
    ray = sys.modules.get("ray")  # never import ray just to ask
    try:
        return bool(ray is not None and ray.is_initialized())
    except Exception:
        return False


def current_cluster() -> Cluster:
    """The cluster to use here: ``using_cluster(...)``/``set_current_cluster(...)``, else
    ``$FRAY_CLUSTER_SPEC``, else Ray when this process is inside Ray, else ``LocalCluster()``.

    The same spec gives the same object; a changed ``FRAY_CLUSTER_SPEC`` is honoured on the next call.

    >>> cluster = current_cluster()  # doctest: +SKIP
    """
    c = _CURRENT.get()
    if c is not None:
        return c
    if _GLOBAL:
        return _GLOBAL[-1]
    spec = os.environ.get("FRAY_CLUSTER_SPEC", "").strip()
    if not spec:
        spec = "ray" if _inside_ray() else "local"
    with _CACHE_LOCK:
        cached = _CACHE.get(spec)
        if cached is None:
            cached = cluster_from_spec(spec)
            _CACHE[spec] = cached
        return cached


def fray_job_ctx(context_type: str | None = None, **options: Any) -> JobContext:
    """The job context of the current cluster (threads locally, tasks and actors on Ray), or the one set
    by ``fray_default_job_ctx(...)``; with ``context_type`` (``"sync"``, ``"threadpool"``, ``"ray"``, ``"auto"``)
    a new context of that kind, as ``create_job_ctx(context_type, **options)`` (marin's signature).

    >>> ctx = fray_job_ctx()
    >>> ctx.get(ctx.run(pow, 3, 2))
    9
    >>> type(fray_job_ctx("sync")).__name__
    'SyncContext'
    """
    from fray_core.context import default_job_ctx

    if context_type is not None:
        return create_job_ctx(context_type, **options)
    if options:
        raise TypeError(f"fray_job_ctx: {sorted(options)} need a context_type ('sync', 'threadpool' or 'ray')")
    return default_job_ctx() or current_cluster().job_context()


def get_default_job_ctx() -> JobContext:
    """The context set by :func:`fray_default_job_ctx`, else ``create_job_ctx("auto")`` (marin's name)."""
    from fray_core.context import default_job_ctx

    return default_job_ctx() or create_job_ctx("auto")


def create_job_ctx(context_type: str = "auto", *, max_workers: int | None = None, **ray_options: Any) -> JobContext:
    """A new job context of a kind (marin's ``create_job_ctx``):

    - ``"sync"``: :class:`SyncContext`, everything in the calling thread;
    - ``"threadpool"``: :class:`ThreadContext` with ``max_workers`` threads (default: Fray's, 4 per core;
      marin's default was 1);
    - ``"ray"``: Ray tasks and actors (``fray_ray.context.RayJobContext``) with ``ray_options`` for every task
      (``num_cpus=2``, ``memory=...``, ``runtime_env=...``); CPU-only tasks get ``JAX_PLATFORMS=cpu``;
    - ``"auto"``: the current cluster's context (Ray's inside Ray or with ``FRAY_CLUSTER_SPEC=ray``, else threads).

    >>> create_job_ctx("sync").get(create_job_ctx("sync").run(len, "abc"))
    3
    """
    from fray_core.context import CONTEXT_TYPES, LocalJobContext, SyncContext

    if context_type not in CONTEXT_TYPES:
        raise ValueError(f"Unknown context type: {context_type!r}. Supported: 'ray', 'threadpool', 'sync' (or 'auto')")
    if context_type != "ray" and ray_options:
        raise ValueError(
            f"create_job_ctx: {sorted(ray_options)} are Ray options; context_type {context_type!r} takes none"
        )
    if context_type != "threadpool" and max_workers is not None:
        raise ValueError(f"create_job_ctx: max_workers is for context_type 'threadpool', not {context_type!r}")
    if max_workers is not None and (
        isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
    ):
        raise ValueError(f"create_job_ctx: max_workers must be an int >= 1, got {max_workers!r}")
    if context_type == "sync":
        return SyncContext()
    if context_type == "threadpool":
        return LocalJobContext(max_workers=max_workers)
    if context_type == "ray":
        import importlib

        try:  # a backend package, loaded only when asked for (fray_core never imports ray itself)
            ray_context = importlib.import_module("fray_ray.context")
        except ImportError as e:
            raise ImportError(f"create_job_ctx('ray') needs Ray: pip install 'fray-jobs[ray]' ({e})") from None
        return ray_context.RayJobContext(ray_options=ray_options)
    return current_cluster().job_context()


def set_current_cluster(cluster: Cluster | None) -> None:
    """Make ``cluster`` the process-wide default (``None`` clears it)."""
    _GLOBAL.clear()
    if cluster is not None:
        _GLOBAL.append(cluster)


@contextlib.contextmanager
def using_cluster(cluster: Cluster | str) -> Iterator[Cluster]:
    """Use ``cluster`` (an object or a spec string) as ``current_cluster()`` inside the block."""
    c = cluster_from_spec(cluster) if isinstance(cluster, str) else cluster
    token = _CURRENT.set(c)
    try:
        yield c
    finally:
        _CURRENT.reset(token)

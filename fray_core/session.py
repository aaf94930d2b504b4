"""Held slice sessions: acquire slices once, keep one worker process per host, send it many calls.

::

    from fray_core import ResourceConfig, TpuConfig, current_cluster

    with current_cluster().hold(ResourceConfig(device=TpuConfig(type="v4-16"), replicas=2),
                                max_retries_preemption=10, max_retries_failure=1) as session:
        session.slices                      # names of the slices held now
        out = session.run(step, batch=3)    # one call on every host; a list in (slice, host) order
        fut = session.submit(step, batch=4) # non-blocking; fut.result(timeout=...)

A session **is a job** (``JobRequest(kind="session")``): its entrypoint on every host is a persistent worker loop
(:mod:`fray_core._session_worker`), launched with the cluster's own ``launch``, so the shared
:class:`~fray_core.runner.GangRunner` does everything a job gets: gang acquisition, the per-host env
(``FRAY_*``, ``TPU_*``, ``MEGASCALE_*``), preemption detection, the two retry budgets, release on every
path. It is listed by ``list_jobs()``/``fray list`` (``JobInfo.kind == "session"``; ``JobInfo.calls``, the calls
made so far, is counted here and kept beside the record), its attempts are the job's attempts, its calls are
in its log, and ``terminate(session.job_id)``/``fray stop`` ends it.

What the session adds is the calls:

- A call goes to every worker of the current attempt; the replies come back in (slice, host) order.
- A host lost during a call or between calls (the attempt ends PREEMPTED): the runner re-acquires and
  restarts the workers with the recomputed env; the interrupted call is sent again to the new workers. When
  the preemption budget is spent the job ends FAILED and the call raises
  :class:`~fray_core.errors.JobFailedError` (``.info`` has the attempt history).
- A call that raises on a host: the caller gets that exception's type (a :class:`RemoteCallError` that is also
  an instance of the user's class, when this process has it loaded) with the remote traceback; the host ends
  FAILED, so the runner spends the failure budget and, within it, restarts the workers for the next call.
  The call itself is not re-run.

Calls travel over an authenticated ``multiprocessing.connection`` (an HMAC challenge with a per-session
random key, before anything is unpickled): on a Unix socket in a private (0700) temp dir when every host runs
on this machine (``Cluster.session_transport == "unix"``, the local backend), else over TCP to this machine's
address (``"tcp"``). Nothing is ever unpickled from a file.
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import shutil
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from typing import TYPE_CHECKING, Any

import attrs

from fray_core._scratch import scratch_dir
from fray_core.errors import FrayError, JobFailedError, WaitTimeoutError, as_user_exception, loaded_exception_class
from fray_core.limits import check_name, check_seconds
from fray_core.request import Entrypoint, EnvironmentConfig, JobRequest, ResourceConfig
from fray_core.status import AttemptOutcome, JobInfo, JobStatus

if TYPE_CHECKING:
    from fray_core.cluster import Cluster

__all__ = ["RemoteCallError", "Session", "SessionWorker", "open_session", "worker_state"]

#: how long the workers of a running attempt may take to connect before the session gives up
CONNECT_TIMEOUT = 300.0
#: how long an attempt may take to be classified once one of its workers is gone
SETTLE_TIMEOUT = 120.0
#: how long ``close()`` waits for idle workers to exit before terminating the job
CLOSE_TIMEOUT = 30.0
#: how long a connecting peer has to complete the authentication and say who it is (a worker takes milliseconds)
HANDSHAKE_TIMEOUT = 5.0
#: connections at most in the handshake at once; when all are taken, the oldest one that has had
#: HANDSHAKE_EVICT_AFTER seconds is closed for the newcomer (a flood of silent peers evicts itself)
MAX_HANDSHAKES = 128
HANDSHAKE_EVICT_AFTER = 1.0
_TICK = 0.05  # granularity of the waits on state owned by the job's supervisor (poll)


_WORKER_STATE: dict[str, Any] = {}


def worker_state() -> dict[str, Any]:
    """A dict that lives as long as this worker process: what one session call leaves here (a loaded model,
    an initialised device) the next call on the same host finds. Empty again in a restarted worker (after a
    preemption or a failed call) and in every call of a ``fresh_process=True`` session.

    (Module globals of the call's own module persist too, when that module is importable on the hosts;
    a function defined in ``__main__`` is shipped by value, with fresh globals every call.)

    >>> def load(path):
    ...     worker_state()["model"] = path
    >>> def generate(n):
    ...     return f"{n} samples from {worker_state()['model']}"
    """
    return _WORKER_STATE


class RemoteCallError(FrayError):
    """A session call raised on a host. ``cause`` is the remote exception and traceback as text, ``host``
    the ``(slice, host)`` that reported it first. When this process has the user's exception class loaded,
    the raised object is also an instance of it (``except ValueError`` works)."""

    def __init__(self, message: str, cause: str = "", host: tuple[int, int] = (0, 0)) -> None:
        super().__init__(message)
        self.cause = cause
        self.host = host

    def __str__(self) -> str:  # not the user's __str__ when this is also an instance of their class
        return str(self.args[0]) if self.args else ""


def _recv_timeout(sock: socket.socket, seconds: float) -> None:
    """``SO_RCVTIMEO`` (0: none): unlike ``settimeout`` it also bounds reads on the raw fd a Connection makes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(seconds), 0))


def _this_machine_address() -> str:
    """The address remote host workers reach this process at: Ray's idea of this node's IP when this process
    is connected to Ray (ray is never imported here), else the address of this host's name."""
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except Exception:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _remote_error(index: int, host: tuple[int, int], err: dict[str, str], where: str = "") -> RemoteCallError:
    text = err.get("text", "")
    message = f"session call {index}{where} failed on slice {host[0]} host {host[1]}: {text}".rstrip()
    user_cls = loaded_exception_class(err.get("module", ""), err.get("qualname", ""))
    return as_user_exception(RemoteCallError, user_cls, message, text, host)


@attrs.frozen(repr=False)
class SessionWorker:
    """The entrypoint of every host of a session: ``serve`` connects back to ``address`` and runs calls."""

    address: Any  # a socket path (AF_UNIX) or (host, port) (AF_INET)
    family: str
    authkey: bytes
    fresh_process: bool = False

    def __call__(self) -> None:
        from fray_core._session_worker import serve

        serve(self.address, self.family, self.authkey, self.fresh_process)

    def __repr__(self) -> str:  # never shows the key
        return "fray-session-worker"


@attrs.define(eq=False)
class _Worker:
    conn: Connection
    attempt: int
    slice: int
    host: int
    replicas: int
    pid: int


class _Core:
    """Everything a session owns; the :class:`Session` wrapper only points here, so that dropping the
    wrapper lets the garbage collector close the session (``weakref.finalize``)."""

    def __init__(self, cluster: Cluster, fresh_process: bool, transport: str = "unix") -> None:
        self.cluster = cluster
        self.fresh_process = fresh_process
        self.authkey = secrets.token_bytes(32)
        self.dir = scratch_dir("fray-session-")  # 0700: only this user can reach the socket
        if transport == "unix":
            self.family = "AF_UNIX"
            self.address: Any = os.path.join(self.dir, "s")
        elif transport == "tcp":
            self.family = "AF_INET"
            self.address = (_this_machine_address(), 0)
        else:
            raise ValueError(f"hold: session transport {transport!r}; allowed: 'unix', 'tcp'")
        self.sock = socket.socket(socket.AF_UNIX if transport == "unix" else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(self.address)
        self.sock.listen(64)
        self.address = self.sock.getsockname()  # the port the system chose
        if isinstance(self.address, list):
            self.address = tuple(self.address)
        self.tick = _TICK if transport == "unix" else 0.2  # remote backends' poll() costs more
        self.job_id = ""
        self.cond = threading.Condition()
        self.workers: dict[int, dict[tuple[int, int], _Worker]] = {}
        self.calls = 0
        self.busy = False
        self.closed = False
        self._stopping = False
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fray-session-call")
        self.made = 0  # calls sent to the hosts so far (the record's ``calls``)
        # the sockets in the handshake, oldest first, with when they were accepted
        self._pending: dict[socket.socket, float] = {}
        self._pending_lock = threading.Condition()
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="fray-session-accept")
        self._acceptor.start()

    # ------------------------------------------------------------------------------------- workers

    def _accept(self) -> None:
        while not self._stopping:
            self._make_room()
            try:
                sock, _ = self.sock.accept()
            except OSError:
                if self._stopping:
                    return
                time.sleep(0.05)  # out of fds (EMFILE) and the like: retry, without spinning a core
                continue
            if self._stopping:
                sock.close()
                return
            with self._pending_lock:
                self._pending[sock] = time.monotonic()
            # The handshake runs in its own thread, with a short receive deadline, and at most MAX_HANDSHAKES
            # at once: a peer that connects and says nothing (anyone can, over TCP) holds up only itself, and
            # a flood of them neither exhausts this process's threads and fds nor keeps workers out for long.
            try:
                threading.Thread(target=self._handshake, args=(sock,), daemon=True, name="fray-session-hello").start()
            except RuntimeError:  # no thread to be had: this peer has to connect again
                self._unpend(sock)
                sock.close()

    def _make_room(self) -> None:
        """Wait until fewer than MAX_HANDSHAKES connections are in the handshake, evicting the oldest once it
        has had HANDSHAKE_EVICT_AFTER seconds (a real worker is done long before)."""
        with self._pending_lock:
            while len(self._pending) >= MAX_HANDSHAKES and not self._stopping:
                oldest, since = next(iter(self._pending.items()))
                left = since + HANDSHAKE_EVICT_AFTER - time.monotonic()
                if left <= 0:
                    del self._pending[oldest]
                    try:  # its handshake thread then fails at once and closes it
                        oldest.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                else:
                    self._pending_lock.wait(left)

    def _unpend(self, sock: socket.socket) -> None:
        with self._pending_lock:
            self._pending.pop(sock, None)
            self._pending_lock.notify_all()

    def _handshake(self, sock: socket.socket) -> None:
        try:
            _recv_timeout(sock, HANDSHAKE_TIMEOUT)
            sock.setblocking(True)
            # a copy of the fd for the Connection: ``sock`` stays open (an evictor may shut it down) until the end
            conn = Connection(os.dup(sock.fileno()))
        except OSError:
            self._unpend(sock)
            sock.close()
            return
        try:
            # mutual HMAC challenge with the session's key, before anything from the peer is unpickled
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
            kind, hello = conn.recv()
            assert kind == "hello"
            w = _Worker(conn, hello["attempt"], hello["slice"], hello["host"], hello["replicas"], hello["pid"])
            _recv_timeout(sock, 0)  # an idle worker waits for its next call as long as the session lives
            with self._pending_lock:  # out of the evictor's reach from now on (unless it was evicted already)
                if self._pending.pop(sock, None) is None:
                    raise ConnectionResetError("evicted")
                self._pending_lock.notify_all()
        except Exception:
            conn.close()
            return
        finally:
            self._unpend(sock)
            sock.close()  # the Connection keeps its own fd
        with self.cond:
            if self._stopping:
                conn.close()
                return
            self.workers.setdefault(w.attempt, {})[(w.slice, w.host)] = w
            self.cond.notify_all()

    def _drop_attempts_before(self, attempt: int) -> None:
        for a in [a for a in self.workers if a < attempt]:
            for w in self.workers.pop(a).values():
                w.conn.close()

    def ready(self, timeout: float | None = None) -> tuple[int, list[_Worker]]:
        """The workers of the running attempt, all connected, in (slice, host) order; waits for them (up to
        ``timeout`` seconds, if given: then the session is stopped and ``WaitTimeoutError`` raised)."""
        seen: dict[int, float] = {}
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.cluster.poll(self.job_id)
            if info.status.is_terminal():
                raise self.ended(info)
            att = info.current_attempt
            problem: FrayError | None = None
            with self.cond:
                if info.status is JobStatus.RUNNING and att is not None and att.outcome is None:
                    self._drop_attempts_before(att.index)
                    ws = self.workers.get(att.index, {})
                    if ws and len(ws) == next(iter(ws.values())).replicas:
                        return att.index, [ws[k] for k in sorted(ws)]
                    first = seen.setdefault(att.index, time.monotonic())
                    if time.monotonic() - first > CONNECT_TIMEOUT:
                        problem = FrayError(
                            f"session {self.job_id}: attempt {att.index}'s workers did not all connect within "
                            f"{CONNECT_TIMEOUT:.0f}s ({len(ws)} did); the session was stopped"
                        )
                if problem is None and end is not None and time.monotonic() >= end:
                    problem = WaitTimeoutError(
                        f"session {self.job_id}: not ready after {timeout}s ({info.status.value}: "
                        f"{info.progress or 'no progress'}); the session was stopped"
                    )
                if problem is None:
                    self.cond.wait(self.tick)
                    continue
            self.cluster.terminate(self.job_id)
            raise problem

    def settled(self, attempt: int) -> JobInfo:
        """The job once ``attempt`` has an outcome (or the job ended)."""
        end = time.monotonic() + SETTLE_TIMEOUT
        while True:
            info = self.cluster.poll(self.job_id)
            if info.status.is_terminal():
                return info
            if len(info.attempts) > attempt and info.attempts[attempt].outcome is not None:
                return info
            if time.monotonic() > end:
                raise FrayError(f"session {self.job_id}: attempt {attempt} did not end within {SETTLE_TIMEOUT:.0f}s")
            with self.cond:
                self.cond.wait(self.tick)

    def ended(self, info: JobInfo) -> JobFailedError:
        return JobFailedError(
            f"session {info.job_id} ({info.name}) ended {info.status.value}: {info.error or 'closed'}", info
        )

    # --------------------------------------------------------------------------------------- calls

    def _count(self, index: int) -> None:
        """Keep the job's call count (``JobInfo.calls``, ``fray list``) in the cluster's job store. Called once
        the call is on its way to the hosts, so the write overlaps their work."""
        store = getattr(self.cluster, "store", None)
        if index < self.made or store is None:
            return  # a call sent again after a preemption is still one call
        self.made = index + 1
        try:
            store.write_calls(self.job_id, self.made)
        except Exception:  # OSError, or a remote store's own error type
            pass  # only a count: the next call writes it again

    def call(self, index: int, what: str, payload: bytes) -> list[Any]:
        while True:
            attempt, workers = self.ready()
            self.busy = True
            try:
                replies, error, broken = self._broadcast(attempt, workers, index, what, payload)
            finally:
                self.busy = False
            if not broken and error is None:
                return [self._load(index, what, k, replies[k]) for k in sorted(replies)]
            info = self.settled(attempt)
            outcome = info.attempts[attempt].outcome if len(info.attempts) > attempt else None
            if (
                outcome in (AttemptOutcome.PREEMPTED, AttemptOutcome.UNSCHEDULABLE, AttemptOutcome.RESIZED)
                and not info.status.is_terminal()
            ):
                continue  # the runner is re-acquiring: send the call again to the next attempt's workers
            if error is not None and outcome is AttemptOutcome.FAILED:
                host, err = error
                raise _remote_error(index, host, err, f" ({what}) of session {self.job_id}")
            if info.status.is_terminal():
                raise self.ended(info)
            cause = info.attempts[attempt].cause if len(info.attempts) > attempt else None
            raise RemoteCallError(
                f"session call {index} failed: attempt {attempt} ended {outcome.value if outcome else '?'}: "
                f"{cause or 'no error text'}",
                cause or "",
            )

    def _load(self, index: int, what: str, host: tuple[int, int], data: bytes) -> Any:
        """One host's result, unpickled here; a result that cannot be (its class is not importable in this
        process, its ``__reduce__`` fails here) is an error naming the session, the call and the host."""
        import cloudpickle

        try:
            return cloudpickle.loads(data)
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            raise as_user_exception(
                RemoteCallError,
                type(e),
                f"session call {index} ({what}) of session {self.job_id}: the result of slice {host[0]} host "
                f"{host[1]} cannot be unpickled in this process: {text}",
                text,
                host,
            ) from e

    def _broadcast(
        self, attempt: int, workers: list[_Worker], index: int, what: str, payload: bytes
    ) -> tuple[dict[tuple[int, int], bytes], tuple[tuple[int, int], dict[str, str]] | None, bool]:
        """Send the call to every worker and collect: (results by host, first error, a worker was lost)."""
        replies: dict[tuple[int, int], bytes] = {}
        try:
            for w in workers:
                w.conn.send(("call", index, what, payload))
        except (OSError, EOFError):
            return replies, None, True
        self._count(index)
        pending = {w.conn: w for w in workers}
        while pending:
            ready = wait(list(pending), timeout=0.5)
            if not ready:
                info = self.cluster.poll(self.job_id)  # a host that hangs on to its socket after dying
                if info.status.is_terminal() or (
                    len(info.attempts) > attempt and info.attempts[attempt].outcome is not None
                ):
                    return replies, None, True
                continue
            for conn in ready:
                w = pending.pop(conn)  # type: ignore[arg-type]
                try:
                    kind, _, data = conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    return replies, None, True
                if kind == "ok":
                    replies[(w.slice, w.host)] = data
                else:
                    return replies, ((w.slice, w.host), data), False
        return replies, None, False

    # ---------------------------------------------------------------------------------------- close

    def close(self) -> None:
        with self.cond:
            if self.closed:
                return
            self.closed = True
        self.executor.shutdown(wait=False, cancel_futures=True)
        try:
            if self.job_id:
                self._end_job()
        finally:
            self._stopping = True
            try:  # wake the acceptor
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            with self._pending_lock:  # end the handshakes under way now, not at their deadline
                for s in self._pending:
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                self._pending_lock.notify_all()
            self._acceptor.join(5)
            with self.cond:
                for ws in self.workers.values():
                    for w in ws.values():
                        w.conn.close()
                self.workers.clear()
            self.sock.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _end_job(self) -> None:
        info = self.cluster.poll(self.job_id)
        if info.status.is_terminal():
            return
        att = info.current_attempt
        graceful = False
        if not self.busy and info.status is JobStatus.RUNNING and att is not None and att.outcome is None:
            with self.cond:
                ws = self.workers.get(att.index, {})
                if ws and len(ws) == next(iter(ws.values())).replicas:
                    graceful = True
                    for w in ws.values():
                        try:
                            w.conn.send(("exit",))
                        except OSError:
                            graceful = False
        if graceful:
            assert att is not None
            end = time.monotonic() + CLOSE_TIMEOUT
            while time.monotonic() < end:
                info = self.cluster.poll(self.job_id)
                if info.status.is_terminal():
                    return
                current = info.current_attempt
                if current is not None and current.index != att.index:
                    break  # preempted while exiting: the runner started new workers nobody will talk to
                with self.cond:
                    self.cond.wait(self.tick)
        self.cluster.terminate(self.job_id)


class Session:
    """Slices held by :meth:`Cluster.hold <fray_core.cluster.Cluster.hold>`, one worker process per host.

    ``run``/``submit`` send a call to every host; ``slices`` names the slices held now; ``job_id`` is the
    session's job (``fray status``/``fray stop`` take it). Close it (``with``, ``close()``; also on garbage
    collection and at interpreter exit) to release the slices.

    >>> with cluster.hold(ResourceConfig.with_tpu("v4-16", slice_count=2)) as session:  # doctest: +SKIP
    ...     session.run(os.getpid)
    [4242, 4243, 4244, 4245]
    """

    def __init__(self, core: _Core, job_id: str) -> None:
        self._core = core
        self.job_id = job_id
        self._finalizer = weakref.finalize(self, core.close)

    @property
    def info(self) -> JobInfo:
        """The session's job record now (attempts, preemptions, failures)."""
        return self._core.cluster.poll(self.job_id)

    @property
    def slices(self) -> list[str]:
        """Names of the slices held now (``[]`` between attempts, e.g. while re-acquiring after a preemption)."""
        info = self.info
        att = info.current_attempt
        if info.status is JobStatus.RUNNING and att is not None and att.outcome is None:
            return list(att.slices)
        return []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[list[Any]]:
        """Send ``fn(*args, **kwargs)`` to every host; a future of the per-host results. Calls run one at a
        time, in the order submitted. ``fn`` and the arguments must pickle (checked here, in the caller)."""
        import cloudpickle

        core = self._core
        if core.closed:
            raise FrayError(f"session {self.job_id} is closed")
        # an @job function (fray_core.decorator.JobFunction) runs on the session's hosts, not as a job of its own
        fn = getattr(fn, "__fray_host_callable__", fn)
        try:
            payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as e:
            raise TypeError(
                f"session {self.job_id}: call of {fn!r}: the function or its arguments cannot be pickled with "
                f"cloudpickle: {type(e).__name__}: {e}"
            ) from e
        with core.cond:
            index = core.calls
            core.calls += 1
        what = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
        return core.executor.submit(core.call, index, what, payload)

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """``fn(*args, **kwargs)`` on every host, blocking; the results in (slice, host) order."""
        return self.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """Let the workers exit (or kill them when a call is running), release every slice; idempotent."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session({self.job_id!r}, closed={self.closed})"


def open_session(
    cluster: Cluster,
    resources: ResourceConfig,
    *,
    max_retries_preemption: int = 100,
    max_retries_failure: int = 0,
    fresh_process: bool = False,
    name: str | None = None,
    environment: EnvironmentConfig | None = None,
    timeout: float | None = None,
) -> Session:
    """:meth:`Cluster.hold` (the cluster's ``session_transport`` says how its hosts reach this process). Returns once
    the slices are held and every host's worker is up; raises :class:`~fray_core.errors.JobFailedError` when
    the session ends before that (e.g. no capacity within the runner's deadline and budgets), and
    :class:`~fray_core.errors.WaitTimeoutError` (after stopping the session) when ``timeout`` seconds pass first."""
    if not isinstance(fresh_process, bool):
        raise TypeError(f"hold: fresh_process: expected True or False, got {fresh_process!r}")
    timeout = check_seconds("hold: timeout", timeout, positive=True)
    if name is not None:
        check_name("hold: name", name)
    core = _Core(cluster, fresh_process, cluster.session_transport or "unix")
    try:
        worker = SessionWorker(core.address, core.family, core.authkey, fresh_process)
        request = JobRequest(
            name=name if name is not None else "session",
            entrypoint=Entrypoint(callable=worker),
            resources=resources,
            environment=environment,
            max_retries_preemption=max_retries_preemption,
            max_retries_failure=max_retries_failure,
            kind="session",
        )
        core.job_id = str(cluster.launch(request))
        core.ready(timeout)  # the slices are held and every host's worker is up (or the session ended: raises)
    except BaseException:
        core.close()
        raise
    return Session(core, core.job_id)

"""Process management of the local backend: no host outlives its job, its supervisor or its own end.

A host is two processes (see :mod:`fray_local._host`): a small *guardian* that runs no user code, and
the *worker* it forks, which runs the entrypoint. On Linux:

- the guardian is a child subreaper, so every descendant the user's code starts (``setsid``,
  ``start_new_session=True``, double forks) stays in its subtree, and it kills the whole subtree when
  the worker ends, when it is stopped and when its supervisor dies;
- the guardian learns of its supervisor's death from a parent-death signal. That signal fires when the
  *thread* that forked the guardian exits, so every host is forked by one spawner thread that lives as
  long as the supervisor process (:func:`spawn`). The guardian sets the signal itself, first thing,
  and then checks that its parent is still the supervisor it was started by (pid AND start time from
  ``/proc/<pid>/stat``): a supervisor that died between fork and that check is caught by the check,
  one that dies later by the signal. It re-checks the supervisor's identity every second as well.

Elsewhere the guardian falls back to polling the supervisor's pid and killing the worker.

The supervisor watches its guardians in turn: each guardian writes a byte to a pipe of its own (``BEAT_ENV``
names the fd) at least every ``BEAT_INTERVAL``, and only the guardian holds the pipe's write end, so its end is
EOF there. A guardian that sent nothing for ``GUARDIAN_SILENCE`` seconds and is stopped (SIGSTOP, a debugger),
or for ``GUARDIAN_SILENCE_MAX`` seconds whatever its state (frozen, or too starved to run), can no longer reap
its worker, tear its host down or report its end: the host would stay RUNNING with no deadline. The
supervisor then kills the host itself (the guardian's process group, the guardian, then the run's sweep) and
the host ends FAILED, saying so (``HostProcess.unresponsive``).

The guardian cannot clean up when it is itself killed (SIGKILL: the OOM killer) or too slow to (stopped, a
child in D state): its setsid'd or double-forked descendants then fall to init, outside its process group.
So the supervisor marks every host run: ``FRAY_SUPERVISOR_RUN`` in its environment (every process the run
starts inherits it, whatever session it is in), and when a run ends abnormally it SIGKILLs every process
that carries the mark (:func:`sweep_run`). Runs nest: a host that is itself a supervisor adds its runs'
tokens to its own, so an outer sweep reaches them too.
"""

from __future__ import annotations

import collections
import errno
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import IO, Any

from fray_core._lines import READ_SIZE, LineSplitter
from fray_core._procfs import start_ticks as process_start_ticks
from fray_core._procfs import stat_fields
from fray_core.joblog import LogSink

__all__ = [
    "HARD_STOP",
    "STACKS",
    "LINUX",
    "HostProcess",
    "LogSink",
    "StartError",
    "descendants",
    "process_start_ticks",
    "spawn",
    "supervisor_env",
    "sweep_run",
]

LINUX = sys.platform.startswith("linux") and os.path.isdir("/proc/self")

# Sent to a guardian: kill the whole host now (preemption, the end of the job, the supervisor died).
HARD_STOP: int = (signal.SIGRTMIN + 3) if LINUX and hasattr(signal, "SIGRTMIN") else signal.SIGUSR1
# Sent to a guardian: have the worker write the Python stacks of all its threads to the host's log (a stall).
STACKS: int = (signal.SIGRTMIN + 4) if LINUX and hasattr(signal, "SIGRTMIN") else signal.SIGUSR2

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

# How long output of a host that ended may still be drained before the host counts as ended: waited
# again while the pipe still has output the pump has not read yet (a slow pump under load loses
# nothing), up to DRAIN_MAX in all.
DRAIN_GRACE = 2.0
DRAIN_MAX = 60.0
# How long a guardian may take to tear its host down before it is killed with its process group.
TEARDOWN_GRACE = 5.0
# The mark of a host run in the environment of every process it starts: comma-separated tokens, the run's
# own last (see the module docstring).
RUN_ENV = "FRAY_SUPERVISOR_RUN"
# The guardian's liveness (see the module docstring): the fd of its beat pipe, in its environment; how often it
# beats (its loop wakes at least this often); how long a silence the supervisor waits before it kills the host.
# The first beat is waited for from the spawn on: a guardian's start is an interpreter's, well under this on a
# loaded machine. A false alarm costs an attempt; no alarm at all left a job RUNNING for ever.
BEAT_ENV = "FRAY_SUPERVISOR_BEAT_FD"  # FRAY_SUPERVISOR_*: internal (docs/configuration.md)
BEAT_INTERVAL = 1.0
GUARDIAN_SILENCE = 30.0
# A silent guardian that is not stopped (runnable or asleep) is a slow one, not a dead one: a thousand hosts
# started at once on two cores take their interpreters' start-up in turns (~0.1 CPU-s each: ~50 s), and a
# false alarm would charge the user's failure budget for the machine's load. Such a guardian is killed only
# after this much silence; a stopped one (T, t) after GUARDIAN_SILENCE.
GUARDIAN_SILENCE_MAX = 600.0
_STOPPED_STATES = frozenset("Tt")
# A sweep repeats (a fork in flight when its parent was killed is found by the next scan) until a scan finds
# nothing, at most this many times.
_SWEEP_ROUNDS = 25
_SWEEP_PAUSE = 0.02

_TAIL_LINES = 20
_TAIL_LINE_CHARS = 4096  # a line kept in the tail (error messages, records) is cut at this

# Output is read in chunks, never a line at a time, so memory stays bounded whatever the line endings
# (fray_core._lines.LineSplitter).


# --------------------------------------------------------------------------------- /proc helpers


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (Linux; from one scan of ``/proc``)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = stat_fields(int(name))
        if fields is None or fields[0] in ("Z", "X"):
            continue
        children[int(fields[1])].append(int(name))
    out: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _carries(pid: int, mark: bytes) -> bool:
    """Whether ``pid``'s environment has ``mark`` among the tokens of ``RUN_ENV`` (False when unreadable:
    another user's process, or one that is gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return False
    prefix = RUN_ENV.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return mark in entry[len(prefix) :].split(b",")
    return False


def _kill_marked(pid: int, mark: bytes) -> bool:
    """SIGKILL ``pid`` if it still carries ``mark``, never a process that reused the pid meanwhile: the
    mark is checked again once a pidfd pins the process (or, without pidfds, with its start time)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        if pidfd is not None:
            if not _carries(pid, mark):
                return False
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return True
        born = process_start_ticks(pid)
        if born is None or not _carries(pid, mark) or process_start_ticks(pid) != born:
            return False
        os.kill(pid, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def sweep_run(token: str, since: int | None = None) -> int:
    """SIGKILL every process that carries host run ``token`` (see the module docstring); how many were killed.

    ``since``: the start time (clock ticks) of the run's guardian; a process started before it is not read.
    Linux only (a no-op elsewhere); processes this user may not read are skipped.
    """
    if not LINUX or not token:
        return 0
    mark = token.encode()
    me = os.getpid()
    killed = 0
    for _ in range(_SWEEP_ROUNDS):
        found = 0
        try:
            names = os.listdir("/proc")
        except OSError:
            return killed
        for name in names:
            if not name.isdigit() or int(name) == me:
                continue
            pid = int(name)
            if since is not None:
                born = process_start_ticks(pid)
                if born is None or born < since:
                    continue
            if _carries(pid, mark) and _kill_marked(pid, mark):
                found += 1
        killed += found
        if not found:
            break
        time.sleep(_SWEEP_PAUSE)
    return killed


def prctl(option: int, arg: int) -> bool:
    """``prctl(option, arg)``; False where it is not available or fails."""
    if not LINUX:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def supervisor_env() -> dict[str, str]:
    """What a guardian needs to recognise the process that started it."""
    ticks = process_start_ticks(os.getpid())
    return {"FRAY_SUPERVISOR_PID": str(os.getpid()), "FRAY_SUPERVISOR_START": "" if ticks is None else str(ticks)}


# --------------------------------------------------------------------------------------- spawning


class _Spawner:
    """One thread per process that forks every host (see the module docstring for why)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._q: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[tuple[bool, Any]]]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name="fray-spawner").start()

    def _loop(self) -> None:
        while True:
            fn, reply = self._q.get()
            try:
                reply.put((True, fn()))
            except BaseException as e:
                reply.put((False, e))

    def call(self, fn: Callable[[], Any]) -> Any:
        reply: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._q.put((fn, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def spawn(argv: list[str], **popen_kw: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen_kw)`` from the process's long-lived spawner thread."""
    global _spawner
    if not LINUX:
        return subprocess.Popen(argv, **popen_kw)
    with _spawner_lock:
        if _spawner is None or _spawner.pid != os.getpid():  # none yet, or we are a fork's child
            _spawner = _Spawner()
        spawner = _spawner
    return spawner.call(lambda: subprocess.Popen(argv, **popen_kw))


class StartError(Exception):
    """A host process cannot be started for a reason that will recur on every try (bad cwd, bad env)."""


def is_deterministic_start_error(e: BaseException) -> bool:
    """True for start errors that retrying cannot fix; False for transient ones (EAGAIN, ENOMEM, EMFILE)."""
    if isinstance(e, (ValueError, TypeError, FileNotFoundError, NotADirectoryError, PermissionError)):
        return True
    return isinstance(e, OSError) and e.errno in (errno.E2BIG, errno.ENAMETOOLONG, errno.ELOOP, errno.ENOEXEC)


# ------------------------------------------------------------------------------------------ logs


# ---------------------------------------------------------------------------------------- a host


class HostProcess:
    """One host (a guardian process, see :mod:`fray_local._host`), its output pump and how it ended.

    ``done`` is set when the guardian has exited and its output is drained (or ``DRAIN_GRACE`` passed).
    A host that could not start at all has ``start_error`` set and is done at once.
    """

    def __init__(self, tag: str, log: LogSink, on_done: Callable[[], None], result_path: str = "") -> None:
        self.tag = tag
        self.result_path = result_path
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.start_error: str | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.preempted = False
        self.cancelled = False
        self.log_error: str | None = None
        self.done = threading.Event()
        self.reported = False
        self._drained = threading.Event()
        self._on_done = on_done
        self.run_token = uuid.uuid4().hex  # this run's mark (RUN_ENV), swept when it ends abnormally
        self._born: int | None = None  # the guardian's start time (clock ticks)
        self._beats: int | None = None  # the read end of the guardian's beat pipe (see the module docstring)
        # why the supervisor killed the host itself: its guardian stopped answering (None: it did not)
        self.unresponsive: str | None = None

    def start(self, argv: list[str], env: dict[str, str], cwd: str, guardian: bool = False) -> None:
        """Start the host; a deterministic start error is kept in ``start_error`` (the host is done),
        a transient one is raised. ``guardian``: ``argv`` runs a guardian (:mod:`fray_local._host`), which
        beats on a pipe; the host is killed if it falls silent (see the module docstring)."""
        env = dict(env)
        env.update(supervisor_env())
        env[RUN_ENV] = ",".join(t for t in (env.get(RUN_ENV, ""), self.run_token) if t)
        beat_w = None
        if guardian and LINUX:
            self._beats, beat_w = os.pipe()  # both close-on-exec: only the guardian gets the write end
            env[BEAT_ENV] = str(beat_w)
        try:
            self.proc = spawn(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no terminal signal reaches it; its group is the last-resort kill
                pass_fds=() if beat_w is None else (beat_w,),
            )
        except Exception as e:
            if self._beats is not None:
                os.close(self._beats)
                self._beats = None
            if not is_deterministic_start_error(e):
                raise
            where = f" in cwd {cwd!r}" if getattr(e, "filename", None) == cwd else ""
            error = f"HostStartError: cannot start the host process{where}: {type(e).__name__}: {e}"
            self.log.write(self.tag, f"[fray] {error}")
            self.not_started(error)
            return
        finally:
            if beat_w is not None:
                os.close(beat_w)  # the guardian's copy is the only one: its end is EOF on the read end
        if LINUX:
            fields = stat_fields(self.proc.pid)  # our unreaped child: its entry (a zombie's too) is there
            self._born = int(fields[19]) if fields is not None else None
        threading.Thread(target=self._pump, daemon=True, name=f"fray-pump-{self.tag}").start()
        threading.Thread(target=self._wait, daemon=True, name=f"fray-wait-{self.tag}").start()

    def not_started(self, error: str) -> None:
        """This host will not run: it is done at once, with ``error``."""
        self.start_error = error
        self._drained.set()
        self._finish()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        out: IO[bytes] = self.proc.stdout
        splitter = LineSplitter()
        try:
            while True:
                chunk = os.read(out.fileno(), READ_SIZE)
                for line in splitter.feed(chunk) if chunk else splitter.close():
                    self.tail.append(line[:_TAIL_LINE_CHARS])
                    self.log.write(self.tag, line)  # a failing log drops the line; we keep draining the pipe
                if not chunk:
                    break
        except OSError:
            pass
        finally:
            out.close()
            self._drained.set()

    def _unread_output(self) -> bool:
        """Whether the pipe has output (or its end) the pump has not read yet: it is only behind."""
        if self._drained.is_set() or self.proc is None or self.proc.stdout is None:
            return False
        try:
            poller = select.poll()
            poller.register(self.proc.stdout.fileno(), select.POLLIN | select.POLLHUP)
            return any(ev & (select.POLLIN | select.POLLHUP) for _fd, ev in poller.poll(0))
        except (OSError, ValueError):  # closed by the pump meanwhile: drained
            return False

    def _wait(self) -> None:
        assert self.proc is not None
        if self._beats is not None:
            self._watch_beats(self._beats)
        self.proc.wait()
        if self.proc.returncode < 0:
            # Killed by a signal: either the guardian re-raised its worker's after its own clean-up, or it
            # was killed before it could clean up (SIGKILL, the OOM killer). A sweep costs milliseconds.
            self.sweep()
        # The guardian killed every descendant, so the pipe reaches EOF at once; the grace bounds the
        # case where something outside the host's tree still holds it (no subreaper on this OS). A pump
        # that is merely behind (a loaded machine) is waited for: the job's last lines are kept.
        end = time.monotonic() + DRAIN_MAX
        while not self._drained.wait(DRAIN_GRACE):
            if time.monotonic() < end and self._unread_output():
                continue
            if not self._drained.is_set():
                self.log.write(
                    self.tag,
                    f"[fray] the host ended; output still held by another process after {DRAIN_GRACE:.0f} s "
                    "is not logged",
                )
            break
        self._finish()

    def _watch_beats(self, fd: int) -> None:
        """Read the guardian's beats until it exits (EOF); kill the host when none came for
        ``GUARDIAN_SILENCE`` seconds (see the module docstring). Closes ``fd``."""
        assert self.proc is not None
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        last = time.monotonic()  # the first beat is waited for from the spawn on
        try:
            while True:
                silent = time.monotonic() - last
                wait = GUARDIAN_SILENCE - silent
                if wait <= 0:
                    if self.proc.poll() is not None:  # merely ended between two looks
                        return
                    fields = stat_fields(self.proc.pid)  # our unreaped child: the pid is still the guardian's
                    state = fields[0] if fields is not None else "?"
                    if state in _STOPPED_STATES or silent >= GUARDIAN_SILENCE_MAX:
                        self._kill_unresponsive(silent, state)
                        return
                    wait = min(BEAT_INTERVAL, GUARDIAN_SILENCE_MAX - silent)  # slow, not stopped: look again
                if not poller.poll(max(1, int(wait * 1000))):
                    continue
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    return  # cannot happen on a pipe we own; the plain wait still ends the host
                if not data:
                    return  # EOF: the guardian exited
                last = time.monotonic()
        finally:
            os.close(fd)

    def _kill_unresponsive(self, silent: float, state: str) -> None:
        """The guardian stopped answering (``state``: its process state, as just read): kill its process
        group and itself (SIGKILL ends a stopped process too); the caller's wait then sees it killed and
        sweeps the run. The host's outcome says why."""
        assert self.proc is not None
        how = {"T": "stopped by a stop signal", "t": "stopped by a debugger", "D": "in uninterruptible sleep"}.get(
            state, f"process state {state}"
        )
        self.unresponsive = (
            f"its guardian process (pid {self.proc.pid}) did not answer for {silent:.0f} s ({how}): it could "
            "neither report the host's end nor tear the host down, so the supervisor killed the host and every "
            "process of its run"
        )
        self.log.write(self.tag, f"[fray] GuardianUnresponsive: {self.unresponsive}")
        self._kill_group()
        try:
            self.proc.send_signal(signal.SIGKILL)  # not reaped yet, so not a reused pid: Popen checks
        except OSError:
            pass

    def _finish(self) -> None:
        self.done.set()
        self._on_done()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the guardian (SIGTERM: stop gracefully; HARD_STOP: kill the host now)."""
        if self.proc is None or self.done.is_set():
            return
        try:
            os.kill(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self, wait: bool = False) -> None:
        """Kill the host and every descendant; if the guardian does not exit in time, kill its group.

        With ``wait``, return only once the guardian has exited (at most ``TEARDOWN_GRACE``): a simulated
        preemption has killed its hosts when ``TpuFleet.preempt`` returns, as a real one has.
        """
        if self.proc is None or self.done.is_set():
            return
        self.signal(HARD_STOP)
        if not LINUX:
            self._kill_group()
            return
        if wait:
            self._backstop()
        else:
            threading.Thread(target=self._backstop, daemon=True, name=f"fray-kill-{self.tag}").start()

    def _backstop(self) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(TEARDOWN_GRACE)
        except subprocess.TimeoutExpired:
            self._kill_group()
            self.sweep()  # what left the guardian's group (setsid) while the guardian could not tear it down

    def sweep(self) -> None:
        """SIGKILL every process of this run that is still alive (:func:`sweep_run`)."""
        sweep_run(self.run_token, self._born)

    def _kill_group(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

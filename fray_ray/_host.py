"""What runs inside one host's (or one replica's) Ray task: a fresh worker process (``max_calls=1``) for a TPU or
GPU host, whose device the process holds until it exits; a worker Ray may reuse for the next task for a CPU
replica (``HostConfig.shared_worker``), which then undoes what it changed in the process (environment,
``sys.path``, cwd, fds 1 and 2, the heartbeat channel) when it ends.

It puts the driver's ``sys.path`` and cwd in place (so functions of a test module or a script unpickle),
sets the host's env, checks the TPU device is not held by another process (:class:`TpuBusyError`, a
preemption) and removes a stale ``/tmp/libtpu_lockfile``, reports in to the supervisor (the host has
started), streams its stdout/stderr to the job's supervisor (which writes the job log), and runs the
entrypoint: the callable in this process, a binary in a child process. Errors keep their type so the
supervisor classifies them by type, never by message.

A graceful stop (an elastic job's resize) is SIGTERM, sent on the host's own node by :func:`signal_host`
(a small Ray task the provider pins to that node) to the host's worker process and to every process that
carries its ``FRAY_HOST_TOKEN``; the host tells where it runs (:class:`HostProcess`) when it reports in.
A callable sees SIGTERM in the worker's main thread (its own handler, if it set one; else Ray's, which
raises ``SystemExit``); a binary gets it itself (the worker waits on). ``sys.exit(0)`` (or ``None``) in a
callable is a plain return, as on the local backend; another code is :class:`CommandFailedError`.

Every process the host starts, however deep and even in a new session, carries ``FRAY_HOST_TOKEN`` in its
environment; a small reaper process kills all of them when the host task ends or its worker is killed
(cancel, terminate, preemption of the supervisor's job): nothing the user's code spawned outlives the job.
"""

from __future__ import annotations

import collections
import ctypes
import faulthandler
import glob
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import cloudpickle

from fray_core._exits import exit_code_text
from fray_core._lines import READ_SIZE, LineSplitter
from fray_core._oom import OomWatch, oom_suffix
from fray_core._procfs import start_ticks
from fray_core.hostrun import EntrypointExit, call_entrypoint
from fray_core.signatures import device_fault

__all__ = [
    "CommandFailedError",
    "DeviceFaultError",
    "HostConfig",
    "HostPreemptedError",
    "HostProcess",
    "TpuBusyError",
    "device_holders",
    "dump_host_stacks",
    "gce_preempted",
    "host_payload",
    "run_host",
    "run_shared_host",
    "signal_host",
    "tpu_devices",
]

LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
LOCKFILE_ENV = "FRAY_TPU_LOCKFILE"  # where libtpu keeps its lockfile on this host (default LIBTPU_LOCKFILE)
TPU_PCI_VENDOR_ID = "0x1ae0"  # Google's PCI vendor id: what tells a TPU's VFIO group from another device's
HOST_TOKEN_ENV = "FRAY_HOST_TOKEN"
_TAIL_LINES = 20
LOG_SEND_INTERVAL = 0.2  # seconds between a host's log batches: at most 5 calls a second to the supervisor
LOG_PENDING_MAX = 20_000  # lines a host keeps while the supervisor is behind; older ones are dropped (counted)
# seconds a host waits for its last batch (which says it is ending) to reach the supervisor before its task returns
LAST_BATCH_WAIT = 10.0
# Sent to a host's worker process: write the Python stacks of all its threads to the host's log (a stall).
STACKS_SIGNAL: int = (signal.SIGRTMIN + 4) if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
_GCE_PREEMPTED_URL = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"


class CommandFailedError(RuntimeError):
    """The entrypoint exited non-zero: a binary's exit code (with the tail of its output), or
    ``sys.exit(code)`` in a callable. ``exit_code`` is kept."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[Any, ...]:
        return (CommandFailedError, (self.args[0], self.exit_code))


class HostPreemptedError(RuntimeError):
    """The host's work failed and the cloud says the VM was preempted: retryable, not the user's fault."""


class TpuBusyError(HostPreemptedError):
    """The host's TPU device (or libtpu's lockfile) is held by another process: the host is unusable for
    now, as when libtpu says "TPU is already in use". Retryable, not the user's fault."""


class DeviceFaultError(HostPreemptedError):
    """The host failed with a known TPU-host fault's signature in its error or output (``fray_core.signatures``:
    libtpu's "TPU is already in use", a busy ``/dev/vfio``/``/dev/accel``, a stale libtpu lockfile, libtpu
    crashing at start): the device's fault, not the job's. ``fault`` names it; counted towards the host's
    quarantine."""

    def __init__(self, message: str, fault: str = "device fault") -> None:
        super().__init__(message)
        self.fault = fault

    def __reduce__(self) -> tuple[Any, ...]:
        return (DeviceFaultError, (self.args[0], self.fault))


def tpu_devices(dev: str = "/dev", iommu_groups: str = "/sys/kernel/iommu_groups") -> list[str]:
    """This host's TPU device files, told apart as Ray does: ``/dev/accel*`` character devices (not the
    ``/dev/accel/`` directory newer NVIDIA drivers make), else the ``/dev/vfio/<group>`` whose IOMMU group
    holds a device of Google's PCI vendor id. Any other VFIO device (a NIC's, a DPU's) is not a TPU.

    >>> tpu_devices("/nonexistent")
    []
    """
    accel = sorted(p for p in glob.glob(os.path.join(dev, "accel*")) if not os.path.isdir(p))
    if accel:
        return accel
    out = []
    for group in sorted(glob.glob(os.path.join(dev, "vfio", "[0-9]*"))):
        for vendor in glob.glob(os.path.join(iommu_groups, os.path.basename(group), "devices", "*", "vendor")):
            try:
                with open(vendor, encoding="ascii") as f:
                    if f.read().strip().lower() == TPU_PCI_VENDOR_ID:
                        out.append(group)
                        break
            except (OSError, UnicodeDecodeError):
                continue  # unreadable: not known to be a TPU (Ray fails closed the same way)
    return out


def device_holders(
    lockfile: str = LIBTPU_LOCKFILE, exclude: frozenset[int] = frozenset(), devices: list[str] | None = None
) -> list[tuple[int, str]]:
    """``(pid, path)`` of the processes (other than ``exclude``) that hold the TPU device (``devices``,
    default :func:`tpu_devices`) or libtpu's lockfile open, from ``/proc/*/fd``. Empty when neither exists
    (an emulated host)."""
    targets = {os.path.realpath(p) for p in (tpu_devices() if devices is None else devices)}
    if os.path.exists(lockfile):
        targets.add(os.path.realpath(lockfile))
    if not targets:
        return []
    me = os.getpid()
    out = []
    for pid_dir in glob.glob("/proc/[0-9]*"):
        pid = int(pid_dir[6:])
        if pid == me or pid in exclude:
            continue
        try:
            fds = os.listdir(f"{pid_dir}/fd")
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                path = os.readlink(f"{pid_dir}/fd/{fd}")
            except OSError:
                continue
            if path in targets:
                out.append((pid, path))
                break
    return out


def _check_device(lockfile: str, where: str) -> None:
    """Raise :class:`TpuBusyError` when another process holds the device; else remove a stale lockfile."""
    holders = device_holders(lockfile)
    if holders:
        pid, path = holders[0]
        raise TpuBusyError(
            f"TPU device busy on {where}: {path} is held by pid {pid} ({_cmdline(pid)}); the host cannot "
            f"start the job now"
        )
    if os.path.exists(lockfile):
        try:
            os.remove(lockfile)
            print(f"[fray] removed stale {lockfile} before start", flush=True)
        except OSError:
            pass


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:120] or "?"
    except OSError:
        return "?"


# The reaper: one daemon per worker process (forked twice, so it is not the worker's child: Ray kills a dying
# worker's children, and the reaper must outlive the worker). The worker tells it each host's token as the
# host starts ("+TOKEN" on its stdin) and as it ends ("-TOKEN"): it then SIGKILLs every process whose
# environment carries that token, until none is left. When the worker dies (its /proc entry gone, or reused:
# the worker passes its own start time, so a worker that died before the reaper came up is seen as gone) or
# its pipe closes, it does the same for every token it still has. One per process, not one per host: a
# reused worker (a CPU replica's) runs hundreds of hosts, and a reaper's start cost each ~20 ms of the
# worker's time (a fork of a large process) and ~10 ms of CPU (issue 29, bench/NOTES.md).
_REAPER = """
import os, select, signal, sys, time
parent, born = int(sys.argv[1]), sys.argv[2].encode()
def started(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
def sweep(tokens):
    marks = set(b"FRAY_HOST_TOKEN=" + t for t in tokens)
    me = os.getpid()
    for _ in range(50):
        found = False
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) in (me, parent):
                continue
            try:
                with open("/proc/%s/environ" % d, "rb") as f:
                    if marks.intersection(f.read().split(b"\\0")):
                        os.kill(int(d), signal.SIGKILL)
                        found = True
            except OSError:
                pass
        if not found:
            break
        time.sleep(0.05)
if os.fork():
    os._exit(0)
os.nice(19)  # already, unless it forked before its parent lowered it (see _Reaper)
live, buf = set(), b""
def take(wait):
    # what the worker wrote within wait seconds: None if nothing came, False at EOF, else True
    global buf
    if not select.select([0], [], [], wait)[0]:
        return None
    data = os.read(0, 65536)
    buf += data
    while b"\\n" in buf:
        line, buf = buf.split(b"\\n", 1)
        if line[:1] == b"+":
            live.add(line[1:])
        elif line[:1] == b"-":
            live.discard(line[1:])
            sweep([line[1:]])
    return bool(data)
while started(parent) == born and take(0.2) is not False:
    pass
while take(0):  # the worker is gone: what it wrote before it died (a fork of it may hold the pipe open)
    pass
if live:
    sweep(live)
"""

_REAPER_PIPE: tuple[int, int] | None = None  # (this process's pid, the write end of its reaper's stdin)
_REAPER_LOCK = threading.Lock()


def _reaper_pipe(replace: int | None = None) -> int:
    """The write end of this process's reaper's stdin; the reaper is started at the first call (and again
    in a forked child: a reaper watches the process that started it; and with ``replace``, the pipe of a
    reaper that is gone)."""
    global _REAPER_PIPE
    with _REAPER_LOCK:
        if _REAPER_PIPE is not None and _REAPER_PIPE[0] == os.getpid():
            if _REAPER_PIPE[1] != replace:
                return _REAPER_PIPE[1]
            try:
                os.close(replace)
            except OSError:
                pass
            _REAPER_PIPE = None
        env = {k: v for k, v in os.environ.items() if k != HOST_TOKEN_ENV}
        r, w = os.pipe()
        # Not waited for: the user's code may start before the reaper is up. That is safe: what it starts
        # carries the token from now on, and a reaper that comes up later still finds the tokens (or EOF) on
        # its stdin and kills them. Waiting cost each host 30-90 ms (bench/NOTES.md). Its stdout and stderr
        # are not the log pump's pipe, which the reaper would otherwise hold open.
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER, str(os.getpid()), str(start_ticks(os.getpid()))],
            stdin=r,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        os.close(r)
        # Lowest CPU priority (inherited by its fork, the reaper proper): its interpreter start-up (~10 ms of
        # CPU) and its sweeps of /proc need not be quick, and would otherwise compete with the start of this
        # host and of the hosts beside it (an emulated cluster, or several hosts per VM). Set here, not with
        # preexec_fn, which would make subprocess fork this whole worker instead of vfork.
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid, 19)
        except OSError:
            pass  # it already exited (the first fork): the reaper runs at our priority
        threading.Thread(target=proc.wait, daemon=True, name="fray-reaper-start").start()  # exits at once
        _REAPER_PIPE = (os.getpid(), w)
        return w


class _Reaper:
    """Kills every process of the host (see module doc) when :meth:`finish` is called or the worker dies."""

    def __init__(self) -> None:
        token = uuid.uuid4().hex
        self._w = _reaper_pipe()
        try:
            _write_all(self._w, f"+{token}\n".encode())  # a pipe write of < 512 bytes is atomic
        except OSError:  # this worker's reaper is gone (killed): start another for this host and the next
            self._w = _reaper_pipe(replace=self._w)
            _write_all(self._w, f"+{token}\n".encode())
        self.token = token
        os.environ[HOST_TOKEN_ENV] = token  # inherited by everything the host starts from now on

    def finish(self) -> None:
        """Kill what the host started (bounded: the reaper gets the token and works on its own)."""
        os.environ.pop(HOST_TOKEN_ENV, None)
        try:
            _write_all(self._w, f"-{self.token}\n".encode())
        except OSError:
            pass  # the reaper is gone: nothing can be done from here


@attrs.frozen
class HostProcess:
    """Where a host's worker process runs, as the host reports in: what :func:`signal_host` needs to
    reach it from its own node (``start_ticks`` tells a reused pid apart)."""

    node_id: str
    pid: int
    start_ticks: int | None
    token: str
    shared: bool = False  # a worker Ray reuses: signalled only while it still runs this host (worker_mark)


def worker_mark(pid: int) -> str:
    """The file on a node that says which host a reusable worker process runs now (its token): a signal
    for a host that ended must not reach the next task of the same worker."""
    return os.path.join(tempfile.gettempdir(), f"fray-worker-{pid}")


def _runs_host(process: HostProcess) -> bool:
    """The worker process is still the one the host reported (and, if shared, still runs that host)."""
    if process.start_ticks is None or start_ticks(process.pid) != process.start_ticks:
        return False
    if not process.shared:
        return True
    try:
        with open(worker_mark(process.pid)) as f:
            return f.read() == process.token
    except OSError:
        return False  # the host ended: the worker is idle or runs another task


def signal_host(process: HostProcess, sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` to a host's worker process (if it is still that process) and to every process that
    carries the host's token. Runs on the host's node (a task pinned there); on another node it does
    nothing. Returns how many processes were signalled."""
    import ray

    if ray.get_runtime_context().get_node_id() != process.node_id:
        return 0
    targets = []
    if _runs_host(process):
        targets.append(process.pid)
    mark = f"{HOST_TOKEN_ENV}={process.token}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in (os.getpid(), process.pid):
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    targets.append(int(d))
        except OSError:
            pass  # gone, or not ours to read
    sent = 0
    for pid in targets:
        try:
            os.kill(pid, sig)
            sent += 1
        except OSError:
            pass  # ended meanwhile
    return sent


def dump_host_stacks(process: HostProcess) -> bool:
    """Have a host's worker process write the Python stacks of all its threads to the host's log (its
    faulthandler, registered by :func:`run_host`, on :data:`STACKS_SIGNAL`). Runs on the host's node (a task
    pinned there); only the worker is signalled (a binary it started would die of the signal). Returns whether
    it was signalled."""
    import ray

    if ray.get_runtime_context().get_node_id() != process.node_id:
        return False
    if not _runs_host(process):
        return False  # the worker is gone (its pid may be another process's now), or runs another task
    try:
        os.kill(process.pid, STACKS_SIGNAL)
    except OSError:
        return False
    return True


def _beat_to_gcs(key: str) -> Callable[[], None]:
    """This host's ``fray_core.heartbeat()`` goes to Ray's GCS key-value store (namespace ``fray``), where the
    job's provider reads it (``RaySliceProvider.heartbeats``): no host can write where the runner runs.
    Returns what removes the key at the host's end, if a beat wrote it (the provider then need not: one GCS
    call a job saved, issue 29; it still does for a host that did not end by itself)."""
    import ray

    from fray_core import hostapi

    gcs = ray._private.worker.global_worker.gcs_client
    lock = threading.Lock()  # a beat in flight lands before the key's removal, or not at all
    wrote, ended = [False], [False]

    def beat(t: float, step: int | None) -> None:
        with lock:
            if ended[0]:
                return
            wrote[0] = True  # before: a put that raised may still have landed
            try:
                gcs.internal_kv_put(key.encode(), f"{t!r} {'' if step is None else step}".encode(), True, b"fray")
            except Exception:
                pass  # progress reporting must never fail the job

    def remove() -> None:
        hostapi.set_channel()  # a thread of the user's code that beats on writes nowhere now
        with lock:
            ended[0] = True
        if wrote[0]:
            try:
                gcs.internal_kv_del(key.encode(), False, b"fray", timeout=5)
            except Exception:
                pass  # the provider's close removes what is left of a host it did not see end cleanly

    hostapi.set_channel(beat=beat)
    return remove


def notice_key(job_id: str, attempt: int | str) -> str:
    """The Ray KV key (namespace ``fray``) where a job's supervisor puts an attempt's preemption deadline.

    >>> notice_key("train-1", 0)
    'fray-notice:train-1:a0'
    """
    return f"fray-notice:{job_id}:a{attempt}"


@attrs.define
class _Watched:
    """A host the drain watch watches (see :class:`_DrainWatch`)."""

    me: HostProcess
    notice_file: str | None
    kv_key: bytes  # its job's notice key in Ray's KV
    board_key: str  # its job attempt's key on the notice board
    board: Any  # the ref of the notice epoch it waits for (None: it reads the KV key)
    since: float  # since when it waits for this board (monotonic)


class _DrainWatch:
    """The job's preemption notice (a drain with a deadline: the autoscaler's, a GKE maintenance event's,
    which the job's supervisor sees in the cluster's draining nodes): write the deadline where
    ``fray_core.preemption_notice()`` reads it, then SIGTERM the host (the TPU VM convention JAX's preemption
    sync point listens for). Watched from the host's own process, because a drained node takes no new task:
    nothing sent from outside could reach the host any more.

    How the notice comes: the supervisor process's notice board (``fray_ray._notices``), a Ray object this
    process waits for (the supervisor answers when a notice is posted: no GCS call while none comes). A host
    without one (its supervisor process gone, the job adopted by another) reads :func:`notice_key` in Ray's
    KV once a second instead, which every supervisor also writes. The KV read a second per host was the
    only way before: 16,000 GCS calls a second for a job of 16,000 hosts (issue 29).

    One thread per process watches the hosts it runs (one at a time, in a worker Ray reuses for hundreds of
    them), not a thread per host (issue 29)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._hosts: dict[str, _Watched] = {}  # by token
        self._thread_pid: int | None = None  # the process whose thread runs (a fork has none)

    def add(self, me: HostProcess, notice_file: str | None, board: Any = None) -> None:
        """Watch the host of this process ``me`` (until :meth:`remove`) for its job's notice; ``board``: the
        ref of its supervisor's current notice epoch (``None``: read the KV key)."""
        from fray_ray._notices import board_key

        job, attempt = os.environ.get("FRAY_JOB_ID", ""), os.environ.get("FRAY_ATTEMPT", "0")
        with self._lock:
            self._hosts[me.token] = _Watched(
                me, notice_file, notice_key(job, attempt).encode(), board_key(job, attempt), board, time.monotonic()
            )
            if self._thread_pid == os.getpid():
                return
            threading.Thread(target=self._loop, daemon=True, name="fray-drain-watch").start()
            self._thread_pid = os.getpid()  # once started: a start that failed is tried again by the next host

    def remove(self, token: str) -> None:
        with self._lock:
            self._hosts.pop(token, None)

    def _loop(self) -> None:
        import ray

        gcs = ray._private.worker.global_worker.gcs_client
        while True:
            # one look per call: its locals (the boards, Ray object refs) go when it returns. A ref left in this
            # frame after its host ended kept the worker from ever being idle for Ray (a worker holding any
            # reference is not one Ray's idle-worker reaping may stop), so the worker outlived its use.
            self._look(gcs)

    def _look(self, gcs: Any) -> None:
        """Wait up to ``interval`` for the hosts' boards (or sleep it), then deliver what came."""
        import ray
        from ray import exceptions as rex

        from fray_ray._notices import ROLL_S

        with self._lock:
            hosts = [(token, attrs.evolve(w)) for token, w in self._hosts.items()]
        boards = list({w.board: None for _, w in hosts if w.board is not None})  # each ref once (ray.wait wants that)
        ready: set[Any] = set()
        if boards:  # answered by the supervisor process as soon as a notice is posted
            try:
                ready = set(ray.wait(boards, num_returns=len(boards), timeout=self.interval, fetch_local=True)[0])
            except Exception:  # noqa: BLE001 - Ray is shutting down here: look again next time
                time.sleep(self.interval)
        else:
            time.sleep(self.interval)
        now = time.monotonic()
        for token, w in hosts:
            deadline: float | None = None
            if w.board is not None:
                if w.board not in ready:
                    # every epoch ends within ROLL_S: one this late has an owner that is gone without a word
                    # (its node lost, no connection reset): the KV key from now on
                    if now - w.since > ROLL_S + BOARD_SLACK:
                        self._set_board(token, None)
                    continue
                try:
                    notices, after = ray.get(w.board, timeout=5)
                    deadline, after = notices.get(w.board_key), after[0]
                except rex.GetTimeoutError:
                    continue  # fetching it took long: the same board next time
                except Exception:  # noqa: BLE001 - the supervisor process is gone: the KV key from now on
                    after = None
                if deadline is None:
                    self._set_board(token, after)
                    continue
            else:
                try:
                    value = gcs.internal_kv_get(w.kv_key, b"fray", timeout=5)
                except Exception:
                    continue  # the GCS is busy or restarting: ask again
                if not value:
                    continue
                try:
                    deadline = float(value.decode())
                except ValueError:
                    deadline = time.time() + 30.0  # unreadable: a notice still, with the runner's default grace
            with self._lock:
                if self._hosts.pop(token, None) is None:
                    continue  # the host ended meanwhile: the notice is not for what runs here now
            _deliver_notice(w.me, w.notice_file, deadline, "its supervisor" if w.board is not None else "Ray's KV")

    def _set_board(self, token: str, board: Any) -> None:
        with self._lock:
            w = self._hosts.get(token)
            if w is not None:
                w.board, w.since = board, time.monotonic()


def _deliver_notice(me: HostProcess, notice_file: str | None, deadline: float, via: str) -> None:
    """Write the notice's deadline for ``preemption_notice()`` and SIGTERM the host; ``via``: whence it came."""
    from fray_core.hostapi import write_notice

    try:
        if notice_file:
            write_notice(notice_file, deadline)
        print(
            f"[fray] preemption notice (from {via}): this slice goes at {deadline:.3f}; SIGTERM",
            file=sys.stderr,
            flush=True,
        )
    except Exception:  # noqa: BLE001 - the SIGTERM below is the notice that matters
        pass
    try:
        signal_host(me, signal.SIGTERM)
    except Exception:  # noqa: BLE001 - one host's failure must not end the watch of the next
        pass


BOARD_SLACK = 60.0  # seconds past an epoch's longest life before a host takes its supervisor as gone
_DRAINS = _DrainWatch()


def gce_preempted(timeout: float = 0.5) -> bool:
    """GCE's metadata server says this VM was preempted. ``False`` off GCE (no metadata server)."""
    req = urllib.request.Request(_GCE_PREEMPTED_URL, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read().decode().strip().upper() == "TRUE"
    except Exception:
        return False


@attrs.frozen
class HostConfig:
    """Per-job settings a host needs, shipped with every host task."""

    sys_path: tuple[str, ...]
    cwd: str
    supervisor: Any  # the job's supervisor actor handle (receives log lines, host reports); None: print only
    preemption_probe: Callable[[], bool] | None = gce_preempted
    clean_lockfile: bool = True
    job_id: str = ""  # the job's id, with which the host's calls to its (shared) supervisor name it
    # the worker may run other tasks after this one (a CPU replica's): undo what the host changed in it
    shared_worker: bool = False
    # the ref of the supervisor process's current notice epoch (``fray_ray._notices``); None: read the KV
    notice_board: Any = None


class _LogPump:
    """Tees this process's fd 1 and 2 into a pipe; lines go to the original stdout and, in batches, to the
    supervisor. ``close`` flushes and waits (bounded) for the last batch to be delivered."""

    def __init__(self, tag: str, supervisor: Any, job_id: str = "") -> None:
        self.tag = tag
        self.supervisor = supervisor
        self.job_id = job_id
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._last_send: Any = None
        self._closed = False
        self._dropped = 0
        sys.stdout.flush()
        sys.stderr.flush()
        self._orig_out = os.dup(1)
        self._orig_err = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.close(w)
        self._r = r
        # one thread reads the pipe and sends the batches (two before: a thread start is ~1 ms of a reused
        # worker's time under load, and most small jobs print nothing, issue 29)
        self._reader = threading.Thread(target=self._read, daemon=True, name="fray-log-reader")
        self._reader.start()

    def feed(self, line: str) -> None:
        with self._lock:
            self._pending.append(line)
            if len(self._pending) > LOG_PENDING_MAX:  # the supervisor is far behind: memory stays bounded
                del self._pending[: len(self._pending) - LOG_PENDING_MAX]
                self._dropped += 1
        self.tail.append(line)

    def _read(self) -> None:
        # chunks, never a line at a time: output with no newline (progress bars) takes bounded memory
        splitter = LineSplitter()
        due = time.monotonic() + LOG_SEND_INTERVAL  # the next batch, whatever the output
        # poll, not select: a reused worker's fds pass 1024 (FD_SETSIZE), where select raises
        poller = select.poll()
        poller.register(self._r, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            while True:
                left = due - time.monotonic()
                if left <= 0 or not poller.poll(max(0.0, left) * 1000):
                    try:
                        self._flush()
                    except Exception:  # noqa: BLE001 - the log is best effort; the pipe must keep draining
                        pass
                    due = time.monotonic() + LOG_SEND_INTERVAL
                    continue
                chunk = os.read(self._r, READ_SIZE)
                if chunk:
                    _write_all(self._orig_out, chunk)
                for line in splitter.feed(chunk) if chunk else splitter.close():
                    self.feed(line)
                if not chunk:
                    break
        finally:
            os.close(self._r)

    def _flush(self, last: bool = False) -> None:
        import ray

        if self.supervisor is None or (self._closed and not last):
            return  # closed: only close()'s last batch goes (a reader outliving it sends nothing after it)
        if (
            not last
            and self._last_send is not None
            and not ray.wait([self._last_send], timeout=0, fetch_local=False)[0]
        ):
            return  # one batch in flight at a time: the lines wait here (bounded), not in Ray's queues
        with self._lock:
            lines, self._pending = self._pending, []
            dropped, self._dropped = self._dropped, 0
        if dropped:
            lines.insert(0, f"[fray] {dropped} line(s) of this host dropped: the job's supervisor could not keep up")
        if lines or last:
            # the last batch (lines or none) says the host is ending: close() waits for it, so the supervisor
            # knows before this task's reply is sent, and never cancels a task whose reply is on its way
            # (RaySliceProvider._cancel_unfinished)
            self._last_send = self.supervisor.append_log.remote(self.job_id, self.tag, lines, last)

    def close(self) -> None:
        import ray

        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._orig_out, 1)  # closes the pipe's write ends: the reader drains and stops
        os.dup2(self._orig_err, 2)
        self._reader.join(5.0)
        self._closed = True
        self._flush(last=True)
        if self._last_send is not None:
            try:
                ray.get(self._last_send, timeout=LAST_BATCH_WAIT)
            except Exception:
                pass  # the supervisor is gone or slow: the log is best effort, the result is not
        # the reader done, the saved fds go (a reused worker would leak two a task); a reader still writing to
        # _orig_out keeps both open (a fresh worker's exit closes them)
        if not self._reader.is_alive():
            for fd in (self._orig_out, self._orig_err):
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a signal can cut a write to a pipe short)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _die_with_parent() -> None:
    # A binary's process must not outlive its host task when Ray kills the worker (cancel, preemption).
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    os.setsid()


def _run_binary(cmd: list[str], where: str, pump: _LogPump) -> None:
    oom = OomWatch.of()  # the binary is forked into this worker's memory cgroup: its OOM kills may be the binary's
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
    )
    assert proc.stdout is not None
    # A graceful stop signals the binary itself (it carries the host's token): the worker waits on for
    # it to checkpoint and exit, rather than dying at once and taking the binary with it.
    before = (
        signal.signal(signal.SIGTERM, signal.SIG_IGN) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        while chunk := os.read(proc.stdout.fileno(), READ_SIZE):  # chunks, not lines: bounded memory
            _write_all(1, chunk)  # through the pump: logged and kept in its tail
        rc = proc.wait()
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)
    if rc != 0:
        time.sleep(0.05)  # let the reader take the last lines into the tail
        tail = "\n".join(pump.tail)
        raise CommandFailedError(
            f"{exit_code_text(rc)}{oom_suffix(rc, oom)} on {where}; last output:\n{tail}", exit_code=rc
        )


def host_payload(entrypoint: Any) -> tuple[Any, ...]:
    """What a host needs of an :class:`~fray_core.types.Entrypoint`, as plain values, so that unpickling
    it on the host imports only what the user's code needs (``fray_core.types`` costs a host ~27 ms of
    CPU): ``("call", fn, args, kwargs)`` or ``("run", command)``."""
    if entrypoint.binary is not None:
        return ("run", list(entrypoint.command))
    return ("call", entrypoint.callable, tuple(entrypoint.positional), dict(entrypoint.function_args or {}))


def run_host(entry_bytes: bytes, env: dict[str, str], tag: str, where: str, config: HostConfig) -> Any:
    """The body of a host task: returns the callable's value (``None`` for a binary that exits 0).
    ``entry_bytes``: :func:`host_payload`, pickled."""
    if not config.shared_worker:
        return _run_host(entry_bytes, env, tag, where, config)
    # A worker Ray reuses: what this host changes in the process is undone, the next task starts as Ray
    # left it (threads the user's code started and left running are the one thing not undone, as with any
    # Ray task; processes it started are killed: see _Reaper).
    saved_env, saved_path, saved_cwd = dict(os.environ), list(sys.path), os.getcwd()
    try:
        return _run_host(entry_bytes, env, tag, where, config)
    finally:
        from fray_core import hostapi

        hostapi.set_channel()
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        try:
            os.chdir(saved_cwd)
        except OSError:
            pass


def run_shared_host(entry_bytes: bytes, env: dict[str, str], tag: str, where: str, config: HostConfig) -> Any:
    """:func:`run_host` as a function of its own name: the body of a CPU replica's task, which Ray runs in a
    worker it reuses (``max_calls`` is the remote function's, see ``fray_ray.provider``)."""
    return run_host(entry_bytes, env, tag, where, config)


def _run_host(entry_bytes: bytes, env: dict[str, str], tag: str, where: str, config: HostConfig) -> Any:
    for p in reversed(config.sys_path):
        if p not in sys.path and os.path.isdir(p):
            sys.path.insert(0, p)
    if os.path.isdir(config.cwd):
        os.chdir(config.cwd)
    # The node's own TPU identity wins over the one the runner computed: on a labelled cluster they agree
    # (host h is bound to worker h), on a label-less one only worker 0 is known, and the node's topology is
    # the slice's real shape.
    own = {k: os.environ[k] for k in ("TPU_WORKER_ID", "TPU_TOPOLOGY") if k in env and os.environ.get(k)}
    os.environ.update(env)
    os.environ.update(own)
    os.environ["PYTHONUNBUFFERED"] = "1"
    # Neither can start (no fds, no fork): no pump says the host is ending, so it says so itself before its
    # task's error reply exists (RaySliceProvider._cancel_unfinished)
    try:
        reaper = _Reaper()  # first: if it cannot start, no pump is left on fds 1 and 2
    except BaseException:
        _say_ending(config, tag)
        raise
    try:
        pump = _LogPump(tag, config.supervisor, config.job_id)
    except BaseException:
        reaper.finish()
        _say_ending(config, tag)
        raise
    unbeat: Callable[[], None] | None = None
    is_tpu = "TPU_WORKER_ID" in env
    lockfile = os.environ.get(LOCKFILE_ENV) or LIBTPU_LOCKFILE  # the job's env, else the node's
    try:
        # a stalled host's stacks, every thread, even one stuck in C code (a hung collective), into the pump
        # (fd 2): see RaySliceProvider.dump_stacks. Inside the try: if it fails, the pump still says its last
        # batch and the reaper still ends. Left registered at the end: a fresh worker runs this one task, and
        # a reused one registers it again (fd 2 is then the next host's pump)
        faulthandler.register(STACKS_SIGNAL, file=2, all_threads=True)
        if is_tpu and config.clean_lockfile:
            _check_device(lockfile, where)
        payload = cloudpickle.loads(entry_bytes)
        if config.supervisor is not None:
            import ray

            me = HostProcess(
                ray.get_runtime_context().get_node_id(),
                os.getpid(),
                start_ticks(os.getpid()),
                reaper.token,
                shared=config.shared_worker,
            )
            if config.shared_worker:
                _write_mark(reaper.token)
            config.supervisor.host_started.remote(config.job_id, tag, me)
            unbeat = _beat_to_gcs(f"fray-hb:{env.get('FRAY_JOB_ID', '')}:{tag}")
            _DRAINS.add(me, os.environ.get("FRAY_NOTICE_FILE"), config.notice_board)
        try:
            if payload[0] == "run":
                _run_binary(payload[1], where, pump)
                return None
            _, fn, args, kwargs = payload
            try:
                return call_entrypoint(fn, args, kwargs)
            except EntrypointExit as e:  # sys.exit(code) in the user's function (or on SIGTERM): its code decides
                raise CommandFailedError(f"{e} on {where}", exit_code=e.exit_code) from e.__cause__
        except BaseException as e:
            if config.preemption_probe is not None and config.preemption_probe():
                raise HostPreemptedError(
                    f"{where} was preempted (cloud metadata) while running: {type(e).__name__}: {e}"
                ) from e
            if is_tpu:  # a device fault: told by the device's state first, then by known signatures
                holders = device_holders(lockfile, exclude=frozenset(_our_processes()))
                if holders:
                    pid, path = holders[0]
                    raise TpuBusyError(
                        f"TPU device busy on {where}: {path} is held by pid {pid} ({_cmdline(pid)}); the "
                        f"job failed with {type(e).__name__}: {e}"
                    ) from e
                _raise_device_fault(e, where, lockfile, pump)
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        if unbeat is not None:
            unbeat()
        _DRAINS.remove(reaper.token)
        if config.shared_worker:
            _remove_mark()
        reaper.finish()
        pump.close()


def _say_ending(config: HostConfig, tag: str) -> None:
    """Tell the supervisor this host is ending, and wait (bounded) until it knows: what the log pump's last
    batch does (:meth:`_LogPump.close`), for a host that fails before its pump exists."""
    if config.supervisor is None:
        return
    import ray

    try:
        ray.get(config.supervisor.append_log.remote(config.job_id, tag, [], True), timeout=LAST_BATCH_WAIT)
    except Exception:  # noqa: BLE001 - the supervisor is gone or slow: the host's own error is what matters
        pass


def _write_mark(token: str) -> None:
    """Say on this node that this worker runs the host of ``token`` (see :func:`worker_mark`)."""
    path = worker_mark(os.getpid())
    try:
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # no mark: a graceful stop reaches only the host's own processes, not this worker


def _remove_mark() -> None:
    try:
        os.unlink(worker_mark(os.getpid()))
    except OSError:
        pass


def _raise_device_fault(e: BaseException, where: str, lockfile: str, pump: _LogPump) -> None:
    """Raise :class:`DeviceFaultError` when the host's failure (its error, traceback and last output) shows a
    known TPU-host fault's signature, removing libtpu's lockfile (no other process holds it: checked before)."""
    killed = -e.exit_code if isinstance(e, CommandFailedError) and e.exit_code < 0 else None
    text = f"{type(e).__name__}: {e}\n{traceback.format_exc()}\n" + "\n".join(pump.tail)
    fault = device_fault(text, killed)
    if fault is None:
        return
    removed = ""
    if os.path.exists(lockfile):
        try:
            os.remove(lockfile)
            removed = " (lockfile removed)"
        except OSError:
            pass
    raise DeviceFaultError(f"{fault} on {where}{removed}\n{type(e).__name__}: {e}", fault) from e


def _our_processes() -> set[int]:
    """This process's descendants (they may hold the device legitimately)."""
    children: dict[int, list[int]] = {}
    for pid_dir in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{pid_dir}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(pid_dir[6:]))
    out, todo = set(), [os.getpid()]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out

"""The Ray host's reaper (``fray_ray._host._Reaper``), without Ray: a host task does not wait for its
reaper to come up (that cost every host 30-90 ms before the user's code), so the reaper must still kill
what the host started when the host's worker is gone before the reaper even ran."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from fray_core.records import pid_alive

from helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]

# The "worker": starts its reaper, starts a child that carries the host's token (any process the user's code
# starts does), prints the child's pid and dies at once, the way a cancelled or preempted worker does.
WORKER = r"""
import os, subprocess, sys
from fray_ray._host import _Reaper
reaper = _Reaper()
child = subprocess.Popen(
    ["sleep", "120"],
    start_new_session=True,
    stdin=subprocess.DEVNULL,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
print(child.pid, flush=True)
os._exit(0 if "ray" not in sys.modules else 3)
"""


def run_worker_and_expect_its_child_killed(script: str) -> None:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr  # 3: importing the host module imported ray
    child = int(out.stdout.split()[0])
    try:
        wait_for(lambda: not pid_alive(child), timeout=20, what=f"the host's child {child} to be killed by the reaper")
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass


def test_what_a_host_started_is_killed_when_its_worker_dies_before_the_reaper_is_up() -> None:
    run_worker_and_expect_its_child_killed(WORKER)


def test_a_host_that_ends_normally_has_its_children_killed() -> None:
    run_worker_and_expect_its_child_killed(WORKER.replace("os._exit(0 if", "reaper.finish()\nos._exit(0 if"))


def test_the_reaper_runs_at_the_lowest_cpu_priority() -> None:
    # Its start-up and its final sweep must not compete with the start of the hosts beside it.
    script = r"""
import sys
from fray_ray._host import _Reaper
reaper = _Reaper()
print("up", flush=True)
sys.stdin.readline()
reaper.finish()
"""
    worker = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert worker.stdout is not None and worker.stdin is not None
        assert worker.stdout.readline().strip() == "up"

        def reaper_nice() -> int | None:
            for d in os.listdir("/proc"):
                if d.isdigit() and int(d) != worker.pid:
                    try:
                        with open(f"/proc/{d}/cmdline", "rb") as f:
                            args = f.read().split(b"\0")
                        # the reaper's arguments: -c SCRIPT WORKER_PID WORKER_START_TICKS
                        if len(args) < 4 or args[-3] != str(worker.pid).encode() or b"sweep" not in args[-4]:
                            continue
                        with open(f"/proc/{d}/stat", "rb") as f:
                            return int(f.read().rsplit(b")", 1)[1].split()[16])  # field 19: nice
                    except (OSError, ValueError):
                        continue
            return None

        assert wait_for(lambda: reaper_nice() == 19, timeout=20, what="the reaper to run at nice 19")
        worker.stdin.write("\n")
        worker.stdin.flush()
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()


def test_a_signal_for_a_host_reaches_a_reused_worker_only_while_it_runs_that_host(tmp_path: Path) -> None:
    """A CPU replica's worker runs other tasks after it (Ray reuses it): a graceful stop or a stacks dump sent
    for a host that ended must not reach the next task. The worker says on its node which host it runs now."""
    from fray_core._procfs import start_ticks
    from fray_ray import _host

    me = os.getpid()
    shared = _host.HostProcess("node", me, start_ticks(me), "token-a", shared=True)
    fresh = _host.HostProcess("node", me, start_ticks(me), "token-a")
    mark = Path(_host.worker_mark(me))
    try:
        assert not _host._runs_host(shared)  # no mark: the host ended (the worker is idle)
        assert _host._runs_host(fresh)  # a fresh worker is its host's for its whole life
        _host._write_mark("token-b")
        assert not _host._runs_host(shared)  # the worker runs another job's host now
        _host._write_mark("token-a")
        assert _host._runs_host(shared)
        _host._remove_mark()
        assert not mark.exists() and not _host._runs_host(shared)
        gone = _host.HostProcess("node", me, (start_ticks(me) or 0) + 1, "token-a")
        assert not _host._runs_host(gone)  # the pid is another process's now
    finally:
        mark.unlink(missing_ok=True)


def test_a_reused_worker_has_one_reaper_which_kills_each_hosts_processes_when_that_host_ends() -> None:
    """A CPU replica's worker runs host after host (Ray reuses it): one reaper serves them all, and a host's
    end kills that host's processes only, not those of the host running after it."""
    script = r"""
import os, subprocess, sys
from fray_ray import _host

def child():
    return subprocess.Popen(["sleep", "120"], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid

first = _host._Reaper()
a = child()
first.finish()
second = _host._Reaper()
b = child()
print(a, b, _host._reaper_pipe() == first._w == second._w, flush=True)
sys.stdin.readline()
second.finish()
print("done", flush=True)
sys.stdin.readline()
"""
    worker = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    pids: list[int] = []
    try:
        assert worker.stdout is not None and worker.stdin is not None
        a, b, same = worker.stdout.readline().split()
        pids = [int(a), int(b)]
        assert same == "True"  # both hosts told the same reaper
        wait_for(lambda: not pid_alive(pids[0]), timeout=20, what="the first host's child to be killed at its end")
        assert pid_alive(pids[1])  # the second host still runs: its child lives on
        worker.stdin.write("\n")
        worker.stdin.flush()
        assert worker.stdout.readline().strip() == "done"
        wait_for(lambda: not pid_alive(pids[1]), timeout=20, what="the second host's child to be killed at its end")
        assert worker.poll() is None  # the worker itself lives on, as a reused one does
        worker.stdin.write("\n")
        worker.stdin.flush()
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_a_host_after_its_workers_reaper_was_killed_gets_a_new_reaper() -> None:
    """A reaper killed (out of memory, by hand) must not fail every later host of its worker: the next host
    starts another one, which kills that host's processes at its end."""
    script = r"""
import os, signal, subprocess, sys, time
from fray_ray import _host

first = _host._Reaper()
first.finish()
reaper_pid = None
for d in os.listdir("/proc"):
    try:
        args = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
    except OSError:
        continue
    if len(args) >= 4 and args[-3] == str(os.getpid()).encode() and b"sweep" in args[-4]:
        reaper_pid = int(d)
os.kill(reaper_pid, signal.SIGKILL)
def gone(pid):
    try:
        return open("/proc/%d/stat" % pid, "rb").read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True
while not gone(reaper_pid):
    time.sleep(0.01)
second = _host._Reaper()  # the dead reaper's pipe: a new one is started
child = subprocess.Popen(["sleep", "120"], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid
second.finish()
print(child, flush=True)
sys.stdin.readline()
"""
    worker = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT,
    )  # fmt: skip
    child = None
    try:
        assert worker.stdout is not None and worker.stdin is not None
        line = worker.stdout.readline()
        assert line.strip(), worker.stderr.read() if worker.stderr else ""
        child = int(line)
        wait_for(lambda: not pid_alive(child), timeout=20, what="the host's child to be killed by the new reaper")
        worker.stdin.write("\n")
        worker.stdin.flush()
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass


def test_a_hosts_output_reaches_its_log_whatever_the_workers_fd_numbers() -> None:
    """A reused worker's fds pass 1024 over its tasks: the host's output pipe must still be read (select()
    cannot watch an fd >= 1024; a reader that died left every print failing with a broken pipe)."""
    script = r"""
import os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
from fray_ray._host import _LogPump
pump = _LogPump("t", None)
print("through the pump", flush=True)
pump.close()
print("tail:", list(pump.tail), flush=True)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "tail: ['through the pump']" in out.stdout, out.stdout + out.stderr

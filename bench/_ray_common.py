"""Shared pieces of the Ray benchmarks (not a benchmark itself): host bodies that leave a start marker,
the hand-written placement-group baseline, the one gang-launch measure, and waiting for the emulated
cluster to be idle.

Markers are files ``<dir>/<tag>__<slice name>__<worker id>__<attempt>`` holding ``time.time()`` at the
host's start, the pid and the start time of the process the function runs in; every emulated host runs on
this machine, so one wall clock serves all of them.

THE gang-launch measure (every Ray script uses it, through :func:`gang_times`):

- **all hosts running** = from the launch call (``cluster.launch``, ``placement_group``, or the peer's
  entry call) to the moment the LAST host's function started (the latest start marker);
- **end to end** = from the same launch call to every host's result back in the calling process (for
  fray: ``wait`` returned; raw Ray: ``ray.get`` of every host's task returned and the groups removed).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

TPU_TYPE = "v4-16"  # 2 hosts x 4 chips per slice
SLICE_NAME_LABEL = "ray.io/tpu-slice-name"


def _self_stat() -> list[str]:
    """Fields 3.. of ``/proc/self/stat`` (after the command name; the standard library only: host bodies
    carry this module by value, and importing fray_core there would cost raw Ray's hosts too)."""
    with open("/proc/self/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_start_time() -> float:
    """Wall time at which this process was created (from ``/proc``, 10 ms resolution)."""
    ticks = int(_self_stat()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def process_cpu() -> float:
    """CPU seconds (user + system) this process has used since it was created (from ``/proc``, 10 ms
    resolution): on a host, what its start-up cost before the function ran, whatever the load."""
    fields = _self_stat()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_marker(marker_dir: str, tag: str, attempt: str | None = None) -> float:
    """Record that this host started (called first thing on the host); ``attempt`` defaults to
    ``$FRAY_ATTEMPT`` (set by fray), else the content of ``<marker_dir>/<tag>.attempt`` (written by a
    benchmark before it removes a slice, for peers that do not number attempts), else ``"0"``."""
    t = time.time()
    if attempt is None:
        attempt = os.environ.get("FRAY_ATTEMPT")
    if attempt is None:
        try:
            with open(os.path.join(marker_dir, f"{tag}.attempt")) as f:
                attempt = f.read().strip() or "0"
        except OSError:
            attempt = "0"
    name = f"{tag}__{os.environ.get('TPU_NAME', '?')}__{os.environ.get('TPU_WORKER_ID', '?')}__{attempt}__{os.getpid()}"
    tmp = os.path.join(marker_dir, "." + name)
    with open(tmp, "w") as f:
        f.write(f"{t!r} {os.getpid()} {process_start_time()!r} {process_cpu()!r}")
    os.replace(tmp, os.path.join(marker_dir, name))  # readers never see a half-written marker
    return t


def marker_details(marker_dir: str, tag: str) -> list[dict[str, Any]]:
    """Every start marker of ``tag``: ``slice``, ``worker``, ``attempt``, ``t`` (function start), ``pid``,
    ``process_start`` (when that process was created), ``cpu`` (CPU seconds that process had used when
    the function started)."""
    out = []
    for fn in os.listdir(marker_dir):
        parts = fn.split("__")
        if parts[0] != tag or len(parts) < 4:
            continue
        with open(os.path.join(marker_dir, fn)) as f:
            t, pid, pstart, cpu = f.read().split()
        out.append(
            {
                "slice": parts[1],
                "worker": parts[2],
                "attempt": parts[3],
                "t": float(t),
                "pid": int(pid),
                "process_start": float(pstart),
                "cpu": float(cpu),
            }
        )
    return out


def markers(marker_dir: str, tag: str) -> list[tuple[str, str, str, float]]:
    """``(slice name, worker id, attempt, start time)`` of every host that started under ``tag``."""
    return [(m["slice"], m["worker"], m["attempt"], m["t"]) for m in marker_details(marker_dir, tag)]


def gang_times(t_launch: float, marker_dir: str, tag: str, hosts: int, t_done: float) -> tuple[float, float]:
    """THE gang-launch measure (module doc): ``(all hosts running, end to end)`` in seconds after the launch
    call ``t_launch``; checks that exactly ``hosts`` hosts started."""
    starts = [m[3] for m in markers(marker_dir, tag)]
    if len(starts) != hosts:
        raise AssertionError(f"{tag}: {len(starts)} host(s) started, expected {hosts}")
    return max(starts) - t_launch, t_done - t_launch


def mark(marker_dir: str, tag: str) -> str:
    """A trivial host body: mark the start, return."""
    write_marker(marker_dir, tag)
    return os.environ.get("TPU_WORKER_ID", "?")


QUIET_BUSY = 0.25  # the machine is quiet when at most this share of all its cores is busy ...
QUIET_WINDOW = 0.25  # ... in two windows of this many seconds in a row
QUIET_TIMEOUT = 20.0  # seconds to wait for that before a case starts anyway (counted in ``not_quiet``)
not_quiet = 0  # cases that started on a machine that was not quiet within QUIET_TIMEOUT


def _cpu_ticks() -> tuple[int, int]:
    """(all ticks, idle + iowait ticks) of every core since boot, from ``/proc/stat``."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


def machine_cpu() -> float:
    """CPU seconds every process on the machine has used since boot (all cores, not idle, not waiting for
    I/O): the difference over a launch is what the launch cost the machine, whoever spent it (Ray's
    daemons, a supervisor, the host workers, the driver), independent of how the cores were shared."""
    total, idle = _cpu_ticks()
    return (total - idle) / os.sysconf("SC_CLK_TCK")


class CpuTrace:
    """:func:`machine_cpu` sampled every ``step`` seconds in a thread (reading ``/proc/stat`` costs ~20 us),
    so the CPU spent up to an instant known only afterwards (the last host's start) can be read off::

        with CpuTrace() as trace:
            ...launch...
        trace.at(t_all_running) - trace.at(t_launch)
    """

    def __init__(self, step: float = 0.01) -> None:
        self.step = step
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-trace")

    def _run(self) -> None:
        while not self._stop.wait(self.step):
            self.samples.append((time.time(), machine_cpu()))

    def __enter__(self) -> CpuTrace:
        self.samples.append((time.time(), machine_cpu()))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), machine_cpu()))

    def at(self, t: float) -> float:
        """Machine CPU seconds at wall time ``t`` (linear between the samples around it)."""
        s = self.samples
        if t <= s[0][0]:
            return s[0][1]
        for (t0, c0), (t1, c1) in zip(s, s[1:]):
            if t <= t1:
                return c0 + (c1 - c0) * (t - t0) / max(1e-9, t1 - t0)
        return s[-1][1]


def cpu_busy(window: float = QUIET_WINDOW) -> float:
    """The share of all cores busy (not idle, not waiting for I/O) during the next ``window`` seconds."""
    total0, idle0 = _cpu_ticks()
    time.sleep(window)
    total1, idle1 = _cpu_ticks()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_quiet(timeout: float | None = None) -> bool:
    """Wait until the machine is quiet (see ``QUIET_BUSY``); False when it was not within ``timeout``
    (default ``QUIET_TIMEOUT``, read at the call: a ``--smoke`` run sets it to 0, see :func:`smoke`).

    Why: every peer's gang launch is a burst of CPU (fresh worker processes importing Ray) on the same
    cores, and so is what a previous case left behind (raw Ray workers exiting, eformer's idle workers,
    fray's next warm supervisor starting: ~1.3 s of CPU on the head node). Without this, each case would
    pay for the one before it, whichever peer that was."""
    global not_quiet
    end = time.monotonic() + (QUIET_TIMEOUT if timeout is None else timeout)
    calm = 0
    while time.monotonic() < end:
        calm = calm + 1 if cpu_busy() <= QUIET_BUSY else 0
        if calm >= 2:
            return True
    not_quiet += 1
    return False


def smoke() -> None:
    """A ``--smoke`` run checks that the script works, not its figures: no case waits for a quiet machine.
    In CI the other test worker keeps the machine busy, so every case waited the whole ``QUIET_TIMEOUT``:
    peers_ray's smoke took 233 s there against 73 s on a quiet machine, and once passed pytest's 300 s."""
    global QUIET_TIMEOUT
    QUIET_TIMEOUT = 0.0


def wait_idle(
    total_slices: int, hosts_per_slice: int, chips_per_host: int, head_resource: str, timeout: float = 60.0
) -> float:
    """Wait (untimed) until every TPU chip and slice head is free again and the machine is quiet
    (:func:`wait_quiet`); returns the seconds waited."""
    import ray

    t0 = time.monotonic()
    want_tpu = total_slices * hosts_per_slice * chips_per_host
    while time.monotonic() - t0 < timeout:
        avail = ray.available_resources()
        if avail.get("TPU", 0) >= want_tpu and avail.get(head_resource, 0) >= total_slices:
            wait_quiet()
            return time.monotonic() - t0
        time.sleep(0.05)
    raise TimeoutError(f"the emulated cluster did not become idle in {timeout:.0f} s: {ray.available_resources()}")


def baseline_placement_groups(slice_names: list[str], hosts: int, chips: int) -> list[Any]:
    """One placement group per slice: a ``{"TPU": chips}`` bundle per host, bound to that slice's nodes
    by label selector (the way ``ray.util.tpu`` and fray_ray's provider bind them)."""
    from ray.util.placement_group import placement_group

    return [
        placement_group(
            [{"TPU": float(chips)}] * hosts, strategy="SPREAD", bundle_label_selector=[{SLICE_NAME_LABEL: name}] * hosts
        )
        for name in slice_names
    ]


def host_task_options(pg: Any, bundle: int, chips: int) -> dict[str, Any]:
    """Ray task options of one host: the same resources fray_ray gives a TPU host task."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "num_cpus": 0,
        "resources": {"TPU": float(chips)},
        "max_retries": 0,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle
        ),
    }


def wait_for(pred: Any, timeout: float, what: str, step: float = 0.01) -> Any:
    """Poll ``pred`` until it returns something true (returned), or raise ``TimeoutError`` naming ``what``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def task_events(name_prefixes: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """Ray's own record of the named tasks (``name`` starts with one of ``name_prefixes``): per task name,
    the wall time at which it entered each state (``ray.core.generated.common_pb2.TaskStatus`` numbers:
    1 PENDING_ARGS_AVAIL = created/submitted, 5 SUBMITTED_TO_WORKER = a worker got it, 8 RUNNING).
    Read from the GCS (private API, no dashboard needed); workers report every second, so call it a
    couple of seconds after the tasks ran. Empty when this Ray cannot answer."""
    try:
        from ray._private.state import state

        events = state._get_all_task_events()
    except Exception:
        return {}
    names: dict[bytes, str] = {}
    ts: dict[bytes, dict[int, float]] = {}
    for ev in events:
        key = ev.task_id + bytes([ev.attempt_number % 256])
        if ev.HasField("task_info") and ev.task_info.name:
            names[key] = ev.task_info.name
        if ev.HasField("state_updates"):
            ts.setdefault(key, {}).update({int(k): v / 1e9 for k, v in ev.state_updates.state_ts_ns.items()})
    return {name: ts.get(key, {}) for key, name in names.items() if name.startswith(name_prefixes)}


SUBMITTED, TO_WORKER, RUNNING = 1, 5, 8


def med_p90(xs: list[float]) -> tuple[float, float]:
    """Median and 90th percentile (nearest rank)."""
    s = sorted(xs)
    return statistics.median(s), s[min(len(s) - 1, max(0, int(round(0.9 * len(s) + 0.5)) - 1))]

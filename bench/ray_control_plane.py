"""The Ray control plane's cost per Fray job, at fleet-sized clusters, against Ray's own job submission (issue 29).

    python bench/ray_control_plane.py                          # 1,008 phantom hosts, 10 s windows, 50 + 200 jobs
    python bench/ray_control_plane.py --hosts 1008 4000 16000  # the issue's sizes (minutes: run it rarely)
    python bench/ray_control_plane.py --smoke                  # 64 hosts, 1 s windows, 1 + 2 jobs (CI)

**The phantom-node method.** One emulated cluster (``fray_ray.testing.fake_tpu_cluster({"v4-16": 1})``: a head
and one real v4-16 slice, 2 hosts, each its own raylet). Then N TPU-host-shaped nodes are registered with its
GCS without any raylet: ``NodeInfoGcsService.RegisterNode`` called directly over gRPC with the protobufs Ray
ships (``ray.core.generated``). Each phantom node carries what an emulated (and a real) TPU VM carries: the
``TPU`` resource (4 chips), ``accelerator_type:TPU-V4``, its slice-name resource, ``TPU-v4-128-head`` on worker
0 and the four ``ray.io/tpu-*`` labels; they form N/16 v4-128 slices (16 hosts each: 16,000 hosts = 1,000 x
v4-128). They have no CPU resource, so no task of the run can be sent to a node that does not exist, and they are
never a match for the v4-16 jobs measured. The GCS health-checks every node; nothing answers for the phantoms,
so the run sets the period to an hour (``RAY_health_check_period_ms``): per-cluster health checks are not in the
figures (they are the same for every job, Fray or not).

**Per job, at each N** (a steady window of ``--window`` seconds each, after the job settled): CPU seconds per
second of the GCS process (``/proc``) and of the head node (the head raylet and every process under it: Fray's
supervisor and scheduler actors, Ray's JobSupervisor actors and their entrypoints; plus the dashboard, its
agents, the autoscaler monitor and log monitor), as the difference from the window before. The head goal is
read from the control plane's own processes (``control``: Fray's supervisor and scheduler actors, Ray's
JobSupervisor actors; a process new in the window counted whole): the whole head's CPU moves by hundreds of
ms/s between two windows with nothing of the job in it (bench/NOTES.md, 2026-11-28). The cases:

- idle (baseline) -> Fray job RUNNING on a real slice (hosts sleep) -> + ``--running`` more RUNNING, each on
  a real slice of its own (what each further one adds: the first carries what its supervisor process shares
  with every job it supervises, one ``CheckAlive`` a second for all leases' nodes and one read of the draining
  nodes) -> + a Fray job QUEUED behind them -> + ``--queued`` - 1 more QUEUED (what each further one adds: the
  first carries the cluster's one view, which the scheduler actor reads once a second while any job waits);
- the same with Ray job submission (``JobSubmissionClient``): an entrypoint that creates the slice's placement
  group (label selector, the way Ray TPU code does) and runs a sleeping task per host (the further running
  ones likewise); the queued one waits in ``pg.ready()``.

GCS RPCs per second per job, by method, come from the GCS's own event stats (printed to ``gcs_server.out`` every
``RAY_event_stats_print_interval_ms``, set to 1 s here).

**Head memory per concurrent job**: ``--concurrent`` Fray jobs (``cpu=0``, a function that sleeps) vs as many Ray
job submission jobs (entrypoint ``python -c 'import time; time.sleep(...)'``: the lightest Ray job there is, which
flatters Ray), all running at once; PSS and private memory (``/proc/<pid>/smaps_rollup``) of every head process
the jobs added, plus what the existing head processes grew by, divided by the job count. Split into the
control plane (Fray's supervisor actor / Ray's JobSupervisor actor) and the rest (the job's own process).

**Throughput**: ``--jobs`` small CPU jobs (``sum(range(10**5))``) launched back to back; time until all
SUCCEEDED, for Fray (``launch`` x n, then ``wait``), raw Ray tasks (``f.remote()`` x n, ``ray.get``; the goal's
baseline), raw Ray tasks that each keep a record as a job must (the floor: a KV put before, the task's final
put, the client's read; cold and again at once), raw Ray tasks given the job's code as Fray ships it (Ray's
``working_dir``, the same package: what shipping code costs Ray itself) and Ray job submission (``submit_job``
x n, then polling ``get_job_status``); the median ``launch`` call.

The machine has 2 cores shared with others: read the ratios and the per-job deltas, not absolute seconds; the
load average before and after is printed. Goal lines are issue 29's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ray_common as common  # noqa: E402

TPU_TYPE = "v4-16"  # the real slice the measured jobs run on / queue for
PHANTOM_TYPE = "v4-128"  # 16 hosts x 4 chips per phantom slice
PHANTOM_HOSTS_PER_SLICE = 16
HOLD_S = 3600.0  # hosts of a running job sleep this long (they are terminated)
GOAL_GCS_MS = 2.0  # per job, ms of GCS CPU per second
GOAL_HEAD_MS = 10.0  # per job, ms of head CPU per second
# A job's memory request (Ray's "memory" resource): the default 4g lets only 12 jobs on the emulated cluster
# at once, and Ray's own tasks and jobs here ask for none.
SMALL_RAM = "64m"
GOAL_MEMORY_SHARE = 0.25  # Fray's head memory per job / Ray job submission's
GOAL_THROUGHPUT = 1.3  # Fray's time to all SUCCEEDED / raw Ray tasks'
GOAL_LAUNCH_MS = 20.0  # median launch call
FLOOR_NAMESPACE = "fray-bench-floor"  # Ray KV namespace of the floor's records (removed after)
NOISE_MS = 1.0  # "does not grow": the largest N's per-job GCS figure exceeds the smallest's by at most this ...
NOISE_SHARE = 0.5  # ... or this share of the larger one
# ... and the control plane's head CPU by at most this: a further job's figure, ~0 by construction, ranged from
# -3.8 to +4.2 ms/s between runs (the idle supervisor and scheduler move by a few ms/s: bench/NOTES.md)
NOISE_HEAD_MS = 5.0
RPC_NOISE = 0.2  # calls a second of one GCS method that a job must add for them to count as its own
TICK = os.sysconf("SC_CLK_TCK")

# Set before Ray starts, read by every Ray process of the run (RayConfig reads RAY_<name>).
RAY_ENV = {
    "RAY_health_check_period_ms": "3600000",  # nothing answers the phantom nodes' health checks
    "RAY_health_check_timeout_ms": "3600000",
    "RAY_event_stats_print_interval_ms": "1000",  # the GCS's RPC counters, every second, in gcs_server.out
    # The GCS asks every node for its resource load once a second (for the autoscaler): N calls a second to
    # phantoms that never answer made the idle GCS 150-330 ms/s at 1,000-4,000 hosts and its jitter hid every
    # per-job figure. Per cluster, the same for every job, Fray or not: off here like the health checks.
    "RAY_gcs_pull_resource_loads_period_milliseconds": "3600000",
}


def hold() -> str:
    """Host body of a running job: sleep (until terminated)."""
    import time as _time

    _time.sleep(HOLD_S)
    return "held"


def nap(seconds: float) -> str:
    """Body of a concurrent job (head memory)."""
    import time as _time

    _time.sleep(seconds)
    return "done"


def work() -> int:
    """Body of a throughput job: a few ms of CPU."""
    return sum(range(10**5))


def recorded_work(key: bytes) -> int:
    """:func:`work` as the least a job must do beyond a task (the throughput's floor): its final record put in
    Ray's KV store, where the client reads it back."""
    from ray.experimental import internal_kv

    out = work()
    internal_kv._internal_kv_put(key, b'{"status": "SUCCEEDED"}', overwrite=True, namespace=FLOOR_NAMESPACE)
    return out


# ------------------------------------------------------------------------------------------- /proc


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def _tree(roots: list[int], kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def _idle_workers() -> list[int]:
    """Ray worker processes that wait for a task (``ray::IDLE``)."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and _cmdline(int(d)).startswith("ray::IDLE")]


def _memory(pid: int) -> tuple[float, float]:
    """(PSS, private) MB of one process."""
    pss = private = 0.0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "Pss":
                    pss = int(rest.split()[0]) / 1024
                elif key in ("Private_Clean", "Private_Dirty"):
                    private += int(rest.split()[0]) / 1024
    except (OSError, ValueError):
        pass
    return pss, private


def _threads(pid: int) -> int:
    """The process's thread count (``/proc/<pid>/status``); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    except (OSError, StopIteration, ValueError):
        return 0


CONTROL_PROCESSES = ("JobSupervisor", "Scheduler")  # command-line marks of the control-plane actors (Head.control)


class Head:
    """The processes of the emulated cluster's GCS and head node (all on this machine, children of this one)."""

    def __init__(self, fake: Any) -> None:
        me = os.getpid()
        kids = _children()
        mine = kids.get(me, [])
        self.gcs = next(p for p in mine if "gcs_server" in _cmdline(p))
        raylets = [p for p in mine if "/raylet " in _cmdline(p) + " "]
        self.raylet = next(p for p in raylets if " --head " in _cmdline(p) + " ")
        # The dashboard, the autoscaler monitor and the log monitor run on the head too (children of this driver).
        self.others = [
            p for p in mine if any(k in _cmdline(p) for k in ("dashboard.py", "monitor.py", "log_monitor.py"))
        ]

    def pids(self) -> list[int]:
        """Every head process (not the GCS)."""
        return [p for p in _tree([self.raylet, *self.others], _children()) if p != self.gcs]

    def cpu(self) -> tuple[float, float, float]:
        """(GCS, head total, head workers) CPU seconds so far; workers = processes under the head raylet
        other than its agents (actors, their entrypoints)."""
        head = self.pids()
        workers = [p for p in _tree([self.raylet], _children()) if p != self.raylet and "agent" not in _cmdline(p)]
        return _cpu(self.gcs), sum(_cpu(p) for p in head), sum(_cpu(p) for p in workers)

    def control(self) -> dict[int, float]:
        """pid -> CPU seconds so far of each control-plane process on the head: Fray's supervisor and scheduler
        actors, Ray job submission's JobSupervisor actors (the per-job head CPU goal's subject: the whole head's
        CPU moves by hundreds of ms/s between windows with nothing of a job in it)."""
        return {
            p: _cpu(p)
            for p in _tree([self.raylet], _children())
            if p != self.raylet and any(k in _cmdline(p) for k in CONTROL_PROCESSES)
        }

    def memory(self) -> dict[int, tuple[float, float, str]]:
        """pid -> (PSS MB, private MB, command line) of every head process and the GCS."""
        return {p: (*_memory(p), _cmdline(p)) for p in [self.gcs, *self.pids()]}


# ------------------------------------------------------------------------------------------- GCS RPC counts

_STAT = re.compile(r"^\s*(\S+\.grpc_server\.(\w+)) - (\d+) total")
_EXEC = re.compile(
    r"^\s*\S+\.grpc_server\.(\w+) - \d+ total \(\d+ active\), "
    r"Execution time: mean = \S+, total = ([\d.]+)(ns|us|ms|s)\b"
)
_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0}
# Handlers whose "execution time" is a wait, not work: long polls and replies sent when something happens.
WAITING_RPCS = frozenset({"GcsSubscriberPoll", "WaitPlacementGroupUntilReady", "CreateActor", "WaitForActorRefDeleted"})


def gcs_rpc_ms(log_path: str) -> dict[str, float]:
    """The GCS's cumulative execution time (ms) of each RPC handler, by method, from the same print as
    :func:`gcs_rpc_counts` (``Execution time: ... total = X``): the GCS work a caller's RPCs cost, which the
    process's CPU shows only among everything else it does. Waiting handlers (:data:`WAITING_RPCS`) left out."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    for chunk in reversed(text.split("Gcs Debug state:")[1:]):
        out: dict[str, float] = {}
        for line in chunk.splitlines():
            m = _EXEC.match(line)
            if m and m.group(1) not in WAITING_RPCS:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2)) * _MS[m.group(3)]
        if out:
            return out
    return {}


def gcs_rpc_counts(log_path: str) -> dict[str, int]:
    """The GCS's cumulative count of each RPC it served, by method: the ``<Service>.grpc_server.<Method> - N
    total`` lines of its last complete print in ``gcs_server.out``. A print (``Gcs Debug state:``) holds one
    ``Event stats:`` block per io_context and the RPC handlers are counted in the main service's, the first:
    reading only the file's last block (another io_context's) found none."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    for chunk in reversed(text.split("Gcs Debug state:")[1:]):  # the last print may still be being written
        out: dict[str, int] = {}
        for line in chunk.splitlines():
            m = _STAT.match(line)
            if m:
                out[m.group(2)] = out.get(m.group(2), 0) + int(m.group(3))
        if out:
            return out
    return {}


# ------------------------------------------------------------------------------------------- phantom nodes


class Phantoms:
    """Registers TPU-host-shaped nodes with the GCS directly (no raylet): see the module doc."""

    def __init__(self, gcs_address: str) -> None:
        import grpc
        from ray.core.generated import gcs_service_pb2_grpc

        self.channel = grpc.insecure_channel(gcs_address)
        self.stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(self.channel)
        self.count = 0

    def node(self, i: int) -> Any:
        from ray.core.generated import gcs_pb2

        from fray_core.tpu import get_tpu_spec

        spec = get_tpu_spec(PHANTOM_TYPE)
        slice_name, worker = f"phantom-{PHANTOM_TYPE}-{i // spec.hosts}", i % spec.hosts
        resources = {
            "TPU": float(spec.chips_per_host),
            spec.accelerator_resource: 1.0,
            slice_name: 1.0,
            "memory": 16.0 * 1024**3,
        }
        if worker == 0:
            resources[spec.head_resource] = 1.0
        labels = {
            "ray.io/tpu-slice-name": slice_name,
            "ray.io/tpu-worker-id": str(worker),
            "ray.io/tpu-pod-type": spec.name,
            "ray.io/tpu-topology": spec.topology,
        }
        return gcs_pb2.GcsNodeInfo(
            node_id=os.urandom(28),
            node_manager_address="127.0.0.1",
            node_manager_port=1,  # nothing listens: see RAY_ENV
            object_manager_port=1,
            state=gcs_pb2.GcsNodeInfo.ALIVE,
            node_manager_hostname=f"{slice_name}-w{worker}",
            node_name=f"{slice_name}-w{worker}",
            resources_total=resources,
            labels=labels,
            start_time_ms=int(time.time() * 1000),
        )

    def grow_to(self, n: int) -> float:
        """Register phantoms until there are ``n``; returns the seconds it took."""
        from ray.core.generated import gcs_service_pb2

        t0 = time.monotonic()
        futures = []
        while self.count < n:
            futures.append(
                self.stub.RegisterNode.future(
                    gcs_service_pb2.RegisterNodeRequest(node_info=self.node(self.count)), timeout=120
                )
            )
            self.count += 1
            if len(futures) >= 64:  # a bounded number in flight
                for fut in futures:
                    fut.result()
                futures = []
        for fut in futures:
            fut.result()
        return time.monotonic() - t0

    def close(self) -> None:
        self.channel.close()


# ------------------------------------------------------------------------------------------- measuring


class Meter:
    """CPU windows of the GCS and the head, and the GCS's RPC counts over the same windows."""

    def __init__(self, head: Head, gcs_log: str, window: float) -> None:
        self.head, self.gcs_log, self.window = head, gcs_log, window
        self.history: list[dict[str, Any]] = []  # every window measured, in order

    def measure(self) -> dict[str, Any]:
        """Rates over one window: GCS / head / head-workers CPU in ms per second, RPCs per second by method."""
        time.sleep(1.2)  # a fresh event-stats print at the start
        r0, e0, c0, t0 = gcs_rpc_counts(self.gcs_log), gcs_rpc_ms(self.gcs_log), self.head.cpu(), time.monotonic()
        k0 = self.head.control()
        time.sleep(self.window)
        c1, t1 = self.head.cpu(), time.monotonic()
        k1 = self.head.control()
        time.sleep(1.2)
        r1, e1 = gcs_rpc_counts(self.gcs_log), gcs_rpc_ms(self.gcs_log)
        dt = t1 - t0
        rpcs = {k: (v - r0.get(k, 0)) / (dt + 1.2) for k, v in r1.items() if v - r0.get(k, 0) > 0}
        rpc_ms = {k: (v - e0.get(k, 0.0)) / (dt + 1.2) for k, v in e1.items() if v - e0.get(k, 0.0) > 0}
        self.history.append({"rpcs": rpcs, "rpc_ms": rpc_ms})
        return {
            "gcs": 1000 * (c1[0] - c0[0]) / dt,
            "head": 1000 * (c1[1] - c0[1]) / dt,
            "workers": 1000 * (c1[2] - c0[2]) / dt,
            # a process new in the window counts whole; one gone in it is missed (an idle supervisor exiting)
            "control": 1000 * sum(v - k0.get(p, 0.0) for p, v in k1.items()) / dt,
            "rpcs": rpcs,
            "rpc_ms": rpc_ms,
        }


def diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What window ``a`` costs beyond window ``b`` (one more job)."""
    methods = set(a["rpcs"]) | set(b["rpcs"])
    rpcs = {m: a["rpcs"].get(m, 0.0) - b["rpcs"].get(m, 0.0) for m in methods}
    # The GCS work of the job's own calls: each method it added calls of (>= RPC_NOISE a second), times that
    # method's mean execution time per call in the window (every caller's). Summing the raw differences of
    # execution time instead adds the jitter of every periodic handler of the GCS on a loaded machine.
    rpc_ms = {
        m: n * a["rpc_ms"].get(m, 0.0) / a["rpcs"][m]
        for m, n in rpcs.items()
        if n >= RPC_NOISE and a["rpcs"].get(m, 0.0) > 0 and m not in WAITING_RPCS
    }
    return {
        "gcs": a["gcs"] - b["gcs"],
        "head": a["head"] - b["head"],
        "workers": a["workers"] - b["workers"],
        "control": a["control"] - b["control"],
        "rpcs": rpcs,
        "rpc_ms": rpc_ms,
        "gcs_rpc": sum(rpc_ms.values()),
    }


def median_prices(windows: list[dict[str, Any]]) -> dict[str, float]:
    """Each GCS method's median price (ms of execution a call) over ``windows``: a second opinion beside the
    window's own prices. The GCS's execution time is wall time, and on a loaded machine one window's mean price
    of an O(1) call can be 30x the rest's (a KV MultiGet at 21.8 ms a call at 16,000 hosts, 2026-11-28 run F);
    but a method whose price depends on what it carries (``GcsPublish``) is then priced at other callers' calls
    (run G): bench/NOTES.md."""
    prices: dict[str, list[float]] = {}
    for w in windows:
        for m, n in w["rpcs"].items():
            if n > 0 and w["rpc_ms"].get(m, 0.0) > 0:
                prices.setdefault(m, []).append(w["rpc_ms"][m] / n)
    return {m: statistics.median(v) for m, v in prices.items()}


def at_median_price(d: dict[str, Any], prices: dict[str, float]) -> float:
    """:func:`diff`'s GCS work of the job's own calls (ms/s), each method at its median price (see above)."""
    return sum(n * prices.get(m, 0.0) for m, n in d["rpcs"].items() if n >= RPC_NOISE and m not in WAITING_RPCS)


def scaled(d: dict[str, Any], k: float) -> dict[str, Any]:
    """A :func:`diff` per one of several jobs (every rate times ``k``)."""
    out = {key: (v * k if isinstance(v, float) else v) for key, v in d.items()}
    for key in ("rpcs", "rpc_ms"):
        out[key] = {m: v * k for m, v in d[key].items()}
    return out


RAY_JOB_BODY = """
import sys, ray
from ray.util.placement_group import placement_group
ray.init(logging_level="ERROR")
hosts, chips = {hosts}, {chips}
pg = placement_group([{{"TPU": float(chips)}}] * hosts, strategy="SPREAD",
                     bundle_label_selector=[{{"ray.io/tpu-pod-type": "{tpu_type}"}}] * hosts)
ray.get(pg.ready())
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
@ray.remote(num_cpus=0, resources={{"TPU": float(chips)}}, max_retries=0)
def hold():
    import time
    time.sleep({hold})
ray.get([
    hold.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
    ).remote()
    for i in range(hosts)
])
"""


class Bench:
    def __init__(self, fake: Any, args: argparse.Namespace, tmp: str) -> None:
        import ray
        from ray.job_submission import JobSubmissionClient

        from fray_core.tpu import get_tpu_spec

        self.fake, self.args, self.tmp = fake, args, tmp
        self.spec = get_tpu_spec(TPU_TYPE)
        self.head = Head(fake)
        session = ray._private.worker._global_node.get_session_dir_path()
        self.meter = Meter(self.head, os.path.join(session, "logs", "gcs_server.out"), args.window)
        url = ray._private.worker.get_dashboard_url() or "127.0.0.1:8265"
        self.jobs = JobSubmissionClient(url if "://" in url else f"http://{url}")
        self.phantoms = Phantoms(fake.address)
        self.body = os.path.join(tmp, "ray_job_body.py")
        with open(self.body, "w") as f:
            f.write(
                RAY_JOB_BODY.format(
                    hosts=self.spec.hosts, chips=self.spec.chips_per_host, tpu_type=TPU_TYPE, hold=HOLD_S
                )
            )

    # -- fray and ray jobs

    def fray_tpu_job(self) -> str:
        from fray_core import Entrypoint, JobRequest, ResourceConfig

        return self.fake.cluster.launch(
            JobRequest(name="cp-tpu", entrypoint=Entrypoint(callable=hold), resources=ResourceConfig.with_tpu(TPU_TYPE))
        )

    def fray_warm(self) -> None:
        """One short Fray job to its end: the client's supervisor process (kept for its next job) and the
        cluster's scheduler actor are up."""
        from fray_core import Entrypoint, JobRequest, ResourceConfig

        job = self.fake.cluster.launch(
            JobRequest(
                name="cp-warm", entrypoint=Entrypoint(callable=time.time), resources=ResourceConfig.with_tpu(TPU_TYPE)
            )
        )
        self.fake.cluster.wait(job, timeout=180)

    def fray_running(self, job_id: str, timeout: float = 180.0) -> None:
        common.wait_for(
            lambda: any(a.hosts_started_at is not None for a in self.fake.cluster.poll(job_id).attempts),
            timeout,
            f"{job_id}'s hosts",
        )

    def fray_stop(self, job_ids: list[str]) -> None:
        for j in job_ids:
            with contextlib.suppress(Exception):
                self.fake.cluster.terminate(j)

    def ray_job(self, entrypoint: str) -> str:
        return self.jobs.submit_job(entrypoint=entrypoint)

    def ray_running(self, sub_id: str, timeout: float = 180.0, slices: int = 1) -> None:
        """Until the job's placement group is ready and its host tasks run: ``slices`` real slices' TPUs are
        taken (this job's and those of the Ray jobs started before it)."""
        chips = self.spec.hosts * self.spec.chips_per_host

        def taken() -> bool:
            status = self.jobs.get_job_status(sub_id)
            if status.is_terminal():
                raise RuntimeError(f"Ray job {sub_id} ended: {status}: {self.jobs.get_job_logs(sub_id)[-2000:]}")
            return self.real_tpu_free() <= chips * (self.real_slices - slices)

        common.wait_for(taken, timeout, f"Ray job {sub_id}'s hosts", step=0.2)

    def ray_stop(self, sub_ids: list[str], timeout: float = 60.0) -> None:
        for s in sub_ids:
            with contextlib.suppress(Exception):
                self.jobs.stop_job(s)
        for s in sub_ids:
            with contextlib.suppress(Exception):
                common.wait_for(
                    lambda s=s: self.jobs.get_job_status(s).is_terminal(), timeout, f"Ray job {s} to stop", step=0.2
                )

    def real_tpu_free(self) -> float:
        """Free TPU chips on the real slice's nodes (the phantoms' chips always look free)."""
        from ray._private.state import available_resources_per_node

        real = {n.node_id for nodes in self.fake._nodes.values() for n in nodes}
        return sum(r.get("TPU", 0.0) for node_id, r in available_resources_per_node().items() if node_id in real)

    @property
    def real_slices(self) -> int:
        return 1 + self.args.running

    def idle(self) -> None:
        """Until the real slices are free and the machine is quiet (not timed)."""
        want = self.spec.hosts * self.spec.chips_per_host * self.real_slices
        common.wait_for(lambda: self.real_tpu_free() >= want, 120, "the real slice to be free", step=0.2)
        common.wait_quiet()

    # -- the per-job CPU cases

    def per_job(self, n: int) -> dict[str, Any]:
        grow = self.phantoms.grow_to(n)
        import ray

        first_window = len(self.meter.history)

        t0 = time.monotonic()
        nodes = len(ray.nodes())
        nodes_s = time.monotonic() - t0
        # Fray's shared processes up before the baseline (a supervisor process serves up to 1,024 jobs, the
        # scheduler every job of the cluster): the cases then show what one more job costs. Ray job
        # submission has no shared process: its JobSupervisor actor per job is in its figures, as it is in
        # its cost.
        self.fray_warm()
        self.idle()
        base = self.meter.measure()
        out: dict[str, Any] = {"n": n, "register_s": grow, "nodes": nodes, "ray_nodes_s": nodes_s, "base": base}
        running = self.fray_tpu_job()
        self.fray_running(running)
        time.sleep(2.0)
        w_run = self.meter.measure()
        # More running jobs (on slices of their own): the first one's figure carries what its supervisor
        # process and the cluster share (one CheckAlive a second for every lease's nodes, one read of the
        # draining nodes); what each further one adds is the per-job cost.
        more_running = [self.fray_tpu_job() for _ in range(self.args.running)]
        for job in more_running:
            self.fray_running(job)
        w_run_all = self._further(out, "fray_running_more", more_running, w_run, settle=2.0)
        queued = self.fray_tpu_job()
        time.sleep(3.0)  # its supervisor is up and asking the scheduler
        if self.fake.cluster.poll(queued).status.value != "PENDING":
            raise AssertionError(f"the queued Fray job is {self.fake.cluster.poll(queued).status}, not pending")
        w_queue = self.meter.measure()
        # More queued jobs: the first one's figure carries the cluster's one view (the scheduler reads the
        # cluster once a second while anyone waits); what each further one adds is the per-job cost.
        more = [self.fray_tpu_job() for _ in range(max(0, self.args.queued - 1))]
        self._further(out, "fray_queued_more", more, w_queue, settle=3.0)
        self.fray_stop([queued, running, *more_running, *more])
        out["fray_running"], out["fray_queued"] = diff(w_run, base), diff(w_queue, w_run_all)
        self.idle()
        base2 = self.meter.measure()
        entry = f"{sys.executable} {self.body}"
        r_running = self.ray_job(entry)
        self.ray_running(r_running)
        time.sleep(2.0)
        r_run = self.meter.measure()
        r_more_running = [self.ray_job(entry) for _ in range(self.args.running)]
        for i, sub in enumerate(r_more_running):
            self.ray_running(sub, slices=2 + i)
        r_run_all = self._further(out, "ray_running_more", r_more_running, r_run, settle=2.0)
        r_queued = self.ray_job(entry)
        time.sleep(5.0)  # its driver is up and waiting for its placement group
        r_queue = self.meter.measure()
        self.ray_stop([r_queued, r_running, *r_more_running])
        out["ray_running"], out["ray_queued"] = diff(r_run, base2), diff(r_queue, r_run_all)
        out["base2"] = base2
        prices = median_prices(self.meter.history[first_window:])
        for case in [k for k, v in out.items() if isinstance(v, dict) and "gcs_rpc" in v]:  # the cases' diffs
            out[case]["gcs_rpc_typ"] = at_median_price(out[case], prices)
        return out

    def _further(
        self, out: dict[str, Any], case: str, jobs: list[str], before: dict[str, Any], settle: float
    ) -> dict[str, Any]:
        """What each of ``jobs`` (started since the ``before`` window) adds, into ``out[case]``, after ``settle``
        seconds; returns the window the next case starts from (``before`` when there are no such jobs)."""
        if not jobs:
            return before
        time.sleep(settle)
        after = self.meter.measure()
        out[case] = scaled(diff(after, before), 1.0 / len(jobs))
        return after

    # -- head memory

    def memory(self, count: int) -> dict[str, Any]:
        from fray_core import Entrypoint, JobRequest, ResourceConfig

        out: dict[str, Any] = {"count": count}
        hold_s = 600.0
        for who in ("fray", "ray"):
            self.idle()
            before = self.head.memory()
            ids: list[str] = []
            if who == "fray":
                req = JobRequest(
                    name="cp-mem",
                    entrypoint=Entrypoint(callable=nap, function_args={"seconds": hold_s}),
                    resources=ResourceConfig.with_cpu(cpu=0, ram=SMALL_RAM),
                )
                ids = [self.fake.cluster.launch(req) for _ in range(count)]
                common.wait_for(
                    lambda ids=ids: all(self.fake.cluster.poll(j).status.value == "RUNNING" for j in ids),
                    180,
                    f"{count} Fray jobs running",
                    step=0.5,
                )
            else:
                ids = [self.ray_job(f"{sys.executable} -c 'import time; time.sleep({hold_s})'") for _ in range(count)]
                common.wait_for(
                    lambda ids=ids: all(self.jobs.get_job_status(s).value == "RUNNING" for s in ids),
                    180,
                    f"{count} Ray jobs running",
                    step=0.5,
                )
            time.sleep(3.0)  # start-up allocations settle
            after = self.head.memory()
            new = {p: v for p, v in after.items() if p not in before}
            grown_pss = sum(after[p][0] - before[p][0] for p in after if p in before)
            grown_priv = sum(after[p][1] - before[p][1] for p in after if p in before)
            sup = [v for v in new.values() if "JobSupervisor" in v[2]]
            sup_threads = [_threads(p) for p, v in new.items() if "JobSupervisor" in v[2]]
            rest = [v for v in new.values() if "JobSupervisor" not in v[2]]
            out[who] = {
                "pss": (sum(v[0] for v in new.values()) + grown_pss) / count,
                "private": (sum(v[1] for v in new.values()) + grown_priv) / count,
                "supervisor_pss": sum(v[0] for v in sup) / count,
                # the control plane: the supervisors, and what the head's own processes grew by
                "control_pss": (sum(v[0] for v in sup) + grown_pss) / count,
                "supervisor_processes": len(sup),
                "supervisor_private": sum(v[1] for v in sup) / count,
                "rest_pss": sum(v[0] for v in rest) / count,
                "grown_pss": grown_pss / count,
                "processes": len(new) / count,
                "supervisor_threads": statistics.median(sup_threads) if sup_threads else 0,
            }
            if who == "fray":
                self.fray_stop(ids)
            else:
                self.ray_stop(ids)
        return out

    # -- throughput

    def throughput(self, count: int) -> dict[str, Any]:
        import ray

        from fray_core import Entrypoint, JobRequest, ResourceConfig

        out: dict[str, Any] = {"count": count}
        self.idle()
        f = ray.remote(num_cpus=1, max_retries=0)(work)
        t0 = time.monotonic()
        ray.get([f.remote() for _ in range(count)], timeout=600)
        out["raw"] = time.monotonic() - t0
        # Again at once: the workers the first burst started are still there (warm). Both figures are kept: a
        # cold burst pays Ray's worker starts (~1 CPU-s each, one per CPU slot), a warm one does not.
        t0 = time.monotonic()
        ray.get([f.remote() for _ in range(count)], timeout=600)
        out["raw_warm"] = time.monotonic() - t0

        # The floor: raw Ray tasks that each keep a record as a job must (the client puts it before the task,
        # the task puts the final one, the client reads it back), cold (no worker left: idle()) and warm. No job
        # system on Ray that records its jobs can be quicker; Fray's supervision and code shipping come on top.
        self.idle()
        # cold: the raw bursts' workers gone (Ray stops an idle worker within seconds on the emulated cluster);
        # how many were still there is printed with the figure
        end = time.monotonic() + 60
        while _idle_workers() and time.monotonic() < end:
            time.sleep(0.5)
        out["floor_idle_workers"] = len(_idle_workers())
        out["floor"] = self._floor(count, "cold")
        out["floor_warm"] = self._floor(count, "warm")

        req = JobRequest(
            name="cp-tp", entrypoint=Entrypoint(callable=work), resources=ResourceConfig.with_cpu(cpu=1, ram=SMALL_RAM)
        )
        # Raw Ray tasks given the job's code the way Fray ships it (Ray's working_dir, the same package): what
        # shipping code costs Ray itself (each worker then starts through setup_worker.py). Its own env var,
        # so that Fray's host tasks never get these workers.
        from fray_ray.code import code_runtime_env, upload_code

        shipped = upload_code(code_runtime_env(req))
        self.idle()
        g = f.options(runtime_env={**shipped, "env_vars": {"FRAY_BENCH_RAW": "1"}})
        t0 = time.monotonic()
        ray.get([g.remote() for _ in range(count)], timeout=600)
        out["raw_code"] = time.monotonic() - t0

        self.idle()
        lat: list[float] = []
        out["fray"] = self._fray_burst(req, count, lat)
        out["launch_ms"] = 1000 * statistics.median(lat)
        out["fray_warm"] = self._fray_burst(req, count, [])  # at once: its host workers are still there

        self.idle()
        t0 = time.monotonic()
        subs = [self.ray_job(f"{sys.executable} -c 'print(sum(range(10**5)))'") for _ in range(count)]
        out["submit_ms"] = 1000 * (time.monotonic() - t0) / count

        def all_done() -> bool:
            states = [self.jobs.get_job_status(s) for s in subs]
            bad = [s for s in states if s.is_terminal() and s.value != "SUCCEEDED"]
            if bad:
                raise AssertionError(f"Ray job submission: {bad[0]}")
            return all(s.value == "SUCCEEDED" for s in states)

        common.wait_for(all_done, 900, f"{count} Ray jobs", step=0.5)
        out["ray_jobs"] = time.monotonic() - t0
        return out

    def _floor(self, count: int, tag: str) -> float:
        """Seconds for ``count`` :func:`recorded_work` tasks, each with its record put before and read after."""
        import ray
        from ray.experimental import internal_kv

        f = ray.remote(num_cpus=1, max_retries=0)(recorded_work)
        keys = [f"{tag}-{i}".encode() for i in range(count)]
        t0 = time.monotonic()
        refs = []
        for k in keys:
            internal_kv._internal_kv_put(k, b'{"status": "PENDING"}', overwrite=True, namespace=FLOOR_NAMESPACE)
            refs.append(f.remote(k))
        ray.get(refs, timeout=600)
        for k in keys:
            if b"SUCCEEDED" not in (internal_kv._internal_kv_get(k, namespace=FLOOR_NAMESPACE) or b""):
                raise AssertionError(f"floor: no final record under {k!r}")
        took = time.monotonic() - t0
        for k in keys:
            internal_kv._internal_kv_del(k, namespace=FLOOR_NAMESPACE)
        return took

    def _fray_burst(self, req: Any, count: int, lat: list[float]) -> float:
        """Seconds from the first of ``count`` launches of ``req`` back to back until all SUCCEEDED; each
        launch call's seconds into ``lat``."""
        ids = []
        t0 = time.monotonic()
        for _ in range(count):
            t = time.perf_counter()
            ids.append(self.fake.cluster.launch(req))
            lat.append(time.perf_counter() - t)
        for j in ids:
            info = self.fake.cluster.wait(j, timeout=max(1.0, 900 - (time.monotonic() - t0)))
            if info.status.value != "SUCCEEDED":
                raise AssertionError(f"Fray job {j}: {info.status}")
        return time.monotonic() - t0


# ------------------------------------------------------------------------------------------- report


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(cpu: list[dict[str, Any]], mem: dict[str, Any] | None, tp: dict[str, Any] | None) -> None:
    print("\nPer-job control-plane cost (ms of CPU per second, beyond the window before; rpc/s of the GCS by method)")
    print(
        "GCS RPC ms/s: the calls a second the job added, by method, times the GCS's mean execution time per call"
        " (its event stats; the goals are judged on it); at median price: each method at its median price a call"
        " over the size's windows, a second opinion (execution time is wall time: on a loaded machine one window's"
        " price of an O(1) call can be 30x the rest's; but a method whose price depends on what it carries, such as"
        " GcsPublish, is then priced at other callers' calls)"
    )
    print(
        f"{'hosts':>6} {'case':<16} {'GCS ms/s':>9} {'GCS RPC ms/s':>13} {'at median price':>16} {'head ms/s':>10}"
        f" {'of which workers':>17} {'control ms/s':>13}  top GCS RPCs/s (ms/s)"
    )
    for r in cpu:
        for case in (
            "fray_queued",
            "fray_queued_more",
            "fray_running",
            "fray_running_more",
            "ray_queued",
            "ray_running",
            "ray_running_more",
        ):
            if case not in r:
                continue
            d = r[case]
            top = sorted(((v, k) for k, v in d["rpcs"].items() if v >= 0.05), reverse=True)[:5]
            rpcs = ", ".join(f"{k} {v:.2f} ({d['rpc_ms'].get(k, 0.0):.2f})" for v, k in top)
            print(
                f"{r['n']:>6} {case:<16} {d['gcs']:>9.1f} {d['gcs_rpc']:>13.2f} {d['gcs_rpc_typ']:>16.2f} "
                f"{d['head']:>10.1f} {d['workers']:>17.1f} {d['control']:>13.2f}  {rpcs}"
            )
    print(f"\n{'hosts':>6} {'registered in':>14} {'ray.nodes() s':>14} {'idle GCS ms/s':>14} {'idle head ms/s':>15}")
    for r in cpu:
        print(
            f"{r['n']:>6} {r['register_s']:>13.1f}s {r['ray_nodes_s']:>14.2f} {r['base']['gcs']:>14.1f} "
            f"{r['base']['head']:>15.1f}"
        )
    print("\nratio Fray / Ray job submission, per job (GCS; head):")
    for r in cpu:
        for kind in ("queued", "running"):
            f, g = r[f"fray_{kind}"], r[f"ray_{kind}"]
            print(
                f"  {r['n']:>6} hosts, {kind:<8} GCS {f['gcs']:.1f} / {g['gcs']:.1f} = "
                f"{f['gcs'] / max(0.1, g['gcs']):.1f}x; head {f['head']:.1f} / {g['head']:.1f} = "
                f"{f['head'] / max(0.1, g['head']):.1f}x"
            )
    if mem:
        print(f"\nHead memory per concurrent job ({mem['count']} concurrent each; MB)")
        print(
            f"{'':<22} {'PSS':>8} {'private':>8} {'supervisor PSS':>15} {'supervisor private':>19} "
            f"{'rest PSS':>9} {'processes':>10} {'supervisor threads':>19}"
        )
        for who, label in (("fray", "Fray"), ("ray", "Ray job submission")):
            m = mem[who]
            print(
                f"{label:<22} {m['pss']:>8.1f} {m['private']:>8.1f} {m['supervisor_pss']:>15.1f} "
                f"{m['supervisor_private']:>19.1f} {m['rest_pss']:>9.1f} {m['processes']:>10.1f} "
                f"{m.get('supervisor_threads', 0):>19.0f}"
            )
        print(f"ratio Fray / Ray job submission (PSS per job): {mem['fray']['pss'] / max(0.1, mem['ray']['pss']):.2f}")
        print(
            "control plane per job (supervisor processes + what the head's processes grew by; not the job's "
            "own process, which Fray runs on the job's nodes and Ray job submission on the head): Fray "
            f"{mem['fray']['control_pss']:.1f} MB in {mem['fray'].get('supervisor_processes', '?')} supervisor "
            f"process(es), Ray job submission {mem['ray']['control_pss']:.1f} MB in "
            f"{mem['ray'].get('supervisor_processes', '?')}"
        )
    if tp:
        print(f"\nThroughput: {tp['count']} small CPU jobs launched back to back, until all SUCCEEDED")
        print(
            f"  raw Ray tasks {tp['raw']:.1f} s ({tp['raw_code']:.1f} s given the job's code as Fray ships it, Ray's "
            f"working_dir); Fray {tp['fray']:.1f} s (median launch "
            f"{tp['launch_ms']:.1f} ms); Ray job submission {tp['ray_jobs']:.1f} s (submit "
            f"{tp['submit_ms']:.1f} ms each)"
        )
        print(
            f"  ratio Fray / raw Ray {tp['fray'] / tp['raw']:.2f} (/ raw Ray with the code "
            f"{tp['fray'] / tp['raw_code']:.2f}); Fray / Ray job submission "
            f"{tp['fray'] / tp['ray_jobs']:.2f}"
        )
        print(
            f"  again at once (the workers of the burst before still there): raw Ray {tp['raw_warm']:.2f} s, "
            f"Fray {tp['fray_warm']:.2f} s, ratio {tp['fray_warm'] / tp['raw_warm']:.2f}"
        )
        print(
            f"  the floor, raw Ray tasks that each keep a record as a job must (put, final put, read back): "
            f"{tp['floor']:.2f} s ({tp['floor'] / tp['raw']:.2f}x raw Ray; {tp['floor_idle_workers']} idle worker(s) "
            f"left before it), again at once {tp['floor_warm']:.2f} s ({tp['floor_warm'] / tp['raw_warm']:.2f}x)"
        )
    print("\nGoals (issue 29):")
    if cpu:
        big, small = cpu[-1], cpu[0]
        for kind in ("queued", "running"):
            d = big[f"fray_{kind}"]
            print(
                f"  per {kind} job at {big['n']} hosts: GCS (its RPCs) {d['gcs_rpc']:.2f} ms/s <= {GOAL_GCS_MS}: "
                f"{_met(d['gcs_rpc'] <= GOAL_GCS_MS)} (at median prices {d['gcs_rpc_typ']:.2f}; process CPU "
                f"delta {d['gcs']:.1f}); head (control plane) "
                f"{d['control']:.2f} ms/s <= {GOAL_HEAD_MS}: {_met(d['control'] <= GOAL_HEAD_MS)} (whole head "
                f"{d['head']:.1f})"
            )
        for kind, carries in (
            ("queued", "the cluster's one view"),
            ("running", "its supervisor process's shared liveness and drain reads"),
        ):
            if f"fray_{kind}_more" not in big:
                continue
            d = big[f"fray_{kind}_more"]
            print(
                f"  per further {kind} job at {big['n']} hosts (the first carries {carries}, above): "
                f"GCS (its RPCs) {d['gcs_rpc']:.2f} ms/s <= {GOAL_GCS_MS}: {_met(d['gcs_rpc'] <= GOAL_GCS_MS)} "
                f"(at median prices {d['gcs_rpc_typ']:.2f}); "
                f"head (control plane) {d['control']:.2f} ms/s <= {GOAL_HEAD_MS}: "
                f"{_met(d['control'] <= GOAL_HEAD_MS)} (whole head {d['head']:.1f})"
            )
        if len(cpu) > 1:
            # "Independent of size" as issue 29 means it: a job's cost must not grow with the cluster. The
            # largest size's figure may be at most the smallest's plus the noise; a lower one is the windows'
            # noise too (both are printed), not a cost that grows.
            for case in ("queued", "queued_more", "running", "running_more"):
                if f"fray_{case}" not in small or f"fray_{case}" not in big:
                    continue
                for what in ("gcs_rpc", "control"):
                    a, b = small[f"fray_{case}"][what], big[f"fray_{case}"][what]
                    floor = NOISE_MS if what == "gcs_rpc" else NOISE_HEAD_MS
                    grows = b - a > max(floor, NOISE_SHARE * max(abs(a), abs(b)))
                    label = "GCS (its RPCs)" if what == "gcs_rpc" else "head (control plane)"
                    print(
                        f"  per {case.replace('_more', ' (further)')} job {label} does not grow with the cluster: "
                        f"{small['n']} hosts {a:.1f}, {big['n']} hosts {b:.1f} ms/s: {_met(not grows)}"
                    )
        else:
            print("  per-job cost independent of size: not measured (one size; pass --hosts A B)")
    if mem:
        share = mem["fray"]["control_pss"] / max(0.1, mem["ray"]["control_pss"])
        print(
            f"  head memory per job (control plane): Fray {mem['fray']['control_pss']:.1f} MB / Ray job submission "
            f"{mem['ray']['control_pss']:.1f} MB = {share:.2f} <= {GOAL_MEMORY_SHARE}: "
            f"{_met(share <= GOAL_MEMORY_SHARE)} (every process: {mem['fray']['pss']:.0f} / {mem['ray']['pss']:.0f} MB)"
        )
    if tp:
        ratio = tp["fray"] / tp["raw"]
        print(
            f"  throughput: Fray / raw Ray {ratio:.2f} <= {GOAL_THROUGHPUT}: "
            f"{_met(ratio <= GOAL_THROUGHPUT)}; faster than Ray job submission ({tp['fray']:.1f} s vs "
            f"{tp['ray_jobs']:.1f} s): {_met(tp['fray'] < tp['ray_jobs'])}; warm (again at once) "
            f"{tp['fray_warm'] / tp['raw_warm']:.2f}: {_met(tp['fray_warm'] / tp['raw_warm'] <= GOAL_THROUGHPUT)}"
        )
        print(
            f"  launch median {tp['launch_ms']:.1f} ms <= {GOAL_LAUNCH_MS}: {_met(tp['launch_ms'] <= GOAL_LAUNCH_MS)}"
        )


@contextlib.contextmanager
def emulated_cluster(slices: int = 1) -> Iterator[Any]:
    from fray_ray.testing import fake_tpu_cluster

    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    try:
        with fake_tpu_cluster({TPU_TYPE: slices}) as fake:
            yield fake
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI): 64 hosts, 1 s windows, 1 + 2 jobs")
    ap.add_argument(
        "--hosts", type=int, nargs="+", default=[1008], help="phantom host counts, ascending (default 1008)"
    )
    ap.add_argument("--window", type=float, default=10.0, help="seconds of each CPU window")
    ap.add_argument("--concurrent", type=int, default=50, help="concurrent jobs of each kind for head memory (0: skip)")
    ap.add_argument(
        "--queued",
        type=int,
        default=4,
        help="queued Fray jobs at once in the per-job window (the first carries the view)",
    )
    ap.add_argument(
        "--running",
        type=int,
        default=2,
        help="further running jobs of each kind in the per-job window, each on a real slice of its own (0: skip)",
    )
    ap.add_argument("--jobs", type=int, default=200, help="jobs of each kind for throughput (0: skip)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.hosts, args.window, args.concurrent, args.jobs, args.queued, args.running = [64], 1.0, 1, 2, 2, 0
        common.smoke()
    if sorted(args.hosts) != args.hosts or any(n % PHANTOM_HOSTS_PER_SLICE or n < 0 for n in args.hosts):
        ap.error(
            f"--hosts: ascending multiples of {PHANTOM_HOSTS_PER_SLICE} (whole {PHANTOM_TYPE} slices), got {args.hosts}"
        )
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # job bodies travel by value
    load0 = os.getloadavg()
    t_start = time.monotonic()
    cpu: list[dict[str, Any]] = []
    mem = tp = None
    with tempfile.TemporaryDirectory(prefix="fray-cp-") as tmp, emulated_cluster(1 + args.running) as fake:
        bench = Bench(fake, args, tmp)
        try:
            # Memory and throughput first, before any phantom exists: they are about jobs, not the cluster's size.
            if args.concurrent:
                mem = bench.memory(args.concurrent)
            if args.jobs:
                tp = bench.throughput(args.jobs)
            for n in args.hosts:
                cpu.append(bench.per_job(n))
                print(f"[{n} hosts done at {time.monotonic() - t_start:.0f} s]", file=sys.stderr, flush=True)
        finally:
            bench.phantoms.close()
    print(
        "Ray control plane per Fray job vs Ray job submission (emulated cluster: head + "
        f"{1 + args.running} x {TPU_TYPE}, plus phantom {PHANTOM_TYPE} hosts)"
    )
    report(cpu, mem, tp)
    load1 = os.getloadavg()
    print(
        f"\n{time.monotonic() - t_start:.0f} s; load average (1/5/15 min) "
        f"{'/'.join(f'{x:.1f}' for x in load0)} before, {'/'.join(f'{x:.1f}' for x in load1)} after"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

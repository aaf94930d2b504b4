"""Fray against its peers on ONE emulated Ray cluster: hand-written Ray ("raw"), fray, eformer.

    python bench/peers_ray.py              # 20 interleaved reps of each launch case, 3 of each recovery case
    python bench/peers_ray.py --smoke      # 1 rep of each (CI; without eformer its rows say "not installed")
    pip install -e '.[bench]'              # eformer==0.0.101 (pulls jax, ~1 GB)

The cluster: ``fray_ray.testing.fake_tpu_cluster({"v4-16": 2})``, 2 slices x 2 hosts, each host its own
raylet on this machine, Ray's idle worker pool off (with it, the head started a worker for raw's launches
only, which slowed raw's hosts here and not on a real cluster: bench/NOTES.md). The host function is
trivial (it writes a start marker and returns). Figures use THE gang-launch measure of
``bench/_ray_common.py``: "all hosts running" = launch call -> the last host's function started; "end to
end" = launch call -> every host's result back in the caller.

Who does what:
- raw: a placement group per slice (a ``{"TPU": 4}`` bundle per host, label selector on the slice name,
  names known in advance) and one ``max_calls=1``, ``num_cpus=0`` task per host, from the driver.
- fray: ``RayCluster.launch`` + ``wait`` (detached supervisor, two-phase slice reservation, host tasks).
- eformer 0.0.101: ``RayExecutor.execute_resumable`` (1 slice: a task on the slice head that starts one
  task per host in a forked process) with ``TpuAcceleratorConfig(tpu_version="v4-16", chips_per_host=4,
  worker_count=2)``; ``autoscale_execute_resumable`` (2 slices) and ``TpuRemoteManager`` are tried once in a
  subprocess with a deadline and killed: the table says what they did instead of a figure.

Recovery: a job whose attempt-0 hosts hold (sleep); once all run, the slice is removed without grace
(``fake.preempt(name, restore_after=0)``: a fresh slice joins a few seconds later). Timed from the removal to
the last host of the next attempt running. 1 slice: the other slice is idle, so the next attempt needs no
new slice (detection + restart only). 2 slices: the next attempt waits for the restored slice to join (see
bench/ray_recovery.py for that case in detail). The raw recovery is written by hand: wait for the first
``ray.get`` error, cancel, remove the groups, start again on live slices.

Fray's gang-launch breakdown (medians, seconds after ``launch``): the job record (supervisor began attempt 0,
slices held, every host reported in), Ray's task events (host task created, a worker got it, RUNNING) and
the markers (host process created, function started). Same columns for raw where they exist.

Reps are interleaved (a fresh order of the cases every rep, drawn from ``--seed``, printed: a fixed rotation
always ran raw's 2-slice case right after eformer's, whose idle worker it then reused) after one untimed
warm-up of each; each run
starts on an idle cluster (waiting for that is not timed). The machine has 2 cores shared with others:
read the ratios, and the spread, not the seconds. Load average before/after is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import cloudpickle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ray_common as common  # noqa: E402

cloudpickle.register_pickle_by_value(common)  # host bodies travel by value: workers need not import bench/

GOAL = 1.10
# 20 reps: a median of 12 moved by +-0.07 between runs on a quiet machine (2 cores: which host worker gets a core
# first decides the last host's start), as much as fray's whole margin; the spread is printed either way.
REPS = 20
HOLD_S = 600.0
PROBE_TIMEOUT = 90.0  # seconds an eformer path that cannot run gets before it is killed
EFORMER = "eformer"


def hold(marker_dir: str, tag: str) -> str:
    """Host body of the recovery runs: mark the start; attempt 0 holds (sleeps), a later one returns."""
    import os as _os
    import time as _time

    common.write_marker(marker_dir, tag)
    attempt = _os.environ.get("FRAY_ATTEMPT")
    if attempt is None:
        try:
            with open(_os.path.join(marker_dir, f"{tag}.attempt")) as f:
                attempt = f.read().strip()
        except OSError:
            attempt = "0"
    if attempt == "0":
        _time.sleep(HOLD_S)
    return "ok"


def _pid() -> int:
    return os.getpid()


def eformer_version() -> str | None:
    try:
        import importlib.metadata

        import eformer  # noqa: F401

        return importlib.metadata.version("eformer")
    except Exception:
        return None


# ------------------------------------------------------------------------------------------- peers


class Peers:
    """The three ways to run a gang on the one cluster."""

    def __init__(self, fake: Any, marker_dir: str) -> None:
        import ray

        from fray_core.tpu import get_tpu_spec

        self.fake, self.dir = fake, marker_dir
        self.spec = get_tpu_spec(common.TPU_TYPE)
        self.raw_mark = ray.remote(max_calls=1)(common.mark)
        self.raw_hold = ray.remote(max_calls=1)(hold)
        self.raw_drain = ray.remote(max_calls=1, num_cpus=0)(_pid)
        self.n = 0
        self.fray_jobs: dict[str, str] = {}  # tag -> job id

    def tag(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def drain(self) -> None:
        """Untimed, after an eformer case: its head task (default ``max_calls``) leaves an idle worker on a
        TPU host, which the next task landing there reuses: a warm start that flattered whichever peer came
        next (seen in 5 of 35 launches before this). A ``max_calls=1`` task pinned to every TPU node takes
        any such worker and exits with it."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and (n.get("Resources") or {}).get("TPU")]
        ray.get(
            [
                self.raw_drain.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote()
                for nid in nodes
            ],
            timeout=120,
        )

    def idle(self) -> None:
        common.wait_idle(2, self.spec.hosts, self.spec.chips_per_host, self.spec.head_resource)

    # ------------------------------------------------------------------------- launch, trivial fn

    def raw(self, slices: int, tag: str) -> dict[str, Any]:
        import ray
        from ray.util.placement_group import remove_placement_group

        names = sorted(self.fake.slices()[self.spec.name])[:slices]
        t0 = time.time()
        pgs = common.baseline_placement_groups(names, self.spec.hosts, self.spec.chips_per_host)
        refs = [
            self.raw_mark.options(
                name=f"raw:{tag}:{i}", **common.host_task_options(pg, h, self.spec.chips_per_host)
            ).remote(self.dir, tag)
            for i, (pg, h) in enumerate((pg, h) for pg in pgs for h in range(self.spec.hosts))
        ]
        ray.get(refs, timeout=300)
        for pg in pgs:
            remove_placement_group(pg)
        return {"t0": t0, "done": time.time()}

    def fray(self, slices: int, tag: str) -> dict[str, Any]:
        from fray_core import Entrypoint, JobRequest, ResourceConfig

        request = JobRequest(
            name=f"peers-{tag}",
            entrypoint=Entrypoint.from_callable(common.mark, args=(self.dir, tag)),
            resources=ResourceConfig.with_tpu(self.spec.name, slice_count=slices),
            max_retries_preemption=0,
        )
        t0 = time.time()
        job_id = self.fake.cluster.launch(request)
        info = self.fake.cluster.wait(job_id, timeout=300, raise_on_failure=True)
        done = time.time()
        self.fray_jobs[tag] = job_id
        a = info.attempts[0]
        return {
            "t0": t0,
            "done": done,
            "attempt": a.started_at,
            "held": a.acquired_at,
            "reported": a.hosts_started_at,
            "job": job_id,
        }

    def eformer(self, slices: int, tag: str) -> dict[str, Any]:
        import ray
        from eformer.executor.ray import RayExecutor, TpuAcceleratorConfig

        assert slices == 1
        fn = ray.remote(max_calls=1, num_cpus=0)(common.mark)
        config = TpuAcceleratorConfig(
            tpu_version=self.spec.name,
            pod_count=1,
            chips_per_host=self.spec.chips_per_host,
            worker_count=self.spec.hosts,
            runtime_name=tag,
        )
        t0 = time.time()
        RayExecutor.execute_resumable(
            fn, config, max_retries_preemption=0 + 1, max_retries_failure=1, marker_dir=self.dir, tag=tag
        )
        return {"t0": t0, "done": time.time()}

    # ------------------------------------------------------------------------------------ recovery

    def _remove_when_running(self, tag: str, slices: int, victim_of: Any) -> tuple[float, str]:
        """Wait for every attempt-0 host, then remove one of their slices; returns (removal time, victim)."""
        hosts = slices * self.spec.hosts
        first = wait_for(
            lambda: (got := [m for m in common.markers(self.dir, tag) if m[2] == "0"]) and len(got) >= hosts and got,
            180,
            f"{tag}: attempt 0 on every host",
        )
        victim = victim_of(sorted({m[0] for m in first}))
        with open(os.path.join(self.dir, f"{tag}.attempt"), "w") as f:
            f.write("1")  # hosts started from now on are the next attempt's
        t0 = time.time()
        self.fake.preempt(victim, restore_after=0.0)
        return t0, victim

    def _next_attempt(self, tag: str, slices: int, victim: str, t0: float) -> float:
        hosts = slices * self.spec.hosts
        got = wait_for(
            lambda: (ms := [m for m in common.markers(self.dir, tag) if m[2] != "0"]) and len(ms) >= hosts and ms,
            300,
            f"{tag}: the next attempt on every host",
        )
        assert victim not in {m[0] for m in got}, (victim, got)
        return max(m[3] for m in got) - t0

    def raw_recovery(self, slices: int, tag: str) -> float:
        import ray
        from ray.util.placement_group import remove_placement_group

        names = sorted(self.fake.slices()[self.spec.name])
        use = names[:slices]

        def opts(pgs):
            return [
                common.host_task_options(pg, h, self.spec.chips_per_host) for pg in pgs for h in range(self.spec.hosts)
            ]

        pgs = common.baseline_placement_groups(use, self.spec.hosts, self.spec.chips_per_host)
        refs = [self.raw_hold.options(**o).remote(self.dir, tag) for o in opts(pgs)]
        t0, victim = self._remove_when_running(tag, slices, lambda s: s[0])
        try:  # hand-written detection: the first error of any host
            ray.get(refs, timeout=300)
        except Exception:
            pass
        for r in refs:
            ray.cancel(r, force=True)
        for pg in pgs:
            remove_placement_group(pg)
        # start again on live slices: the idle one (1 slice), or the survivor + the restored one (2 slices)
        live = wait_for(
            lambda: (
                (s := [n for n in self.fake.slices().get(self.spec.name, []) if n != victim]) and len(s) >= slices and s
            ),
            300,
            "a live slice",
        )
        keep = [n for n in use if n != victim] + [n for n in sorted(live) if n not in use]
        pgs = common.baseline_placement_groups(keep[:slices], self.spec.hosts, self.spec.chips_per_host)
        refs = [self.raw_hold.options(**o).remote(self.dir, tag) for o in opts(pgs)]
        took = self._next_attempt(tag, slices, victim, t0)
        ray.get(refs, timeout=300)
        for pg in pgs:
            remove_placement_group(pg)
        return took

    def fray_recovery(self, slices: int, tag: str) -> float:
        from fray_core import Entrypoint, JobRequest, ResourceConfig

        request = JobRequest(
            name=f"peers-rec-{tag}",
            entrypoint=Entrypoint.from_callable(hold, args=(self.dir, tag)),
            resources=ResourceConfig.with_tpu(self.spec.name, slice_count=slices),
            max_retries_preemption=5,
        )
        job_id = self.fake.cluster.launch(request)
        t0, victim = self._remove_when_running(tag, slices, lambda s: s[0])
        took = self._next_attempt(tag, slices, victim, t0)
        self.fake.cluster.wait(job_id, timeout=300, raise_on_failure=True)
        return took

    def eformer_recovery(self, slices: int, tag: str) -> float:
        import ray
        from eformer.executor.ray import RayExecutor, TpuAcceleratorConfig

        assert slices == 1
        fn = ray.remote(max_calls=1, num_cpus=0)(hold)
        config = TpuAcceleratorConfig(
            tpu_version=self.spec.name,
            pod_count=1,
            chips_per_host=self.spec.chips_per_host,
            worker_count=self.spec.hosts,
            runtime_name=tag,
        )
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                out["result"] = RayExecutor.execute_resumable(
                    fn, config, max_retries_preemption=5, max_retries_failure=5, marker_dir=self.dir, tag=tag
                )
            except BaseException as e:  # reported below
                out["error"] = e

        th = threading.Thread(target=run, daemon=True)
        th.start()
        t0, victim = self._remove_when_running(tag, slices, lambda s: s[0])
        took = self._next_attempt(tag, slices, victim, t0)
        th.join(300)
        if "error" in out:
            raise out["error"]
        return took

    def settle(self) -> None:
        """Untimed: restored slices joined, removed nodes marked dead by Ray, every chip free."""
        self.fake.wait_settled(timeout=120)
        self.idle()


wait_for = common.wait_for


# ------------------------------------------------------------------------- eformer paths that hang

_EFORMER_PROBE = r"""
import logging, os, sys, time
sys.path.insert(0, os.environ["BENCH_DIR"])
import cloudpickle, ray
import _ray_common as common
cloudpickle.register_pickle_by_value(common)
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="INFO")
logging.getLogger("ray").setLevel(logging.INFO)
from eformer.executor.ray import RayExecutor, TpuAcceleratorConfig
from eformer.executor.ray.executor import TpuRemoteManager
what, d = sys.argv[1], sys.argv[2]
fn = ray.remote(max_calls=1, num_cpus=0)(common.mark)
print("PROBE start", what, flush=True)
if what == "autoscale_execute_resumable":
    config = TpuAcceleratorConfig(
        tpu_version="v4-16", pod_count=2, chips_per_host=4, worker_count=2, runtime_name="probe"
    )
    out = RayExecutor.autoscale_execute_resumable(
        fn, config, max_retries_preemption=1000, max_retries_failure=1000, marker_dir=d, tag="probe"
    )
else:
    m = TpuRemoteManager("v4-16", pod_count=1)
    out = m.run_function(common.mark, d, "probe")
    m.close()
print("PROBE result", out, flush=True)
"""


def probe_eformer(address: str, what: str, marker_dir: str, timeout: float) -> str:
    """Run one eformer path in a subprocess for at most ``timeout`` s; ``"ran"`` or why it did not."""
    env = dict(
        os.environ,
        RAY_ADDRESS=address,
        BENCH_DIR=os.path.dirname(os.path.abspath(__file__)),
        EFORMER_SCALE_RETRY_SLEEP_S="1",
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", _EFORMER_PROBE, what, marker_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    took = time.monotonic() - t0
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if any(ln.startswith("PROBE result") for ln in lines):
        return f"ran ({took:.1f} s, one try)"
    return "cannot run: " + _why(lines, timed_out, took, proc.returncode)


def _why(lines: list[str], timed_out: bool, took: float, rc: int | None) -> str:
    """One line from what the probe printed: how many attempts eformer made and its last complaint."""
    attempts = sum(1 for ln in lines if "on Attempt" in ln)
    notes = [
        ln
        for ln in lines
        if any(
            k in ln
            for k in ("Error", "error", "WARNING", "Warning", "failed", "Pruned", "Not enough", "Timeout", "timed out")
        )
    ]
    last = notes[-1] if notes else (lines[-1] if lines else "no output")
    last = last.split(" -- ", 1)[-1][:140]
    head = f"no result in {took:.0f} s (killed)" if timed_out else f"exited {rc} after {took:.0f} s"
    return f"{head}; {attempts} attempt(s) logged; last: {last}"


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=REPS, help="interleaved reps of each launch case")
    ap.add_argument("--recovery-reps", type=int, default=3, help="reps of each recovery case (0: skip)")
    ap.add_argument("--probe-timeout", type=float, default=PROBE_TIMEOUT)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument(
        "--seed", type=int, default=None, help="the order of the cases in each rep (default: random, printed)"
    )
    ap.add_argument("--json", help="also write every measurement (per case and host) to this file")
    args = ap.parse_args(argv)
    reps, rec_reps = (1, 1) if args.smoke else (args.reps, args.recovery_reps)
    probe_timeout = min(args.probe_timeout, 30.0) if args.smoke else args.probe_timeout
    if args.smoke:
        common.smoke()

    import ray

    from fray_ray.testing import fake_tpu_cluster

    ef = eformer_version()
    load_before = os.getloadavg()
    t_setup = time.monotonic()
    launches: dict[tuple[str, int], list[dict[str, Any]]] = {}
    order_log: list[dict[str, Any]] = []  # every launch case in the order run (warm-ups included)
    recoveries: dict[tuple[str, int], list[float]] = {}
    probes: dict[str, str] = {}
    events: dict[str, dict[int, float]] = {}
    with (
        contextlib.redirect_stdout(sys.stderr),
        tempfile.TemporaryDirectory() as marker_dir,
        # the smoke checks the script, not Ray's detection time: 1 s health checks (the suite's) instead of ~15 s
        fake_tpu_cluster(
            {common.TPU_TYPE: 2},
            jobs_dir=os.path.join(marker_dir, "jobs"),
            health_check_period=1.0 if args.smoke else None,
        ) as fake,
    ):
        setup = time.monotonic() - t_setup
        peers = Peers(fake, marker_dir)
        cases = [(k, 1) for k in ("raw", "fray", EFORMER) if k != EFORMER or ef] + [("raw", 2), ("fray", 2)]
        seed = random.randrange(2**32) if args.seed is None else args.seed
        rng = random.Random(seed)
        for i in range(0 if args.smoke else -1, reps):  # -1: one untimed warm-up of each
            order = rng.sample(cases, len(cases))
            for kind, slices in order:
                peers.idle()
                tag = peers.tag(f"{kind}{slices}s")
                with common.CpuTrace() as trace:
                    got = getattr(peers, kind)(slices, tag)
                if kind == EFORMER:
                    peers.drain()
                got["all_running"], got["end_to_end"] = common.gang_times(
                    got["t0"], marker_dir, tag, slices * peers.spec.hosts, got["done"]
                )
                got["cpu_running"] = trace.at(got["t0"] + got["all_running"]) - trace.at(got["t0"])
                got["cpu_done"] = trace.at(got["done"]) - trace.at(got["t0"])
                got["markers"] = common.marker_details(marker_dir, tag)
                got["tag"] = tag
                got["kind"], got["slices"], got["rep"] = kind, slices, i
                order_log.append(got)
                if i >= 0:
                    launches.setdefault((kind, slices), []).append(got)
        time.sleep(2.5)  # workers report task events every second
        events = common.task_events(("raw:", "fray:"))
        if ef:
            for what in ("autoscale_execute_resumable", "TpuRemoteManager"):
                peers.idle()
                probes[what] = probe_eformer(fake.address, what, marker_dir, probe_timeout)
        rec_cases = [(k, 1) for k in ("raw", "fray", EFORMER) if k != EFORMER or ef] + [("raw", 2), ("fray", 2)]
        for _ in range(rec_reps):
            order = rng.sample(rec_cases, len(rec_cases))
            for kind, slices in order:
                peers.settle()
                tag = peers.tag(f"rec-{kind}{slices}s")
                recoveries.setdefault((kind, slices), []).append(getattr(peers, f"{kind}_recovery")(slices, tag))
        peers.settle()
    load_after = os.getloadavg()
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(
                {
                    "seed": seed,
                    "launches": order_log,
                    "recoveries": {f"{k} {s}": v for (k, s), v in recoveries.items()},
                },
                f,
                indent=1,
                default=str,
            )
    return report(
        launches,
        recoveries,
        probes,
        events,
        ef,
        reps,
        rec_reps,
        setup,
        load_before,
        load_after,
        ray.__version__,
        args.smoke,
        seed,
    )


BLOCKS = 3


def block_ratios(rows: list[dict[str, Any]], raw: list[dict[str, Any]], what: str, reps: int) -> tuple[float, float]:
    """The lowest and highest ratio to raw (of medians) over ``BLOCKS`` consecutive blocks of reps: how much
    the ratio moves from one part of the run to another, as it would between separate runs. NaN when
    there are fewer reps than blocks."""
    if reps < BLOCKS:
        return float("nan"), float("nan")
    ratios = []
    for b in range(BLOCKS):
        mine = [r[what] for r in rows if r["rep"] * BLOCKS // reps == b]
        base = [r[what] for r in raw if r["rep"] * BLOCKS // reps == b]
        if mine and base:
            ratios.append(common.med_p90(mine)[0] / common.med_p90(base)[0])
    return (min(ratios), max(ratios)) if ratios else (float("nan"), float("nan"))


def _fmt_load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def report(
    launches: dict[tuple[str, int], list[dict[str, Any]]],
    recoveries: dict[tuple[str, int], list[float]],
    probes: dict[str, str],
    events: dict[str, dict[int, float]],
    ef: str | None,
    reps: int,
    rec_reps: int,
    setup: float,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    ray_version: str,
    smoke: bool,
    seed: int | None = None,
) -> dict[str, Any]:
    med = common.med_p90
    print(
        f"Fray vs peers on Ray {ray_version}: emulated 2 x {common.TPU_TYPE} (2 hosts each), trivial host function; "
        f"{reps} interleaved rep(s) per launch case{'' if smoke else ' after 1 warm-up'}, {rec_reps} per "
        f"recovery case; "
        f"eformer {ef or 'not installed'}; case order seed={seed} (--seed)\n"
        f"load average (1/5/15 min) {_fmt_load(load_before)} before, {_fmt_load(load_after)} after; "
        f"cluster start-up {setup:.1f} s (not counted)\n"
        f"every case starts on an idle cluster and a quiet machine (<= {common.QUIET_BUSY:.0%} of the cores busy for "
        f"{2 * common.QUIET_WINDOW:g} s; {common.not_quiet} case(s) did not get one within {common.QUIET_TIMEOUT:g} s)"
    )
    print(f"{'case':<50}{'peer':<34}{'median s':>9}{'p90 s':>8}{'ratio':>7}  {'by block':<11}")
    out: dict[str, Any] = {"launch": {}, "recovery": {}, "probes": probes}
    peer_names = {"raw": "raw Ray (PG + tasks)", "fray": "fray RayCluster", EFORMER: "eformer execute_resumable"}
    for slices in (1, 2):
        for what in ("end_to_end", "all_running"):
            label = (
                f"{'end to end' if what == 'end_to_end' else 'launch -> all hosts running'}, {slices} "
                f"slice{'s' * (slices > 1)}"
            )
            base = med([r[what] for r in launches[("raw", slices)]])[0]
            for kind in ("raw", "fray", EFORMER):
                rows = launches.get((kind, slices))
                if rows:
                    m, p90 = med([r[what] for r in rows])
                    lo, hi = block_ratios(rows, launches[("raw", slices)], what, reps)
                    goal = f" goal <= {GOAL:.2f} ({'met' if m / base <= GOAL else 'MISSED'})" if kind == "fray" else ""
                    blocks = f"{lo:.2f}-{hi:.2f}" if kind != "raw" and lo == lo else ""
                    print(f"{label:<50}{peer_names[kind]:<34}{m:>9.3f}{p90:>8.3f}{m / base:>7.2f}  {blocks:<11}{goal}")
                    out["launch"][f"{kind} {slices} {what}"] = {
                        "median": m,
                        "p90": p90,
                        "ratio": m / base,
                        "blocks": (lo, hi),
                    }
                elif kind == EFORMER:
                    why = (
                        "not installed (pip install -e '.[bench]')"
                        if not ef
                        else probes.get("autoscale_execute_resumable", "?")
                    )
                    name = "eformer autoscale_execute_resumable" if slices == 2 else peer_names[kind]
                    print(f"{label:<50}{name:<34}  {why}")
    for slices in (1, 2):
        label = (
            f"recovery, {slices} slice{'s' * (slices > 1)} "
            f"({'idle slice ready' if slices == 1 else 'waits for restored slice'})"
        )
        raw = recoveries.get(("raw", slices))
        for kind in ("raw", "fray", EFORMER):
            rows = recoveries.get((kind, slices))
            if rows and raw:
                m, p90 = med(rows)
                print(f"{label:<50}{peer_names[kind]:<34}{m:>9.2f}{p90:>8.2f}{m / med(raw)[0]:>7.2f}")
                out["recovery"][f"{kind} {slices}"] = {"median": m, "p90": p90, "ratio": m / med(raw)[0]}
            elif kind == EFORMER and rec_reps:
                why = "not installed" if not ef else probes.get("autoscale_execute_resumable", "?")
                name = "eformer autoscale_execute_resumable" if slices == 2 else peer_names[kind]
                print(f"{label:<50}{name:<34}  {why}")
    if ef:
        print(
            f"{'held session, per-call overhead':<46}{'eformer TpuRemoteManager':<34}  "
            f"{probes.get('TpuRemoteManager', '?')}"
        )
    breakdown(launches, events)
    return out


def breakdown(launches: dict[tuple[str, int], list[dict[str, Any]]], events: dict[str, dict[int, float]]) -> None:
    """Where the gang launch goes: medians of each step's time after the launch call (module doc)."""
    print("\ngang launch breakdown (median s after the launch call; '-': not measured for that peer)")
    cols = [("raw", 1), ("fray", 1), ("raw", 2), ("fray", 2)]
    print(f"{'step':<56}" + "".join(f"{f'{k} {s}s':>10}" for k, s in cols))
    steps = [
        ("fray: supervisor began attempt 0 (got the job)", lambda r: r.get("attempt")),
        ("fray: slices held (every placement group ready)", lambda r: r.get("held")),
        ("host tasks created (last; Ray task events)", lambda r: _ev(events, r, common.SUBMITTED, max)),
        ("host processes created (first)", lambda r: min(m["process_start"] for m in r["markers"])),
        ("host processes created (last)", lambda r: max(m["process_start"] for m in r["markers"])),
        ("a worker got the task (last; task events)", lambda r: _ev(events, r, common.TO_WORKER, max)),
        ("task RUNNING (last; task events)", lambda r: _ev(events, r, common.RUNNING, max)),
        ("user function started (last) = all hosts running", lambda r: max(m["t"] for m in r["markers"])),
        ("fray: every host reported in (job RUNNING)", lambda r: r.get("reported")),
        ("result back (end to end)", lambda r: r["done"]),
    ]
    for label, get in steps:
        cells = []
        for key in cols:
            vals = [v - r["t0"] for r in launches.get(key, []) if (v := get(r)) is not None]
            cells.append(f"{common.med_p90(vals)[0]:>10.3f}" if vals else f"{'-':>10}")
        print(f"{label:<56}" + "".join(cells))
    reused = {
        k: sum(
            1 for s in (1, 2) for r in launches.get((k, s), []) for m in r["markers"] if m["process_start"] < r["t0"]
        )
        for k in ("raw", "fray")
    }
    print(
        f"{'hosts that ran in a worker older than the launch (reused)':<56}"
        + "".join(f"{reused[k]:>10}" for k in ("raw", "fray"))
        + "   (raw, fray; all reps)"
    )
    print("what each launch cost in CPU seconds (medians; load-independent, unlike the times above)")
    cpu_rows = [
        ("the machine (all processes), launch -> all hosts running", lambda r: [r["cpu_running"]]),
        ("the machine (all processes), launch -> result back", lambda r: [r["cpu_done"]]),
        ("a host process, created -> its function started", lambda r: [m["cpu"] for m in r["markers"]]),
    ]
    for label, get in cpu_rows:
        cells = []
        for key in cols:
            vals = [v for r in launches.get(key, []) for v in get(r)]
            cells.append(f"{common.med_p90(vals)[0]:>10.3f}" if vals else f"{'-':>10}")
        print(f"{label:<56}" + "".join(cells))
    for kind in ("raw", "fray"):
        xs = [m["t"] - m["process_start"] for s in (1, 2) for r in launches.get((kind, s), []) for m in r["markers"]]
        if xs:
            print(
                f"{f'{kind}: host process created -> its function started (per host, s)':<56}"
                f"{common.med_p90(xs)[0]:>10.3f}"
            )


def _ev(events: dict[str, dict[int, float]], run: dict[str, Any], state: int, agg: Any) -> float | None:
    prefix = f"fray:{run['job']}:" if "job" in run else f"raw:{run['tag']}:"
    ts = [e[state] for name, e in events.items() if name.startswith(prefix) and state in e]
    return agg(ts) if ts else None


if __name__ == "__main__":
    main()

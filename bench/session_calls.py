"""Held session: per-call overhead of ``session.run`` on a held 2 x v4-16 (4 host workers), against a fresh
``launch`` + ``wait`` of the same trivial function on the same cluster.

    python bench/session_calls.py                  # local simulated fleet: 200 session calls, 10 fresh jobs
    python bench/session_calls.py --backend ray    # emulated Ray cluster (bench/ray_session_calls.py runs this)
    python bench/session_calls.py --smoke          # 10 calls, 2 jobs (CI keeps the script working)

On Ray (``fray_ray.testing.fake_tpu_cluster({"v4-16": 2})``) a third column: raw Ray tasks on the session's own
placement groups (one zero-resource task per host, pinned to the host's bundle with the placement-group
scheduling strategy, on reused Ray workers): the floor of a broadcast on that placement. Session calls and raw
tasks alternate while the session is held; the fresh jobs run after it closed (they need its slices).

Goals: median per-call overhead <= 0.02 s locally and <= 0.05 s on Ray, and >= 20 x faster than a fresh launch.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from fray_core import Entrypoint, JobRequest, JobStatus, ResourceConfig
from fray_local import LocalCluster, TpuFleet


def trivial() -> int:
    return 1


def fresh_launches(cluster: Any, resources: ResourceConfig, jobs: int) -> list[float]:
    """Seconds of ``launch`` + ``wait`` of ``trivial`` as a fresh job, ``jobs`` times in a row."""
    out = []
    for i in range(jobs):
        t0 = time.perf_counter()
        job_id = cluster.launch(
            JobRequest(name=f"fresh{i}", entrypoint=Entrypoint(callable=trivial), resources=resources)
        )
        info = cluster.wait(job_id, timeout=300)
        out.append(time.perf_counter() - t0)
        assert info.status is JobStatus.SUCCEEDED and info.result == [1, 1, 1, 1]
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--backend", choices=["local", "ray"], default="local")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    calls, jobs = (10, 2) if args.smoke else (args.calls, args.jobs)
    if args.backend == "ray":
        return ray_main(calls, jobs)
    resources = ResourceConfig.with_tpu("v4-16", slice_count=2)
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster(fleet=TpuFleet({"v4-16": 2}), jobs_dir=d)
        try:
            fresh = fresh_launches(cluster, resources, jobs)
            held = []
            with cluster.hold(resources) as session:
                session.run(trivial)  # warm-up: the first call imports what the call path needs
                for _ in range(calls):
                    t0 = time.perf_counter()
                    out = session.run(trivial)
                    held.append(time.perf_counter() - t0)
                    assert out == [1, 1, 1, 1]
        finally:
            cluster.close()
    f, h = statistics.median(fresh), statistics.median(held)
    print(f"held session on 2 x v4-16 (4 host workers): per call, median of {calls} calls / {jobs} fresh jobs")
    print(f"{'':<30}{'seconds':>10}{'ratio':>8}")
    print(f"{'launch + wait (baseline)':<30}{f:>10.4f}{1.0:>8.2f}")
    print(
        f"{'session.run':<30}{h:>10.4f}{h / f:>8.3f}   goal <= 0.02 s and >= 20x faster "
        f"({'met' if h <= 0.02 and f / h >= 20 else 'MISSED'})"
    )
    return {"calls": calls, "fresh_s": f, "held_s": h, "ratio": h / f}


def _session_groups(job_id: str) -> list[Any]:
    """The session's worker placement groups (one per slice, a bundle per host), in slice order."""
    import ray
    from ray.util import placement_group_table
    from ray.util.placement_group import PlacementGroup

    groups = [
        (g["name"], pg_id)
        for pg_id, g in placement_group_table().items()
        if g["name"].startswith(f"fray-{job_id}-") and "-head-" not in g["name"] and g["state"] == "CREATED"
    ]
    groups.sort(key=lambda g: int(g[0].rsplit("-", 1)[1]))  # created in slice order
    return [PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))) for _, pg_id in groups]


def ray_main(calls: int, jobs: int) -> dict[str, float]:
    import contextlib
    import os
    import sys

    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from fray_core.tpu import get_tpu_spec
    from fray_ray.testing import fake_tpu_cluster

    hosts = get_tpu_spec("v4-16").hosts
    resources = ResourceConfig.with_tpu("v4-16", slice_count=2)
    raw_task = ray.remote(num_cpus=0)(trivial)
    # Ray prints the cluster's log lines to this process's stdout: send them to stderr (stdout: the table only)
    with (
        contextlib.redirect_stdout(sys.stderr),
        tempfile.TemporaryDirectory() as d,
        fake_tpu_cluster({"v4-16": 2}, jobs_dir=os.path.join(d, "jobs")) as fake,
    ):
        cluster = fake.cluster
        held: list[float] = []
        raw: list[float] = []
        with cluster.hold(resources, name="bench-session") as session:
            pgs = _session_groups(session.job_id)
            assert len(pgs) == 2, pgs
            tasks = [
                raw_task.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=h
                    )
                )
                for pg in pgs
                for h in range(hosts)
            ]
            assert session.run(trivial) == [1] * 4 and ray.get([t.remote() for t in tasks]) == [1] * 4  # warm-up
            for i in range(calls):
                for kind in ("session", "raw") if i % 2 else ("raw", "session"):  # alternate who goes first
                    t0 = time.perf_counter()
                    out = (
                        session.run(trivial) if kind == "session" else ray.get([t.remote() for t in tasks], timeout=60)
                    )
                    (held if kind == "session" else raw).append(time.perf_counter() - t0)
                    assert out == [1, 1, 1, 1]
        fresh = fresh_launches(cluster, resources, jobs)
    f, (h, h90), (r, r90) = statistics.median(fresh), med_p90(held), med_p90(raw)
    print(
        f"held session on Ray {ray.__version__}, emulated 2 x v4-16 (4 host workers): per call, {calls} "
        f"session calls and "
        f"{calls} raw broadcasts interleaved, then {jobs} fresh jobs"
    )
    print(f"{'':<44}{'median s':>10}{'p90 s':>8}{'ratio':>8}")
    print(f"{'launch + wait (fresh job)':<44}{f:>10.4f}{max(fresh):>8.3f}{1.0:>8.2f}")
    print(f"{'raw Ray tasks on the held placement groups':<44}{r:>10.4f}{r90:>8.4f}{r / f:>8.3f}")
    print(
        f"{'session.run':<44}{h:>10.4f}{h90:>8.4f}{h / f:>8.3f}   goal <= 0.05 s and >= 20x faster "
        f"({'met' if h <= 0.05 and f / h >= 20 else 'MISSED'}; {h / r:.1f} x the raw tasks)"
    )
    return {"calls": calls, "fresh_s": f, "held_s": h, "raw_s": r, "ratio": h / f}


def med_p90(xs: list[float]) -> tuple[float, float]:
    """Median and 90th percentile (nearest rank)."""
    s = sorted(xs)
    return statistics.median(s), s[min(len(s) - 1, max(0, int(round(0.9 * len(s) + 0.5)) - 1))]


if __name__ == "__main__":
    main()

"""Held session: per-call overhead of ``session.run`` on a held 2 x v4-16 (4 host workers), against a fresh
``launch`` + ``wait`` of the same trivial function on the same simulated fleet.

    python bench/session_calls.py            # 200 session calls, 10 fresh jobs
    python bench/session_calls.py --smoke    # 10 calls, 2 jobs (CI keeps the script working)

Goal: median per-call overhead <= 0.02 s locally, i.e. >= 20 x faster than a fresh launch.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from fray_core import Entrypoint, JobRequest, JobStatus, ResourceConfig
from fray_local import LocalCluster, TpuFleet


def trivial() -> int:
    return 1


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    calls, jobs = (10, 2) if args.smoke else (args.calls, args.jobs)
    resources = ResourceConfig.with_tpu("v4-16", slice_count=2)
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster(fleet=TpuFleet({"v4-16": 2}), jobs_dir=d)
        try:
            fresh = []
            for i in range(jobs):
                t0 = time.perf_counter()
                job_id = cluster.launch(JobRequest(name=f"fresh{i}", entrypoint=Entrypoint(callable=trivial), resources=resources))
                info = cluster.wait(job_id, timeout=300)
                fresh.append(time.perf_counter() - t0)
                assert info.status is JobStatus.SUCCEEDED and info.result == [1, 1, 1, 1]
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


if __name__ == "__main__":
    main()

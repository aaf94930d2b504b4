"""Local backend: N concurrent one-process jobs, launch -> all results, against bare multiprocessing.

    python bench/local_backend.py            # 100 jobs, 3 repeats
    python bench/local_backend.py --smoke    # 4 jobs, 1 repeat (CI keeps the script working)

The baseline does the same work the way one would without Fray: one `multiprocessing` process per job
(spawn start method: a fresh interpreter, as Fray's hosts are), results back through a queue.
Goal: Fray <= 1.5 x the baseline.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time

from fray_core import Entrypoint, JobRequest, JobStatus
from fray_local import LocalCluster


def work(x: int) -> int:
    return x * x


def _mp_child(x: int, q: mp.Queue) -> None:
    q.put((x, work(x)))


def run_baseline(n: int) -> float:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    t0 = time.perf_counter()
    procs = [ctx.Process(target=_mp_child, args=(i, q)) for i in range(n)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=300) for _ in range(n))
    for p in procs:
        p.join(timeout=60)
    dt = time.perf_counter() - t0
    assert results == {i: i * i for i in range(n)}
    return dt


def run_fray(n: int, jobs_dir: str) -> float:
    cluster = LocalCluster(jobs_dir=jobs_dir)
    t0 = time.perf_counter()
    ids = [
        cluster.launch(JobRequest(name=f"b{i}", entrypoint=Entrypoint.from_callable(work, args=(i,)))) for i in range(n)
    ]
    infos = cluster.wait(ids, timeout=600)
    dt = time.perf_counter() - t0
    assert all(i.status == JobStatus.SUCCEEDED for i in infos)
    assert [i.result[0] for i in infos] == [k * k for k in range(n)]
    cluster.close()
    return dt


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    n, repeats = (4, 1) if args.smoke else (args.jobs, args.repeats)
    base, fray = [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(repeats):  # interleaved, so drift in machine load hits both alike
            base.append(run_baseline(n))
            fray.append(run_fray(n, f"{d}/{r}"))
    b, f = statistics.median(base), statistics.median(fray)
    print(f"local backend: {n} concurrent one-process jobs, launch -> all results (median of {repeats})")
    print(f"{'':<28}{'seconds':>10}{'ratio':>8}")
    print(f"{'multiprocessing (baseline)':<28}{b:>10.3f}{1.0:>8.2f}")
    print(f"{'fray LocalCluster':<28}{f:>10.3f}{f / b:>8.2f}   goal <= 1.50 ({'met' if f / b <= 1.5 else 'MISSED'})")
    return {"jobs": n, "baseline_s": b, "fray_s": f, "ratio": f / b}


if __name__ == "__main__":
    main()

"""Gang launch on Ray: fray's RayCluster against a hand-written placement group + one task per host.

    python bench/ray_gang_launch.py            # 10 runs of each (after one warm-up each)
    python bench/ray_gang_launch.py --smoke    # 2 runs of each, no warm-up (CI keeps the script working)

On the emulated 2 x v4-16 cluster (``fray_ray.testing.fake_tpu_cluster``: 4 TPU hosts, each its own raylet),
a job over both slices (4 hosts) whose hosts write a start marker (``time.time()``) and return. Timed
with THE gang-launch measure of ``_ray_common.py`` (``gang_times``): (a) all hosts running, (b) end to end.

- fray: ``cluster.launch(request)`` -> (a) the last of the 4 hosts started; (b) ``cluster.wait`` returned
  the result (the detached supervisor actor, the two-phase slice reservation, host tasks, release, the job
  record, and ``wait``'s 0.1 s polling all included).
- baseline: what one writes by hand with Ray: a placement group per slice (a ``{"TPU": 4}`` bundle per host,
  bound to the slice's nodes by the ``ray.io/tpu-slice-name`` label selector; the slice names are known in
  advance) and one ``max_calls=1`` task per host with the same resources, submitted from this driver;
  (a) the last host started; (b) ``ray.get`` of every host's result returned and the groups were removed.

Runs are interleaved (fray, baseline, fray, ...) after one warm-up of each; each starts on an idle cluster
(waiting for that is not timed). Goal: fray <= 1.10 x the baseline (median).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from typing import Any

import cloudpickle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ray_common as common  # noqa: E402

cloudpickle.register_pickle_by_value(common)  # host bodies travel by value: workers need not import bench/

GOAL = 1.10


def fray_run(fake: Any, marker_dir: str, tag: str) -> tuple[float, ...]:
    from fray_core import Entrypoint, JobRequest, ResourceConfig

    request = JobRequest(
        name=f"bench-{tag}",
        entrypoint=Entrypoint.from_callable(common.mark, args=(marker_dir, tag)),
        resources=ResourceConfig.with_tpu(common.TPU_TYPE, slice_count=2),
        max_retries_preemption=0,
    )
    t0 = time.time()
    job_id = fake.cluster.launch(request)
    info = fake.cluster.wait(job_id, timeout=300, raise_on_failure=True)
    t_done = time.time()
    first = info.attempts[0]  # both slices held: when the runner got the leases (Attempt.acquired_at)
    return *common.gang_times(t0, marker_dir, tag, 4, t_done), first.started_at - t0, first.acquired_at - t0


def baseline_run(task: Any, slice_names: list[str], hosts: int, chips: int, marker_dir: str, tag: str) -> tuple[float, float]:
    import ray
    from ray.util.placement_group import remove_placement_group

    t0 = time.time()
    pgs = common.baseline_placement_groups(slice_names, hosts, chips)
    refs = [task.options(**common.host_task_options(pg, h, chips)).remote(marker_dir, tag) for pg in pgs for h in range(hosts)]
    ray.get(refs, timeout=300)
    for pg in pgs:
        remove_placement_group(pg)
    return common.gang_times(t0, marker_dir, tag, len(refs), time.time())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    runs = 2 if args.smoke else args.runs

    import ray

    from fray_core.tpu import get_tpu_spec
    from fray_ray.testing import fake_tpu_cluster

    spec = get_tpu_spec(common.TPU_TYPE)
    task = ray.remote(max_calls=1)(common.mark)
    times: dict[str, list[tuple[float, ...]]] = {"fray": [], "baseline": []}
    t_setup = time.monotonic()
    # Ray prints the cluster's log lines (raylet deaths...) to this process's stdout: send them to stderr,
    # so stdout carries only the table.
    with contextlib.redirect_stdout(sys.stderr), tempfile.TemporaryDirectory() as marker_dir, fake_tpu_cluster({common.TPU_TYPE: 2}, jobs_dir=os.path.join(marker_dir, "jobs")) as fake:
        setup = time.monotonic() - t_setup
        names = sorted(fake.slices()[spec.name])

        def idle() -> None:
            common.wait_idle(2, spec.hosts, spec.chips_per_host, spec.head_resource)

        for i in range(0 if args.smoke else -1, runs):  # -1: warm-up of both, not counted (none in smoke)
            for kind in ("fray", "baseline") if i % 2 else ("baseline", "fray"):  # alternate who goes first
                idle()
                tag = f"{kind}{i + 1}"
                if kind == "fray":
                    got = fray_run(fake, marker_dir, tag)
                else:
                    got = baseline_run(task, names, spec.hosts, spec.chips_per_host, marker_dir, tag)
                if i >= 0:
                    times[kind].append(got)
        idle()
    print(
        f"gang launch on Ray {ray.__version__}: emulated 2 x {spec.name} ({2 * spec.hosts} hosts), trivial function; "
        f"{runs} interleaved runs each{'' if args.smoke else ' after 1 warm-up'} (cluster start-up {setup:.1f} s, not counted)"
    )
    print(f"{'':<52}{'median s':>10}{'p90 s':>8}{'ratio':>8}   goal")
    out: dict[str, Any] = {"runs": runs}
    for i, what in enumerate(("launch -> all hosts running", "launch -> result")):
        b_med, b_p90 = common.med_p90([t[i] for t in times["baseline"]])
        f_med, f_p90 = common.med_p90([t[i] for t in times["fray"]])
        ratio = f_med / b_med
        print(f"{what + ': baseline PG + tasks':<52}{b_med:>10.3f}{b_p90:>8.3f}{1.0:>8.2f}")
        print(
            f"{what + ': fray RayCluster':<52}{f_med:>10.3f}{f_p90:>8.3f}{ratio:>8.2f}   <= {GOAL:.2f} "
            f"({'met' if ratio <= GOAL else 'MISSED'}; fray - baseline = {f_med - b_med:+.3f} s)"
        )
        out[what] = {"baseline": b_med, "fray": f_med, "ratio": ratio}
    for i, what in ((2, "(fray: launch -> supervisor began attempt 0)"), (3, "(fray: launch -> both slices held)")):
        m, p90 = common.med_p90([t[i] for t in times["fray"]])
        print(f"{what:<52}{m:>10.3f}{p90:>8.3f}")
    return out


if __name__ == "__main__":
    main()

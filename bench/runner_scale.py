"""The gang runner at fleet scale: GangRunner over the in-memory provider on a fake clock.

    python bench/runner_scale.py            # 1,000 x v4-128 (16,000 hosts), 10,000 slice preemptions
    python bench/runner_scale.py --smoke    # 20 slices, 200 preemptions (CI keeps the script working)

What it measures: the runner's own cost (policy, per-host env, bookkeeping) with no processes and no real
waiting. One job asks for every slice of the fleet (``v4-128``: 16 hosts per slice). Attempts 0..A-1 each
lose ``--per-attempt`` slices at the same fake instant (a preemption storm: every host of those slices ends
PREEMPTED, the runner cancels the rest, releases everything, backs off and retries; preempted slices come
back at once); the last attempt succeeds. So the run starts (A + 1) x hosts host runs and sees
``--preemptions`` slice preemptions in all.

Figures: wall time (``time.perf_counter``, without tracemalloc) and peak memory, both for the full size and,
as the baseline, for the same scenario at 1/10 of the slices and preemptions (10x the work should cost at
most ~10x). Peak memory is the peak of Python allocations during the run (tracemalloc, in a second,
untimed run of the first repeat) and the process's ru_maxrss (the whole interpreter). Every size runs in a
fresh interpreter.
Goal: full size < 2 s and < 300 MB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from typing import Any

TPU_TYPE = "v4-128"  # 16 hosts per slice


def scenario(slices: int, preemptions: int, per_attempt: int, profile: str | None = None) -> dict[str, Any]:
    """Run the storm scenario once; returns figures (in this process)."""
    from fray_core.runner import GangRunner, RetryPolicy
    from fray_core.testing import FakeClock, HostScript, InMemorySliceProvider
    from fray_core.types import Entrypoint, JobRequest, ResourceConfig

    per_attempt = min(per_attempt, slices)
    storms = -(-preemptions // per_attempt)  # attempts that lose slices
    preempt = HostScript("PREEMPTED", after=1.0, restore_after=0.0)

    late = HostScript("SUCCEEDED", after=2.0)
    lost = [min(per_attempt, preemptions - a * per_attempt) for a in range(storms)]  # slices lost per storm

    def script(attempt: int, s: int, h: int) -> Any:
        # In a storm attempt the first lost[attempt] slices are preempted at t+1 s; the others would
        # succeed at t+2 s, but the runner cancels them first. The last attempt succeeds.
        if attempt >= storms:
            return "SUCCEEDED"
        return preempt if s < lost[attempt] else late

    clock = FakeClock()
    provider = InMemorySliceProvider({TPU_TYPE: slices}, clock, script=script, record=False)
    request = JobRequest(
        name="scale",
        entrypoint=Entrypoint(binary="true"),
        resources=ResourceConfig.with_tpu(TPU_TYPE, slice_count=slices),
        max_retries_preemption=storms + 1,
    )
    runner = GangRunner(
        "scale", request, provider, policy=RetryPolicy(backoff_initial=1.0, backoff_max=30.0),
        clock=clock, wall=clock.wall, sleep=clock.sleep,
    )  # fmt: skip
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    outcome = runner.run()
    dt = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    assert outcome.status.value == "SUCCEEDED", outcome
    assert provider.problems() == [], provider.problems()[:5]
    assert provider.slice_preemptions == preemptions, (provider.slice_preemptions, preemptions)
    return {
        "seconds": dt,
        "hosts": slices * 16,
        "attempts": len(runner.info.attempts),
        "host_runs": provider.hosts_started,
        "preemptions": provider.slice_preemptions,
    }


def child(args: argparse.Namespace) -> None:
    """One size in this (fresh) interpreter: a timed run, then a tracemalloc run; prints JSON."""
    import fray_core.runner  # noqa: F401  (imports outside the measurement)
    import fray_core.testing  # noqa: F401

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = scenario(args.slices, args.preemptions, args.per_attempt, args.profile)
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["maxrss_growth_mb"] = out["maxrss_mb"] - rss_before / 1024
    if args.trace:
        tracemalloc.start()
        scenario(args.slices, args.preemptions, args.per_attempt)
        out["traced_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1024**2
        tracemalloc.stop()
    print(json.dumps(out))


def run_size(slices: int, preemptions: int, per_attempt: int, profile: str | None = None, trace: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--slices", str(slices), "--preemptions", str(preemptions),
           "--per-attempt", str(per_attempt)]  # fmt: skip
    if trace:
        cmd.append("--trace")
    if profile:
        cmd += ["--profile", profile]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"runner_scale child failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", type=int, default=1000)
    ap.add_argument("--preemptions", type=int, default=10_000)
    ap.add_argument("--per-attempt", type=int, default=1000, help="slices lost per storm (attempt)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh interpreters per size; the median is shown")
    ap.add_argument("--profile", help="write a cProfile of one full-size run to this file")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return {}
    if args.smoke:
        args.slices, args.preemptions, args.per_attempt, args.repeats = 20, 200, 20, 1
    big = (args.slices, args.preemptions, args.per_attempt)
    small = (max(1, args.slices // 10), max(1, args.preemptions // 10), max(1, args.per_attempt // 10))
    rows: dict[str, list[dict[str, Any]]] = {"small": [], "big": []}
    traced: dict[str, float] = {}
    for i in range(args.repeats):  # interleaved; the first repeat also measures memory (tracemalloc, untimed)
        for key, size in (("small", small), ("big", big)):
            r = run_size(*size, trace=i == 0)
            traced.setdefault(key, r.get("traced_peak_mb", 0.0))
            rows[key].append(r)

    def med(rs: list[dict[str, Any]]) -> dict[str, Any]:
        rs = sorted(rs, key=lambda r: r["seconds"])
        return rs[len(rs) // 2]

    s, b = med(rows["small"]), med(rows["big"])
    s["traced_peak_mb"], b["traced_peak_mb"] = traced["small"], traced["big"]
    print(
        f"GangRunner at scale: in-memory provider, fake clock, {TPU_TYPE} (16 hosts/slice); one job over every slice,\n"
        f"storms of {args.per_attempt} slice preemptions per attempt; median of {args.repeats} fresh interpreter(s)"
    )
    hdr = f"{'size':<26}{'hosts':>7}{'attempts':>9}{'host runs':>11}{'preempt.':>9}{'seconds':>9}{'ratio':>7}{'traced MB':>10}{'maxrss MB':>10}"
    print(hdr)
    for label, r in (("1/10 size (baseline)", s), ("full size", b)):
        print(
            f"{label:<26}{r['hosts']:>7}{r['attempts']:>9}{r['host_runs']:>11}{r['preemptions']:>9}"
            f"{r['seconds']:>9.3f}{r['seconds'] / s['seconds']:>7.2f}{r['traced_peak_mb']:>10.1f}{r['maxrss_mb']:>10.1f}"
        )
    work = b["host_runs"] / s["host_runs"]
    tr = b["seconds"] / s["seconds"]
    print(
        f"work ratio (host runs) {work:.1f}x; time ratio {tr:.2f}x; goal: time ratio <= ~{work:.0f}x "
        f"({'met' if tr <= 1.1 * work else 'MISSED'}, 10% slack)"
    )
    print(
        f"goal full size: < 2 s -> {b['seconds']:.2f} s ({'met' if b['seconds'] < 2 else 'MISSED'}); "
        f"< 300 MB -> {max(b['traced_peak_mb'], b['maxrss_mb']):.0f} MB ({'met' if max(b['traced_peak_mb'], b['maxrss_mb']) < 300 else 'MISSED'})"
    )
    if args.profile:
        run_size(*big, profile=args.profile)
        print(f"profile of one full-size run written to {args.profile}")
    return {"small": s, "big": b}


if __name__ == "__main__":
    main()

"""Chaos soak on Ray: the chaos suite (tests/test_ray_chaos.py) with many more cases per phase.

    python bench/ray_chaos_soak.py                 # 8 cases per phase (48 jobs), a fresh seed
    python bench/ray_chaos_soak.py --cases 20 --seed 1234
    python bench/ray_chaos_soak.py --smoke         # collects the suite it would run (CI keeps it working;
                                                   # the suite itself runs those tests once already)

Each case launches a 1- or 2-slice job on the emulated 2 x v4-16 cluster and removes a slice at a random
instant of one phase of the attempt (reserving, before host start, while hosts start, running, cancelling
after a sibling failed, during terminate); the suite's invariants are checked after every job (it ends
within a bound, SUCCEEDED within its budget, the lost attempt counted as a preemption, no placement group or
actor left), then a 2-slice job must run. Prints the jobs that held every invariant over the jobs run (the
ratio; goal 1.00), and the seed to replay.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    cases = 1 if args.smoke else args.cases
    # The smoke only collects: the test suite runs tests/test_ray_chaos.py itself, and a second emulated cluster
    # for one more case cost CI ~80 s.
    select = ["--collect-only"] if args.smoke else []
    env = dict(os.environ, FRAY_CHAOS_SEED=str(seed), FRAY_CHAOS_CASES=str(cases))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_ray_chaos.py", *select],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - t0
    jobs = [line for line in out.stdout.splitlines() if line.strip().startswith("-> ")]
    failed = re.findall(r"^FAILED (\S+)", out.stdout, re.M)
    ok = len(jobs) - len(failed)  # a failed phase test stops at its first bad job
    print(
        f"chaos soak on Ray: seed {seed}, {cases} case(s) per phase, {len(jobs)} chaos job(s), {took:.0f} "
        f"s (replay: FRAY_CHAOS_SEED={seed})"
    )
    for line in jobs:
        print(f"  {line.strip()}")
    if args.smoke:
        collected = re.findall(r"^(\d+) tests? collected", out.stdout, re.M)
        print(f"smoke: {collected[0] if collected else 0} chaos test(s) collected, none run")
    print(
        f"jobs holding every invariant / jobs run: {ok}/{len(jobs)} -> ratio {ok / max(1, len(jobs)):.2f} (goal 1.00)"
    )
    if out.returncode != 0:
        print(out.stdout[-4000:], file=sys.stderr)
        print(out.stderr[-2000:], file=sys.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())

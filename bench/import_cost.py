"""Import cost of `fray_core` and `fray_local`, and proof that neither imports ray.

    python bench/import_cost.py [--smoke]

Each import is timed in a fresh interpreter (median of runs); the baseline is a fresh interpreter that
imports nothing (`python -c pass`), measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CODE = (
    "import time, sys; t = time.perf_counter(); import {mod}; dt = time.perf_counter() - t; "
    "print(dt, any(m == 'ray' or m.startswith('ray.') for m in sys.modules))"
)


def measure(mod: str, runs: int) -> tuple[float, bool]:
    times, ray_seen = [], False
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", CODE.format(mod=mod)], capture_output=True, text=True, check=True)
        dt, ray = out.stdout.split()
        times.append(float(dt))
        ray_seen |= ray == "True"
    return statistics.median(times), ray_seen


def interpreter_start(runs: int) -> float:
    import time

    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    runs = 2 if args.smoke else args.runs
    start = interpreter_start(runs)
    out: dict[str, float] = {"interpreter_start_s": start}
    print(f"import cost (median of {runs} fresh interpreters; interpreter start-up {start * 1000:.1f} ms)")
    print(f"{'module':<62}{'ms':>8}{'ratio':>8}  imports ray?   (ratio: import time / interpreter start-up)")
    for mod in (
        "fray_core",
        "fray_local",
        "fray_core, fray_local",
        # what a program that launches a job loads (the lazy submodules included):
        "fray_core.types, fray_core.cluster, fray_core.runner, fray_local.cluster",
    ):
        dt, ray = measure(mod, runs)
        out[mod] = dt
        print(f"{mod[:60]:<62}{dt * 1000:>8.1f}{dt / start:>8.2f}  {'YES (bug)' if ray else 'no'}")
        if ray:
            raise SystemExit(f"{mod} imported ray")
    return out


if __name__ == "__main__":
    main()

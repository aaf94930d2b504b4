"""Run every benchmark and write docs/performance.md (figures, machine, date, Ray version).

    python bench/run_all.py            # full sizes (~18 minutes on 2 cores when the machine is quiet)
    python bench/run_all.py --smoke    # tiny sizes, to check the scripts work (prints, writes nothing)

Each script prints its own table with its baseline measured in the same run; this collects them.
Hand-written analysis (where a goal is missed, what the profiler showed) lives in bench/NOTES.md and is
appended to the report.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = [  # (script, what it measures, needs ray); the first is the headline table of docs/performance.md
    ("peers_ray.py", "Fray vs each peer vs raw Ray (headline)", True),
    ("import_cost.py", "Import cost", False),
    ("runner_scale.py", "Runner at fleet scale (in-memory provider, fake clock)", False),
    ("local_backend.py", "Local backend vs multiprocessing", False),
    ("session_calls.py", "Held session calls vs fresh launches (local)", False),
    ("ray_recovery.py", "Recovery from a lost slice on Ray vs Ray's own failure detection", True),
    ("ray_attribution.py", "A lost slice's siblings failing first at Ray's default detection: no failure spent", True),
    ("ray_session_calls.py", "Held session calls on Ray vs fresh launches and raw Ray tasks", True),
    (
        "ray_control_plane.py",
        "The Ray control plane per job at fleet scale (phantom nodes) vs Ray job submission",
        True,
    ),
]


def machine() -> str:
    try:
        ray_version = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        ray_version = "not installed"
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f", {kb / 1024**2:.0f} GiB RAM"
    except OSError:
        pass
    return (
        f"{platform.machine()}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, Ray {ray_version}"
    )


def append_notes(sections: list[tuple[str, str, str, float]], total: float, load: str) -> None:
    """Append this run's goal lines (met / MISSED) to bench/NOTES.md, under the hand-written analysis."""
    lines = ["", f"### Run of {datetime.datetime.now().isoformat(timespec='minutes')} ({total:.0f} s; {load})", ""]
    for _title, script, text, _dt in sections:
        goals = [
            ln.strip() for ln in text.splitlines() if ("goal" in ln or "<=" in ln) and ("met" in ln or "MISSED" in ln)
        ]
        lines += [f"- `{script}`: {g}" for g in goals] or [f"- `{script}`: (no goal line)"]
    path = HERE / "NOTES.md"
    old = path.read_text() if path.exists() else "# Benchmark notes\n"
    path.write_text(old.rstrip("\n") + "\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes; do not write docs/performance.md")
    ap.add_argument("--only", nargs="*", help="run only these scripts")
    args = ap.parse_args(argv)
    sections, failed = [], []
    load_before, t_all = os.getloadavg(), time.perf_counter()
    for script, title, _needs_ray in SCRIPTS:
        if args.only and script not in args.only:
            continue
        path = HERE / script
        if not path.exists():
            sections.append((title, script, "(script not present)", 0.0))
            continue
        cmd = [sys.executable, str(path)] + (["--smoke"] if args.smoke else [])
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
        dt = time.perf_counter() - t0
        text = out.stdout.strip()
        if out.returncode != 0:
            failed.append(script)
            text += f"\n[exit code {out.returncode}]\n{out.stderr.strip()[-2000:]}"
        print(f"== {script} ({dt:.1f} s)\n{text}\n", flush=True)
        sections.append((title, script, text, dt))
    total, load_after = time.perf_counter() - t_all, os.getloadavg()
    load = (
        f"load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in load_before)} before, "
        + "/".join(f"{x:.1f}" for x in load_after)
        + " after"
    )
    print(f"all benchmarks: {total:.0f} s; {load}")
    if not args.smoke:
        append_notes(sections, total, load)
        notes = (HERE / "NOTES.md").read_text() if (HERE / "NOTES.md").exists() else ""
        notes = notes.split("\n## History")[0]  # superseded findings stay in NOTES.md only
        lines = [
            "# Performance",
            "",
            f"Measured {datetime.date.today().isoformat()} by `python bench/run_all.py` on: {machine()}.",
            "Every figure is a ratio against a baseline measured in the same run; no timing is asserted in tests",
            "(CI runs each script with `--smoke`; peers_ray.py without the `bench` extra reports eformer "
            "as not installed).",
            "Reproduce: `pip install -e '.[ray,bench]' && python bench/run_all.py` (all of this file), or "
            "one table with",
            "`python bench/<script>.py` (e.g. `python bench/peers_ray.py` for the headline table).",
            f"All scripts took {total:.0f} s; {load}. Timings of the Ray and local-backend figures move with",
            "the machine's load (2 cores, shared): read the ratios, not the seconds; bench/NOTES.md says "
            "which are noisy.",
            "",
        ]
        for title, script, text, dt in sections:
            lines += [f"## {title}", "", f"`bench/{script}` ({dt:.0f} s)", "", "```", text, "```", ""]
        if notes:
            lines += [notes.strip(), ""]
        (ROOT / "docs" / "performance.md").write_text("\n".join(lines))
        print(f"wrote {ROOT / 'docs' / 'performance.md'}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

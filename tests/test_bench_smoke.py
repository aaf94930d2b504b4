"""Each benchmark script still runs (tiny sizes). Figures are never asserted: see bench/ and docs/performance.md.

The Ray scripts (``bench/ray_*.py``) start their own emulated cluster (``fake_tpu_cluster``) once and shut it
down on exit; they are marked ``ray``. Modules starting with ``_`` are helpers, not benchmarks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "run_all.py" and not p.name.startswith("_"))
PARAMS = [
    pytest.param(s, marks=[pytest.mark.ray] if s.startswith("ray_") or s == "peers_ray.py" else []) for s in SCRIPTS
]


@pytest.mark.parametrize("script", PARAMS)
def test_bench_script_smoke(script: str) -> None:
    if script.startswith("ray_") or script == "peers_ray.py":
        pytest.importorskip("ray")
    out = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke"], capture_output=True, text=True, timeout=600, cwd=BENCH.parent
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "ratio" in out.stdout  # every script prints a comparison table against its baseline

"""Each benchmark script still runs (tiny sizes). Figures are never asserted: see bench/ and docs/performance.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "run_all.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_smoke(script: str) -> None:
    if script.startswith("ray_"):
        pytest.importorskip("ray")
    out = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke"], capture_output=True, text=True, timeout=600, cwd=BENCH.parent
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "ratio" in out.stdout or "x " in out.stdout  # every script prints a comparison table

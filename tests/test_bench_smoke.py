"""Each benchmark script still runs (tiny sizes). Figures are never asserted: see bench/ and docs/performance.md.

The Ray scripts (``bench/ray_*.py``) start their own emulated cluster (``fake_tpu_cluster``) once and shut it
down on exit; they are marked ``ray``. Modules starting with ``_`` are helpers, not benchmarks.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "run_all.py" and not p.name.startswith("_"))
PARAMS = [pytest.param(s, marks=[pytest.mark.ray] if s.startswith("ray_") or s == "peers_ray.py" else []) for s in SCRIPTS]


#: scripts that need the optional ``bench`` extra (``pip install -e '.[bench]'``): skipped without it
NEEDS_EXTRA = {"peers_ray.py": "eformer"}


@pytest.mark.parametrize("script", PARAMS)
def test_bench_script_smoke(script: str) -> None:
    if script.startswith("ray_") or script in NEEDS_EXTRA:
        pytest.importorskip("ray")
    if script in NEEDS_EXTRA and importlib.util.find_spec(NEEDS_EXTRA[script]) is None:  # find, not import: eformer pulls jax
        pytest.skip(f"{script} compares with {NEEDS_EXTRA[script]}, which is not installed: pip install -e '.[bench]'")
    out = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke"], capture_output=True, text=True, timeout=600, cwd=BENCH.parent
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "ratio" in out.stdout  # every script prints a comparison table against its baseline

"""Each benchmark script still runs (tiny sizes). Figures are never asserted: see bench/ and docs/performance.md.

The Ray scripts (``bench/ray_*.py``) start their own emulated cluster (``fake_tpu_cluster``) once and shut it
down on exit; they are marked ``ray``. Modules starting with ``_`` are helpers, not benchmarks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "run_all.py" and not p.name.startswith("_"))
PARAMS = [
    pytest.param(s, marks=[pytest.mark.ray] if s.startswith("ray_") or s == "peers_ray.py" else []) for s in SCRIPTS
]


SMOKE_TIMEOUT = 420  # below the test's own timeout


@pytest.mark.timeout(SMOKE_TIMEOUT + 60)
@pytest.mark.parametrize("script", PARAMS)
def test_bench_script_smoke(script: str) -> None:
    if script.startswith("ray_") or script == "peers_ray.py":
        pytest.importorskip("ray")
    # its own session: on a timeout the whole group goes (the Ray scripts' emulated clusters with it, not
    # only the script's own process), and the test fails saying so, with the script's output, before
    # pytest's own timeout would end it without
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), "--smoke"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=BENCH.parent,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=SMOKE_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{script} --smoke took over {SMOKE_TIMEOUT} s:\n{stdout[-2000:]}{stderr[-4000:]}")
    finally:
        _kill_group(proc.pid)  # anything the script left behind
    assert proc.returncode == 0, stdout[-2000:] + stderr[-4000:]
    assert "ratio" in stdout  # every script prints a comparison table against its baseline


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass

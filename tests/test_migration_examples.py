"""Every example in examples/migration/ runs as a script (local backend, simulated fleet) and prints what
its pattern promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "migration"

EXPECTED: dict[str, list[str]] = {
    "remove_bare_remote.py": ["normalized: [['hello world', 'fray is here'], ['one more line']]"],
    "remote_to_ctx_run.py": ["scores at top level: [0.0, 0.5, 1.0, 1.5]", "scores inside a job: [0.0, 0.5, 1.0]"],
    "runtime_env_to_job.py": ["evaluate -> llama: mode=fast attrs=attrs"],
    "head_node_to_non_preemptible.py": ["controller (preemptible=False) -> ['ran tokenize', 'ran train']"],
    "tpu_multislice.py": [f"slice {s}/2 host {h} on v4-16-{s}: 10 steps" for s in range(2) for h in range(2)],
    "actors.py": ["tokenize=SUCCESS train=RUNNING"],
    "submit_job_to_launch.py": ["status: SUCCEEDED", "log: [a0 r0] run exp-42"],
    # slice 1 is preempted in attempt 0: every host's result comes from attempt 1
    "levanter_run_on_pod.py": [f"attempt 1 slice {s} host {h}" for s in range(2) for h in range(2)],
    "marin_fray_v1.py": ["shard 0/2 JAX_PLATFORMS=cpu", "shard 1/2 JAX_PLATFORMS=cpu", "actor count: 3"],
    # attempt 0 times out (a preemption to levanter) after its checkpoint; max_retries_failure=0 still succeeds
    "levanter_resumable_script.py": ["host 0 resumed at step 50, finished at step 100"],
    "levanter_native.py": ["attempts: 0:FAILED, 1:SUCCEEDED"]
    + [f"host {h} of v4-16-{s} (2 slices)" for s in range(2) for h in range(2)],
}


def test_every_example_is_tested() -> None:
    on_disk = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name: str, tmp_path: Path) -> None:
    # the compat run_on_pod follows $RAY_ADDRESS, as levanter did: not the developer's cluster
    env = {k: v for k, v in os.environ.items() if k not in ("FRAY_CLUSTER_SPEC", "RAY_ADDRESS")}
    env["FRAY_JOBS_DIR"] = str(tmp_path / "jobs")
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, f"{name} failed:\n{out.stdout}\n{out.stderr}"
    lines = out.stdout.splitlines()
    for expected in EXPECTED[name]:
        assert expected in lines, f"{name}: {expected!r} not in its output:\n{out.stdout}"
    assert "Traceback" not in out.stderr, out.stderr

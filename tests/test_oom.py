"""A host killed by SIGKILL says "(out of memory?)" when the kernel's OOM killer is the likely reason (issue 30):
the OOM-kill counter of the host's memory cgroup grew while it ran. Checked on a file tree laid out as the kernel
lays it out, and for real: a local job whose supervisor runs in a small memory cgroup (skipped where one cannot
be made: not root, no memory controller)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from fray_core._oom import OomWatch, oom_suffix

ROOT = Path(__file__).resolve().parents[1]


def _tree(tmp_path: Path, cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(proc), str(cg)


@pytest.mark.parametrize(
    ("cgroup", "counter"),
    [
        ("0::/job.slice/host\n", "cgroup/job.slice/host/memory.events"),  # cgroup v2
        ("0::/job\n", "cgroup/unified/job/memory.events"),  # a hybrid system's unified hierarchy
        ("4:memory:/job\n0::/\n", "cgroup/memory/job/memory.oom_control"),  # cgroup v1
    ],
)
def test_the_watch_reads_the_host_cgroups_oom_kill_counter(tmp_path: Path, cgroup: str, counter: str) -> None:
    events = "low 0\nhigh 0\nmax 3\noom 1\noom_kill {}\noom_group_kill 0\n"
    proc, root = _tree(tmp_path, cgroup, {counter: events.format(1), "proc/vmstat": "pgfault 9\noom_kill 7\n"})
    watch = OomWatch.of(42, proc=proc, cgroup_root=root)
    assert watch is not None and watch.source == str(tmp_path / counter)
    assert oom_suffix(-9, watch) == ""
    (tmp_path / "proc" / "vmstat").write_text("oom_kill 8\n")  # another cgroup's OOM kill: not this host's
    assert oom_suffix(-9, watch) == ""
    (tmp_path / counter).write_text(events.format(2))
    assert oom_suffix(-9, watch) == " (out of memory?)"
    assert oom_suffix(137, watch) == " (out of memory?)"  # a shell's "killed by SIGKILL"
    assert oom_suffix(-15, watch) == oom_suffix(1, watch) == ""  # not what the OOM killer sends


def test_without_a_cgroup_counter_the_machines_counts(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "0::/\n", {"proc/vmstat": "oom_kill 7\n"})
    watch = OomWatch.of(42, proc=proc, cgroup_root=root)
    assert watch is not None and not watch.fired()
    (tmp_path / "proc" / "vmstat").write_text("oom_kill 8\n")
    assert watch.fired()
    assert OomWatch.of(43, proc=str(tmp_path / "none"), cgroup_root=root) is None


def _memory_cgroup(limit: int) -> Path | None:
    """A new memory cgroup of ``limit`` bytes below this process's (v1 or v2), or None where none can be made."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    name = f"fray-oom-{uuid.uuid4().hex[:8]}"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base, files = Path("/sys/fs/cgroup/memory", path.lstrip("/")), ("memory.limit_in_bytes",)
            files += ("memory.memsw.limit_in_bytes",) if (base / "memory.memsw.limit_in_bytes").exists() else ()
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base, files = Path("/sys/fs/cgroup", path.lstrip("/")), ("memory.max", "memory.swap.max")
            if "memory" not in (base / "cgroup.subtree_control").read_text().split():
                continue  # enabling it would need this cgroup to have no processes of its own
        else:
            continue
        try:
            (base / name).mkdir()
            for f in files:
                (base / name / f).write_text("0" if f == "memory.swap.max" else str(limit))
        except OSError:
            try:
                (base / name).rmdir()
            except OSError:
                pass
            return None
        return base / name
    return None


# Runs in the small cgroup: a local job whose host allocates far more than the limit (the OOM killer takes
# the largest process: the host's worker), then one whose host SIGKILLs itself (no OOM kill: no hint).
_JOBS = """
import json, os, signal, sys
from fray_core import Entrypoint, JobRequest, ResourceConfig
from fray_local import LocalCluster
from fray_local.testing import TEST_POLICY

def hog():
    chunks = []
    while True:
        chunks.append(bytearray(16 << 20))

def suicide():
    os.kill(os.getpid(), signal.SIGKILL)

cluster = LocalCluster(jobs_dir=sys.argv[1], retry_policy=TEST_POLICY)
causes = []
try:
    for fn in (hog, suicide):
        req = JobRequest(name=fn.__name__, entrypoint=Entrypoint(callable=fn), resources=ResourceConfig(),
                         max_retries_failure=0)
        info = cluster.wait(cluster.launch(req), timeout=60, raise_on_failure=False)
        causes.append((info.attempts[0].outcome.value, info.attempts[0].cause))
finally:
    cluster.close()
print(json.dumps(causes))
"""


def test_a_host_the_oom_killer_took_says_out_of_memory(tmp_path: Path) -> None:
    cgroup = _memory_cgroup(400 << 20)
    if cgroup is None:
        pytest.skip("no memory cgroup can be made here (not root, or no memory controller)")
    try:
        script = "import os, sys; open(sys.argv[2], 'w').write(str(os.getpid()))\n" + textwrap.dedent(_JOBS)
        proc = subprocess.run(
            ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), sys.executable, "-c", script]
            + [str(tmp_path / "jobs"), os.devnull],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        (hog_outcome, hog_cause), (kill_outcome, kill_cause) = json.loads(proc.stdout.strip().splitlines()[-1])
        print(hog_cause, kill_cause, sep="\n---\n")
        assert hog_outcome == "FAILED" and "killed by SIGKILL (out of memory?)" in hog_cause
        assert kill_outcome == "FAILED" and "killed by SIGKILL" in kill_cause and "out of memory" not in kill_cause
    finally:
        try:
            cgroup.rmdir()
        except OSError:
            pass

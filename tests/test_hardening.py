"""Hardening (issue 32): signals named by name, no guardian traceback, bounded output, bounded listeners,
validated numbers, sane size limits, monotonic durations, unpicklable session results with context."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fray_core import ElasticConfig, Entrypoint, Goodput, GpuConfig, JobRequest, JobStatus, ResourceConfig, TpuConfig
from fray_core.context import LocalJobContext
from fray_core.fleet import DirtyHost, DropCapacity, FailHost, FaultPlan, Fleet, PreemptSlice
from fray_core.limits import (
    MAX_CPUS,
    MAX_FAULTS,
    MAX_FLEET_SLICES,
    MAX_GPUS,
    MAX_HOSTS_PER_JOB,
    MAX_NAME_LENGTH,
    MAX_REPLICAS,
    MAX_RETRIES,
)
from fray_core.runner import GangRunner, RetryPolicy
from fray_core.testing import FakeClock, HostScript, InMemorySliceProvider
from fray_local import LocalCluster, TpuFleet
from fray_local._proc import HostProcess, LineSplitter, LogSink
from fray_local.testing import TEST_POLICY

REPO = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guardian and /proc are Linux-only")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FRAY_CLUSTER_SPEC"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(jobs_dir=str(tmp_path / "jobs"), retry_policy=TEST_POLICY)
    yield c
    c.close()


# ------------------------------------------------------------------------- 1. signals, named by name


def kill_myself(sig: int) -> None:
    os.kill(os.getpid(), sig)


@linux_only
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_host_killed_by_a_signal_is_reported_by_its_name(cluster: LocalCluster, sig: int) -> None:
    entry = Entrypoint(callable=kill_myself, function_args={"sig": sig})
    job_id = cluster.launch(JobRequest(name="oom", entrypoint=entry))
    info = cluster.wait(job_id, timeout=60)
    cause = info.attempts[0].cause or ""
    name = signal.Signals(sig).name
    assert info.status == JobStatus.FAILED and f"killed by {name}" in cause, cause
    assert "exited with code" not in cause
    log = "\n".join(cluster.logs(job_id))
    assert "Traceback" not in log and "Errno 22" not in log, log  # the guardian's own traceback, before the fix


def test_a_command_killed_by_a_signal_is_reported_by_its_name(cluster: LocalCluster) -> None:
    job_id = cluster.launch(JobRequest(name="cmd", entrypoint=Entrypoint.from_binary("sh", ["-c", "kill -9 $$"])))
    info = cluster.wait(job_id, timeout=60)
    assert "CommandFailed: killed by SIGKILL" in (info.attempts[0].cause or ""), info.attempts[0].cause


def test_describe_exit_names_signals() -> None:
    from fray_core._exits import describe_exit, exit_code_text

    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGTERM) == "killed by SIGTERM"
    assert describe_exit(3) == "exited with code 3"
    assert exit_code_text(-signal.SIGSEGV) == "killed by SIGSEGV" and exit_code_text(7) == "exit code 7"
    assert describe_exit(-200) == "killed by signal 200"


@linux_only
def test_the_readme_demo_and_fray_sim_print_no_traceback(tmp_path: Path) -> None:
    env = _env(FRAY_JOBS_DIR=str(tmp_path / "jobs"))
    demo = subprocess.run(
        [sys.executable, str(REPO / "examples" / "multislice_demo.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "PREEMPTED" in demo.stdout  # the simulated preemption did happen
    assert "Traceback" not in demo.stdout + demo.stderr, demo.stdout + demo.stderr
    sim = subprocess.run(
        [
            sys.executable,
            "-m",
            "fray_core.cli",
            "sim",
            "--preemptions",
            "1",
            "--failures",  # an injected failure is one line, not a traceback of Fray's own host code
            "1",
            "--seed",
            "3",
            "--steps",
            "4",
            "--step-time",
            "0.2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert "PREEMPTED" in sim.stdout and "SimulatedHostFailure: injected failure in attempt 1" in sim.stdout
    assert "Traceback" not in sim.stdout + sim.stderr, sim.stdout + sim.stderr


# ------------------------------------------------------------- 2. every public number, checked at construction


# values no numeric field takes: non-finite, negative, bool, str, None
BAD_NUMBERS = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), True, False, "5", "nan", None, [-1], 1e300]),
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
    st.integers(max_value=-1),
)
TPU = TpuConfig(type="v4-16")


def _entry() -> Entrypoint:
    return Entrypoint(binary="true")


# (the field as the error names it, a constructor taking the bad value); None is allowed where "no limit"
# is the documented meaning, and 1e300 where no upper bound exists
FIELDS = {
    **{
        f"RetryPolicy.{f}": (lambda v, f=f: RetryPolicy(**{f: v}))
        for f in (
            "backoff_initial",
            "backoff_max",
            "backoff_multiplier",
            "schedule_timeout",
            "poll_interval",
            "cancel_grace",
            "host_start_timeout",
            "progress_interval",
        )
    },
    "ElasticConfig.grow_after": lambda v: ElasticConfig(grow_after=v),
    "ElasticConfig.grace": lambda v: ElasticConfig(grace=v),
    "ResourceConfig.cpu": lambda v: ResourceConfig(cpu=v),
    "ResourceConfig.replicas": lambda v: ResourceConfig(device=TPU, replicas=v),
    "GpuConfig.count": lambda v: GpuConfig(type="A100", count=v),
    "JobRequest.max_retries_failure": lambda v: JobRequest(name="x", entrypoint=_entry(), max_retries_failure=v),
    "JobRequest.max_retries_preemption": lambda v: JobRequest(name="x", entrypoint=_entry(), max_retries_preemption=v),
    "JobRequest.stall_timeout": lambda v: JobRequest(name="x", entrypoint=_entry(), stall_timeout=v),  # None: off
    "JobRequest.startup_timeout": lambda v: JobRequest(name="x", entrypoint=_entry(), startup_timeout=v),  # None: off
    "PreemptSlice.after": lambda v: PreemptSlice(attempt=0, after=v),
    "PreemptSlice.restore_after": lambda v: PreemptSlice(attempt=0, restore_after=v),  # None: gone for good
    "FailHost.host_index": lambda v: FailHost(attempt=0, host_index=v),
    "DropCapacity.duration": lambda v: DropCapacity(attempt=0, tpu_type="v4-16", to=0, duration=v),
    "DropCapacity.to": lambda v: DropCapacity(attempt=0, tpu_type="v4-16", to=v),
    "DirtyHost.attempt": lambda v: DirtyHost(attempt=v),
    "quarantine_window": lambda v: Fleet(quarantine_window=v),
    "quarantine_for": lambda v: Fleet(quarantine_for=v),
    "waiter_ttl": lambda v: Fleet(waiter_ttl=v),
    "min_count": lambda v: Fleet(min_count=v),
    "detection_delay": lambda v: Fleet(detection_delay=v),  # 1e300 was accepted
    "FaultPlan.chaos: rate": lambda v: FaultPlan.chaos(seed=1, rate=v),
    "FaultPlan.chaos: attempts": lambda v: FaultPlan.chaos(seed=1, rate=0.5, attempts=v),
    "FaultPlan.chaos: max_slices": lambda v: FaultPlan.chaos(seed=1, rate=0.5, max_slices=v),
    "FaultPlan.chaos: horizon": lambda v: FaultPlan.chaos(seed=1, rate=0.5, horizon=v),
}
NONE_ALLOWED = {"PreemptSlice.restore_after", "JobRequest.stall_timeout", "JobRequest.startup_timeout"}
UNBOUNDED_ABOVE = {
    "FailHost.host_index",
    "DirtyHost.attempt",
}


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(FIELDS)), value=BAD_NUMBERS)
def test_any_bad_number_fails_at_construction_naming_the_field(field: str, value: object) -> None:
    if (value == 1e300 and field in UNBOUNDED_ABOVE) or (value is None and field in NONE_ALLOWED):
        return
    with pytest.raises((ValueError, TypeError)) as e:
        FIELDS[field](value)
    assert field in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def _fleet() -> Fleet:
    return Fleet({"v4-16": 2}, FakeClock())


# the simulated fleets' fault methods (fray_core.fleet.Fleet, the in-memory provider, the emulated Ray cluster):
# ``restore_after=nan`` scheduled a timer at NaN (a fake clock's heap out of order, a real timer's thread dead
# with a traceback), a negative one restored at once
FAULT_CALLS = {
    "preempt: restore_after": lambda v: _fleet().preempt("v4-16-0", restore_after=v),
    "notify_preemption: restore_after": lambda v: _fleet().notify_preemption("v4-16-0", 1.0, restore_after=v),
    "drop_capacity: duration": lambda v: _fleet().drop_capacity("v4-16", to=0, duration=v),
    "drop_capacity: to": lambda v: _fleet().drop_capacity("v4-16", to=v),
    "break_host: host": lambda v: _fleet().break_host("v4-16-0", v),
    "InMemorySliceProvider.preempt: restore_after": lambda v: InMemorySliceProvider({"v4-16": 1}, FakeClock()).preempt(
        "v4-16-0", restore_after=v
    ),
    "FakeTpuCluster.preempt: restore_after": lambda v: _fake_tpu_cluster_call("preempt", "s", restore_after=v),
    "FakeTpuCluster.drain: grace": lambda v: _fake_tpu_cluster_call("drain", "s", grace=v),
    "FakeTpuCluster.drain: restore_after": lambda v: _fake_tpu_cluster_call("drain", "s", grace=1.0, restore_after=v),
}


def _fake_tpu_cluster_call(method: str, *args: object, **kw: object) -> None:
    """The emulated Ray cluster's method on a stand-in (no cluster): its arguments are checked first."""
    from fray_ray.testing import FakeTpuCluster

    getattr(FakeTpuCluster, method)(object(), *args, **kw)


@pytest.mark.parametrize("what", sorted(FAULT_CALLS))
@pytest.mark.parametrize("value", [float("nan"), -1, "5"])
def test_fault_injection_numbers_are_checked(what: str, value: object) -> None:
    with pytest.raises((ValueError, TypeError)) as e:
        FAULT_CALLS[what](value)
    field = what.split(".", 1)[-1] if what.startswith(("InMemory", "FakeTpu")) else what
    assert field in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("value", [float("nan"), 1e300, "5", True])
def test_every_field_refuses_each_kind_of_bad_number(value: object) -> None:
    """The property test above samples; these kinds are tried on every field (1e300 on every bounded one)."""
    for field, make in FIELDS.items():
        if value == 1e300 and field in UNBOUNDED_ABOVE:
            continue
        with pytest.raises((ValueError, TypeError)) as e:
            make(value)
        assert field in str(e.value), (field, value, str(e.value))


@pytest.mark.parametrize("value", [10**400, -(10**400), 10**5000], ids=["1e400", "-1e400", "1e5000"])
def test_an_int_too_large_for_a_float_is_out_of_range_naming_the_field(value: int) -> None:
    """``math.isfinite(10**400)`` raises ``OverflowError: int too large to convert to float``: every field
    says "out of range" in its own words instead (and never prints thousands of digits)."""
    for field, make in FIELDS.items():
        try:
            make(value)
        except (ValueError, TypeError) as e:
            assert field in str(e) and len(str(e)) < 300 and "\n" not in str(e), (field, str(e))
        else:
            # an int field without an upper bound takes it
            assert field in UNBOUNDED_ABOVE and value > 0, field


@pytest.mark.parametrize("field", ["max_retries_failure", "max_retries_preemption"])
def test_retry_budgets_have_an_upper_bound(field: str) -> None:
    """``10**30`` was accepted and written to the record as text."""
    assert getattr(JobRequest(name="x", entrypoint=_entry(), **{field: MAX_RETRIES}), field) == MAX_RETRIES
    for value in (MAX_RETRIES + 1, 10**30, 10**5000):
        with pytest.raises(ValueError, match=rf"^JobRequest\.{field}: at most 1,000,000 retries allowed, got ") as e:
            JobRequest(name="x", entrypoint=_entry(), **{field: value})
        assert len(str(e.value)) < 200


@pytest.mark.parametrize("step", [10**19, 10**30, -5, -1], ids=["1e19", "1e30", "-5", "-1"])
def test_heartbeat_refuses_a_step_no_record_holds(step: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``heartbeat(10**30)`` made the job's record unreadable (``fray status`` exit 2, wait raising RecordError)."""
    import fray_core
    from fray_core import records

    monkeypatch.setenv("FRAY_HEARTBEAT_FILE", str(tmp_path / "beats"))  # as in a job: the check is not skipped
    with pytest.raises(
        ValueError, match=r"^heartbeat\(step\): expected an int >= 0 \(at most 9,999,999,999,999,999,999\)"
    ):
        fray_core.heartbeat(step)
    with pytest.raises(TypeError, match=r"^heartbeat\(step\): expected an int or None, got True"):
        fray_core.heartbeat(True)  # type: ignore[arg-type]
    assert fray_core.hostapi.MAX_STEP == 10**records.MAX_INT_DIGITS - 1
    assert records.loads_record(f'{{"last_step": {fray_core.hostapi.MAX_STEP}}}'.encode(), "x")


@pytest.mark.parametrize("sizes", ["ram", "disk"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, True, "lots"])
def test_sizes_reject_bad_values(sizes: str, value: object) -> None:
    with pytest.raises((ValueError, TypeError), match=f"ResourceConfig.{sizes}"):
        ResourceConfig(**{sizes: value})


def _timeout_calls(cluster: LocalCluster, value: object) -> dict[str, Callable[[], object]]:
    """Every call of a cluster that takes a timeout, given ``value`` for it, by the field its error names."""
    return {
        "wait: timeout": lambda: cluster.wait("no-such-job", timeout=value),
        "monitor: timeout": lambda: cluster.monitor("no-such-job", timeout=value),
        "hold: timeout": lambda: cluster.hold(ResourceConfig(), timeout=value),
        "get: timeout": lambda: LocalJobContext.shared().get(1, timeout=value),
    }


@settings(max_examples=60, deadline=None)
@given(value=BAD_NUMBERS.filter(lambda v: v is not None))
def test_every_timeout_of_every_cluster_is_checked(tmp_path_factory: pytest.TempPathFactory, value: object) -> None:
    for what, call in _timeout_calls(_shared_cluster(tmp_path_factory), value).items():
        with pytest.raises((ValueError, TypeError)) as e:
            call()
        assert what in str(e.value), str(e.value)


@pytest.mark.parametrize("job_ids", [123, [1], b"job", None, ["a", 2]])
def test_wait_names_job_ids_when_they_are_not_ids(tmp_path_factory: pytest.TempPathFactory, job_ids: object) -> None:
    """``wait(123)``: the field and what it takes, not a TypeError from inside the loop."""
    with pytest.raises(TypeError, match=r"wait: job_ids: expected a job id \(str\) or a list of job ids, got"):
        _shared_cluster(tmp_path_factory).wait(job_ids)  # type: ignore[arg-type]


_CLUSTERS: dict[str, LocalCluster] = {}


def _shared_cluster(factory: pytest.TempPathFactory) -> LocalCluster:
    if "c" not in _CLUSTERS:
        _CLUSTERS["c"] = LocalCluster(jobs_dir=str(factory.mktemp("jobs")), retry_policy=TEST_POLICY)
    return _CLUSTERS["c"]


@pytest.fixture(scope="module", autouse=True)
def _close_shared_cluster() -> Iterator[None]:
    yield
    for c in _CLUSTERS.values():
        c.close()


@pytest.mark.parametrize("value", [10**400, 10**5000], ids=["1e400", "1e5000"])
def test_every_timeout_of_every_cluster_refuses_an_int_too_large_for_a_float(
    tmp_path_factory: pytest.TempPathFactory, value: int
) -> None:
    """Was ``OverflowError: int too large to convert to float`` from ``math.isfinite``."""
    for what, call in _timeout_calls(_shared_cluster(tmp_path_factory), value).items():
        with pytest.raises(ValueError, match=rf"^{what}: expected a finite number of seconds .*, got an int of") as e:
            call()
        assert len(str(e.value)) < 200


def test_good_timeouts_still_work(cluster: LocalCluster) -> None:
    job_id = cluster.launch(JobRequest(name="t", entrypoint=_entry()))
    assert cluster.wait(job_id, timeout=60).status == JobStatus.SUCCEEDED
    assert cluster.wait(job_id, timeout=0).status == JobStatus.SUCCEEDED  # 0: look once
    assert RetryPolicy(schedule_timeout=0.0, backoff_initial=0).schedule_timeout == 0.0
    ctx = LocalJobContext.shared()
    assert ctx.get(ctx.run(abs, -3), timeout=10) == 3


# ----------------------------------------------------------------------- 3. sizes and names, bounded


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ResourceConfig(replicas=10**18), "at most 10,000 processes per job"),
        (lambda: ResourceConfig(device=TPU, replicas=10**7), "at most 10,000 slices per TPU job"),
        (lambda: ResourceConfig(device=TPU, replicas=[1, MAX_REPLICAS + 1]), "at most 10,000 slices"),
        (lambda: ResourceConfig(device=TpuConfig(type="v4-4096"), replicas=1000), "host processes; at most 100,000"),
        (lambda: JobRequest(name="n" * 20_000_000, entrypoint=_entry()), "JobRequest.name: at most 1024 characters"),
        (lambda: TpuFleet({"v4-16": 99_999_999}), "at most 10,000 slices of v4-16"),
        (lambda: TpuFleet({"v4-16": 10**5000}), "at most 10,000 slices of v4-16 .* asked for an int of about 5,001"),
        # 10**9 draws: 90 s before the limit; the faults of one plan, or the draws of chaos, at most MAX_FAULTS
        (
            lambda: FaultPlan.chaos(seed=1, rate=0.0, attempts=100_000, max_slices=10_000),
            r"^FaultPlan\.chaos: attempts x max_slices is 100,000 x 10,000 = 1,000,000,000 draws; at most 100,000",
        ),
        (
            lambda: FaultPlan([PreemptSlice(attempt=0)] * (MAX_FAULTS + 1)),
            r"^FaultPlan\.faults: at most 100,000 faults allowed, got 100,001$",
        ),
        (
            lambda: GpuConfig(count=10**30),
            r"^GpuConfig\.count: at most 1,024 GPUs per process allowed, got an int of 31",
        ),
        (
            lambda: GpuConfig(count=MAX_GPUS + 1),
            r"^GpuConfig\.count: at most 1,024 GPUs per process allowed, got 1025$",
        ),
        (
            lambda: ResourceConfig(cpu=1e300),
            r"^ResourceConfig\.cpu: at most 100,000 CPUs per process allowed, got 1e\+300",
        ),
        (
            lambda: GpuConfig(type="A" * 20_000_000),
            r"^GpuConfig\.type: at most 1024 characters allowed, got 20,000,000",
        ),
    ],
)
def test_sizes_and_names_above_the_limits_fail_at_once(make: object, message: str) -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match=message) as e:
        make()  # type: ignore[operator]
    assert time.monotonic() - start < 2.0  # not after building 10**7 of anything
    assert "\n" not in str(e.value)


def test_sizes_at_the_limits_are_accepted() -> None:
    assert ResourceConfig(replicas=MAX_REPLICAS).replicas == MAX_REPLICAS
    assert ResourceConfig(device=TPU, replicas=[MAX_REPLICAS, 1]).replica_counts
    v4_128 = TpuConfig(type="v4-128")  # 16 hosts a slice
    assert ResourceConfig(device=v4_128, replicas=MAX_HOSTS_PER_JOB // 16).replicas == MAX_HOSTS_PER_JOB // 16
    assert len(JobRequest(name="n" * MAX_NAME_LENGTH, entrypoint=_entry()).name) == MAX_NAME_LENGTH
    fleet = TpuFleet({"v4-16": MAX_FLEET_SLICES})
    try:
        with pytest.raises(ValueError, match="at most 10,000 slices of v4-16"):
            fleet.model.add_slices("v4-16", 1)
    finally:
        fleet.close()
    assert len(FaultPlan([PreemptSlice(attempt=0)] * MAX_FAULTS).faults) == MAX_FAULTS
    assert len(FaultPlan.chaos(seed=1, rate=1.0, attempts=MAX_FAULTS // 8, max_slices=8).faults) == MAX_FAULTS
    assert GpuConfig(count=MAX_GPUS).count == MAX_GPUS
    assert ResourceConfig(cpu=MAX_CPUS).cpu == MAX_CPUS


def test_a_fault_plan_reads_no_more_of_a_generator_than_its_limit() -> None:
    """``FaultPlan(generator)`` was ``tuple(generator)``: an endless one never returned."""
    read = 0

    def faults() -> Iterator[PreemptSlice]:
        nonlocal read
        for _ in range(10 * MAX_FAULTS):
            read += 1
            yield PreemptSlice(attempt=0)

    with pytest.raises(ValueError, match=r"^FaultPlan\.faults: at most 100,000 faults allowed, got more$"):
        FaultPlan(faults())
    assert read == MAX_FAULTS + 1


@settings(max_examples=200, deadline=None)
@given(attempts=st.integers(0, 2 * MAX_FAULTS), max_slices=st.integers(0, 2 * MAX_FLEET_SLICES))
def test_chaos_is_refused_exactly_when_its_plan_could_exceed_the_limit(attempts: int, max_slices: int) -> None:
    """Accepted iff every fault it may draw (one per slice per attempt, ``rate=1``) fits in one plan."""
    fits = attempts * max_slices <= MAX_FAULTS and attempts <= MAX_FAULTS and max_slices <= MAX_FLEET_SLICES
    start = time.monotonic()
    try:
        plan = FaultPlan.chaos(seed=0, rate=0.0, attempts=attempts, max_slices=max_slices)
    except ValueError as e:
        assert not fits, str(e)
        assert str(e).startswith("FaultPlan.chaos: ") and "at most" in str(e) and "\n" not in str(e), str(e)
    else:
        assert fits and plan.faults == ()
    assert time.monotonic() - start < 5.0


def test_a_busy_poll_interval_and_a_huge_session_name_are_refused(cluster: LocalCluster) -> None:
    """``RetryPolicy(poll_interval=0)`` burnt a core (0 is no bad number for most fields, so the property
    test above does not try it); a session's name has the job name's limit, checked before anything starts."""
    for spin in (0, 0.0, 0.001):
        with pytest.raises(ValueError, match=r"^RetryPolicy.poll_interval: expected .* >= 0.01 .*, got 0"):
            RetryPolicy(poll_interval=spin)
    with pytest.raises(ValueError, match=r"^hold: name: at most 1024 characters allowed, got 20,000,000") as e:
        cluster.hold(ResourceConfig(), name="n" * 20_000_000, timeout=5)
    assert "\n" not in str(e.value) and len(str(e.value)) < 200
    assert cluster.list_jobs() == []  # nothing was launched


def test_a_huge_fleet_spec_is_one_line_exit_2(tmp_path: Path) -> None:
    env = _env(FRAY_JOBS_DIR=str(tmp_path / "jobs"), FRAY_CLUSTER_SPEC="local?tpu=v4-16:99999999")
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "fray_core.cli", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "at most 10,000 slices of a type" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert time.monotonic() - start < 20


# ------------------------------------------------------------------ 4. output in bounded memory, last line kept


def _shown(line: str) -> str:
    """What a terminal shows of a line rewritten with '\\r' (the last non-empty state)."""
    states = [s for s in line.split("\r") if s]
    return states[-1] if states else ""


def _reference(text: str) -> list[str]:
    *lines, rest = text.split("\n")
    return [_shown(x) for x in lines] + ([_shown(rest)] if rest else [])


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet="ab\r\n", max_size=60), cuts=st.lists(st.integers(0, 60), max_size=8))
def test_line_splitter_logs_what_a_terminal_shows_whatever_the_chunks(text: str, cuts: list[int]) -> None:
    data = text.encode()
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    splitter = LineSplitter(progress_interval=float("inf"))  # no progress lines mid-line: chunking must not matter
    out: list[str] = []
    for a, b in zip(bounds, bounds[1:]):
        out += splitter.feed(data[a:b], now=0.0)
    out += splitter.close()
    assert out == _reference(text)


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"\r")), max_size=30))
def test_line_splitter_memory_is_bounded_without_any_newline(chunks: list[bytes]) -> None:
    splitter = LineSplitter(max_line=8, progress_interval=0.0)
    for i, chunk in enumerate(chunks):
        for line in splitter.feed(chunk, now=float(i)):
            assert len(line.encode("utf-8", "surrogateescape")) <= 8 * 3  # a replaced byte is 3 bytes of U+FFFD
        assert len(splitter._cur) <= 8 and len(splitter._prog or b"") <= 8


LAUNCHER = r"""
import resource, sys
from fray_core import Entrypoint, JobRequest
from fray_local import LocalCluster
from fray_local.testing import TEST_POLICY

mb = int(sys.argv[2])
# tqdm-like: 100-byte states separated by '\r', never a newline, then a last line without '\n'
prog = ("import sys; w = sys.stdout.buffer.write; b = b'\\r' + b'#' * 99; "
        f"[w(b * 10000) for _ in range({mb})]; w(b'\\rfinal line')")
cluster = LocalCluster(jobs_dir=sys.argv[1], retry_policy=TEST_POLICY)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
job = cluster.launch(JobRequest(name="tqdm", entrypoint=Entrypoint.from_binary(sys.executable, ["-c", prog])))
info = cluster.wait(job, timeout=600)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
lines = list(cluster.logs(job))
cluster.close()
print(info.status.value, (after - before) // 1024, len(lines), repr(lines[-1][-40:]))
"""


@linux_only
def test_progress_bars_without_newlines_take_bounded_memory_and_the_last_line_is_kept(tmp_path: Path) -> None:
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    r = subprocess.run(
        [sys.executable, str(tmp_path / "launcher.py"), str(tmp_path / "jobs"), "200"],  # 200 MB of output
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    status, grew_mib, n_lines, last = r.stdout.split(maxsplit=3)
    assert status == "SUCCEEDED"
    assert int(grew_mib) < 60, f"the launcher's peak RSS grew by {grew_mib} MiB for 200 MB of '\\r' output"
    assert "final line" in last, last
    assert int(n_lines) < 1000  # progress states logged now and then, not 2 million of them


RAY_HOST_PUMP = r"""
import json, os, resource, sys
from fray_ray._host import _LogPump, _run_binary

mb, out = int(sys.argv[1]), sys.argv[2]
prog = ("import sys; w = sys.stdout.buffer.write; b = b'\\r' + b'#' * 99; "
        f"[w(b * 10000) for _ in range({mb})]; w(b'\\rfinal line\\n')")
import ray  # the pump imports it to send its lines: not what is measured
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
pump = _LogPump("a0 s0/h0", None)  # no supervisor: the lines stay in the pump (bounded), as when it is behind
_run_binary([sys.executable, "-c", prog], "here", pump)  # a binary: the worker relays its output
w = os.write
[w(1, (b"\r" + b"#" * 99) * 10000) for _ in range(mb)]  # a callable: the worker's own fd 1
w(1, b"\rlast words")  # no newline: kept when the pump closes
pump.close()
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
with open(out, "w") as f:
    json.dump({"grew_mib": grew, "pending": len(pump._pending), "tail": list(pump.tail)[-3:]}, f)
"""


@linux_only
def test_a_ray_host_relays_progress_bars_in_bounded_memory(tmp_path: Path) -> None:
    """The Ray backend's host reads its output a line at a time: 100 MB of '\r' states and no newline was
    one 100 MB line in the worker (twice for a binary: relayed, then pumped), and one 100 MB log line sent
    to the supervisor. No cluster is needed: the pump and the relay are plain processes and pipes."""
    out = tmp_path / "out.json"
    r = subprocess.run(
        [sys.executable, "-c", RAY_HOST_PUMP, "100", str(out)],  # 100 MB from a binary, 100 MB from fd 1
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads(out.read_text())
    assert m["grew_mib"] < 60, f"the Ray host's peak RSS grew by {m['grew_mib']} MiB for 2 x 100 MB of '\\r' output"
    assert m["pending"] < 100, m["pending"]  # progress states now and then, not one per '\r'
    assert m["tail"][-2:] == ["final line", "last words"], m["tail"]


class _SlowSink(LogSink):
    """A log that takes 5 ms a line, as a loaded machine might: the pump falls behind the host."""

    def write(self, tag: str, line: str) -> None:
        time.sleep(0.005)
        super().write(tag, line)


@linux_only
def test_a_pump_behind_its_host_loses_no_line(tmp_path: Path) -> None:
    sink = _SlowSink(str(tmp_path / "log"))
    ended = threading.Event()
    host = HostProcess("h0", sink, ended.set)
    n = 700  # 3.5 s of writing: longer than DRAIN_GRACE after the host has exited
    code = f"print('\\n'.join(f'line {{i}}' for i in range({n})), end='')"
    host.start([sys.executable, "-c", code], dict(os.environ), str(tmp_path))
    assert ended.wait(60)
    sink.close()
    log = (tmp_path / "log").read_text().splitlines()
    assert "still held by another process" not in "\n".join(log)
    assert log[-1] == f"[h0] line {n - 1}" and len(log) == n  # every line, the last one (no newline) too


# ------------------------------------------------------------- 5. a session listener under a flood of silent peers

FLOOD_OWNER = r"""
import json, os, resource, subprocess, sys, threading, time
from multiprocessing.connection import Client
from fray_core import session as S

resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
core = S._Core(None, False, "tcp")
core.address = ("127.0.0.1", core.address[1])
flood = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(core.address[1])], stdout=subprocess.PIPE, text=True)
assert flood.stdout.readline().strip() == "flooding"
time.sleep(1.0)  # the flood is under way
cpu0, t0 = time.process_time(), time.monotonic()
peak_threads = peak_fds = 0
stop = threading.Event()
def sample():
    global peak_threads, peak_fds
    while not stop.wait(0.05):
        peak_threads = max(peak_threads, threading.active_count())
        peak_fds = max(peak_fds, len(os.listdir("/proc/self/fd")))
threading.Thread(target=sample, daemon=True).start()
start = time.monotonic()
conn = Client(core.address, family="AF_INET", authkey=core.authkey)  # a real worker, in the middle of it
conn.send(("hello", {"attempt": 0, "slice": 0, "host": 0, "replicas": 1, "pid": os.getpid()}))
with core.cond:
    registered = core.cond.wait_for(lambda: core.workers.get(0), timeout=20)
joined = time.monotonic() - start
time.sleep(2.0)
stop.set()
cpu = (time.process_time() - cpu0) / (time.monotonic() - t0)
made = int(flood.stdout.readline() or 0)
flood.kill(); flood.wait()
conn.close(); core.close()
print(json.dumps({"registered": bool(registered), "joined_s": joined, "threads": peak_threads, "fds": peak_fds,
                  "cpu": cpu, "flood": made}))
"""

FLOODER = r"""
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
port, held = int(sys.argv[1]), []
print("flooding", flush=True)
end = time.monotonic() + 5.0
while time.monotonic() < end and len(held) < 1100:  # 1,100 silent connections, or 5 s of trying
    s = socket.socket()
    s.settimeout(0.2)
    try:
        s.connect(("127.0.0.1", port))
        held.append(s)
    except OSError:
        s.close()
print(len(held), flush=True)
time.sleep(60)
"""


@linux_only
def test_a_flood_of_silent_connections_holds_up_only_itself() -> None:
    r = subprocess.run(
        [sys.executable, "-c", FLOOD_OWNER, FLOODER], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    print(m)
    assert m["registered"] and m["joined_s"] < 5.0, m  # the real worker got in, during the flood
    assert m["threads"] < 200 and m["fds"] < 400, m  # bounded: not one thread and fd per silent peer
    assert m["cpu"] < 0.5, m  # no core burnt on the flood


# ------------------------------------------------------------------- 6. durations from a monotonic clock


YEAR = 365 * 86400.0


@pytest.mark.parametrize("jump", [-YEAR, YEAR, -60.0])
def test_a_wall_clock_jump_changes_no_duration_and_no_goodput(jump: float) -> None:
    clock = FakeClock()
    offset = [0.0]

    def script(attempt: int, s: int, h: int) -> object:
        if attempt == 1:
            offset[0] = jump  # the system clock is set back (or forward) while attempt 1 starts its hosts
        return HostScript("PREEMPTED", after=2.0) if attempt == 0 else HostScript("SUCCEEDED", after=3.0)

    provider = InMemorySliceProvider({"v4-16": 2}, clock, script=script)
    provider.preempt("v4-16-1", restore_after=4.0)
    request = JobRequest(
        name="job",
        entrypoint=Entrypoint(binary="train"),
        resources=ResourceConfig.with_tpu("v4-16", slice_count=2),
        max_retries_preemption=10,
    )
    policy = RetryPolicy(backoff_initial=5.0, schedule_timeout=10.0, poll_interval=1.0, cancel_grace=1.0)
    runner = GangRunner(
        "job-1", request, provider, policy=policy, clock=clock, wall=lambda: clock.wall() + offset[0], sleep=clock.sleep
    )
    assert runner.run().status is JobStatus.SUCCEEDED
    info = runner.info
    assert [a.ended_at - a.started_at for a in info.attempts] == [6.0, 3.0]  # type: ignore[operator]
    assert info.goodput == Goodput(
        pending_s=9.0,
        productive_s=3.0,
        lost_s=2.0,
        pending_chip_s=9.0 * 16,
        productive_chip_s=3.0 * 16,
        lost_chip_s=2.0 * 16,
    )
    assert info.finished_at - info.submitted_at == 14.0  # type: ignore[operator]


# ------------------------------------------------------------ 7. session results that do not pickle, with context


def _rebuild_fails() -> None:
    raise TypeError("cannot rebuild Unloadable in this process")


class Unloadable:
    """Pickles on the host; unpickling it (in the caller) fails."""

    def __reduce__(self) -> tuple:
        return (_rebuild_fails, ())


def unloadable() -> Unloadable:
    return Unloadable()


def holds_a_lock() -> object:
    return threading.Lock()


def test_a_session_result_that_cannot_be_unpickled_names_the_session_call_and_host(cluster: LocalCluster) -> None:
    from fray_core.session import RemoteCallError

    with cluster.hold(ResourceConfig(replicas=2), timeout=60) as session:
        with pytest.raises(RemoteCallError) as e:
            session.run(unloadable)
        msg = str(e.value)
        assert isinstance(e.value, TypeError)  # ``except TypeError`` still catches it
        assert session.job_id in msg and "slice 0 host 0" in msg and "unloadable" in msg and "call 0" in msg, msg
        assert session.run(abs, -2) == [2, 2]  # only the caller could not read it: the session goes on
        with pytest.raises(TypeError) as bad_arg:
            session.run(abs, threading.Lock())
        assert session.job_id in str(bad_arg.value) and "cannot be pickled" in str(bad_arg.value)


def test_a_session_result_that_cannot_be_pickled_names_the_session_call_and_host(cluster: LocalCluster) -> None:
    from fray_core.session import RemoteCallError

    with cluster.hold(ResourceConfig(replicas=1), timeout=60) as session:
        with pytest.raises(RemoteCallError) as e:
            session.run(holds_a_lock)
        msg = str(e.value)
        assert session.job_id in msg and "slice 0 host 0" in msg and "holds_a_lock" in msg, msg
        assert "cannot be pickled" in msg, msg


# ------------------------------------------------------------------- 8. the limits, as docs/troubleshooting.md says


def test_the_limits_at_a_glance_say_what_the_code_does() -> None:
    """Each row of troubleshooting.md's "Every limit, at a glance" that names a constant gives its value:
    a constant changed without its row (or a row written from memory) fails here."""
    from fray_core import _lines, limits, records, request, session
    from fray_local import _proc
    from fray_ray import _host as ray_host  # imports no ray

    text = (REPO / "docs" / "troubleshooting.md").read_text()
    table = text.split("## Every limit, at a glance\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    mib, kib = 1 << 20, 1 << 10
    documented = [  # (constant as the row names it, its value, the value the row must say, how the row says it)
        ("MAX_REPLICAS", limits.MAX_REPLICAS, 10_000, "| 10,000 |"),
        ("MAX_HOSTS_PER_JOB", limits.MAX_HOSTS_PER_JOB, 100_000, "| 100,000 |"),
        ("MAX_FLEET_SLICES", limits.MAX_FLEET_SLICES, 10_000, "| 10,000 |"),
        ("MAX_NAME_LENGTH", limits.MAX_NAME_LENGTH, 1024, "| 1,024 |"),
        ("MAX_SECONDS", limits.MAX_SECONDS, 1e9, "| 1e9 s"),
        ("MAX_RETRIES", limits.MAX_RETRIES, 1_000_000, "| 1,000,000 |"),
        ("MAX_CPUS", limits.MAX_CPUS, 100_000, "| 100,000 |"),
        ("MAX_GPUS", limits.MAX_GPUS, 1024, "| 1,024 |"),
        ("MAX_FAULTS", limits.MAX_FAULTS, 100_000, "| 100,000 |"),
        ("GUARDIAN_SILENCE", _proc.GUARDIAN_SILENCE, 30.0, "| 30 s when it is stopped"),
        ("GUARDIAN_SILENCE_MAX", _proc.GUARDIAN_SILENCE_MAX, 600.0, "600 s in any state |"),
        ("MIN_POLL_INTERVAL", limits.MIN_POLL_INTERVAL, 0.01, "| at least 0.01 s |"),
        ("MAX_SIZE", request.MAX_SIZE, 1024 << 50, "| 1024p (1 EiB) |"),
        ("MAX_RECORD_BYTES", records.MAX_RECORD_BYTES, 16 * mib, "| 16 MiB |"),
        ("MAX_JSON_DEPTH", records.MAX_JSON_DEPTH, 64, "| 64 levels |"),
        ("MAX_INT_DIGITS", records.MAX_INT_DIGITS, 19, "| 19 digits |"),
        ("MAX_FLOAT", records.MAX_FLOAT, 1e15, "below 1e15 |"),
        ("MAX_FIELD_CHARS", records.MAX_FIELD_CHARS, 65_536, "| 65,536 characters |"),
        ("INCOMPLETE_GRACE", records.INCOMPLETE_GRACE, 30.0, "| 30 s |"),
        ("NEW_JOB_TRIES", records.NEW_JOB_TRIES, 8, "| 8 |"),
        ("RESERVE_BYTES", records.RESERVE_BYTES, 256 * kib, "| 256 KiB, "),
        ("FINAL_WRITE_DEADLINE", records.FINAL_WRITE_DEADLINE, 10.0, ", 10 s of trying |"),
        ("MAX_LINE_BYTES", _lines.MAX_LINE_BYTES, 64 * kib, "| 64 KiB |"),
        ("PROGRESS_INTERVAL", _lines.PROGRESS_INTERVAL, 5.0, "every 5 s at most"),
        ("DRAIN_MAX", _proc.DRAIN_MAX, 60.0, "up to 60 s"),
        ("DRAIN_GRACE", _proc.DRAIN_GRACE, 2.0, "after 2 s is not logged"),
        ("_TAIL_LINES", _proc._TAIL_LINES, 20, "the last 20 lines"),
        ("_TAIL_LINE_CHARS", _proc._TAIL_LINE_CHARS, 4096, "cut at 4,096 characters"),
        ("LOG_PENDING_MAX", ray_host.LOG_PENDING_MAX, 20_000, "| 20,000 |"),
        ("MAX_LOG_LINE", records.MAX_LOG_LINE, mib, "| 1 MiB |"),
        ("LOG_CHUNK", records.LOG_CHUNK, mib, "| 1 MiB at a time"),
        ("MAX_HANDSHAKES", session.MAX_HANDSHAKES, 128, "| 128 at once"),
        ("HANDSHAKE_TIMEOUT", session.HANDSHAKE_TIMEOUT, 5.0, "5 s each"),
        ("HANDSHAKE_EVICT_AFTER", session.HANDSHAKE_EVICT_AFTER, 1.0, "has had 1 s"),
    ]
    assert _proc._TAIL_LINES == ray_host._TAIL_LINES  # one row says both backends' tail
    for name, value, said, how in documented:
        assert value == said, f"{name} is {value!r}: update its row in troubleshooting.md and this test"
        [row] = [r for r in rows if f"`{name}`" in r or f".{name}`" in r]
        assert how in row, (name, how, row)

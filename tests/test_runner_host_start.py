"""The runner's view of host start (backend-neutral): with a provider that reports which hosts have started
(``started_runs``), a job is RUNNING only once every host of the attempt started, the progress says how
many did, ``Attempt.hosts_started_at`` records when, and an attempt whose hosts do not all start within
``RetryPolicy.host_start_timeout`` is PREEMPTED (its slice is taken as lost). A provider whose
``started_runs`` cannot tell (the base class's default, ``None``) counts its hosts started when ``start``
returns. Hosts a provider says its backend queues (``queued``: a lease that reserves nothing) keep the job
PENDING with the reason, outside the start timeout, and fail it only when they can never be placed. On a
fake clock: no processes, no sleeps."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence

import attrs
import hypothesis
import hypothesis.strategies as st
import pytest

from fray_core.errors import Unschedulable
from fray_core.provider import Heartbeat
from fray_core.runner import (
    GangRunner,
    HostOutcome,
    HostOutcomeKind,
    HostRun,
    HostSpec,
    RetryPolicy,
    SliceLease,
    SliceProvider,
)
from fray_core.types import Entrypoint, JobInfo, JobRequest, JobStatus, ResourceConfig

POLICY = RetryPolicy(
    backoff_initial=0.0, schedule_timeout=10.0, poll_interval=1.0, cancel_grace=2.0, host_start_timeout=30.0
)


@attrs.define
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@attrs.define(eq=False)
class ScriptedProvider(SliceProvider):
    """One v4-16 slice per attempt; ``step(provider, t)`` runs before every ``wait_any`` (time ``t``) and
    may mark hosts started (``started``) or ended (``ended``: run key -> kind)."""

    clock: Clock
    step: Callable[[ScriptedProvider, float], None]
    started: set[tuple[int, int, int]] = attrs.field(factory=set)  # (attempt, slice, host)
    ended: dict[tuple[int, int, int], HostOutcomeKind] = attrs.field(factory=dict)
    cancelled: set[tuple[int, int, int]] = attrs.field(factory=set)
    released: list[str] = attrs.field(factory=list)
    attempt: int = -1

    def acquire(self, resources: ResourceConfig, counts: Sequence[int], deadline: float) -> list[SliceLease]:
        self.attempt += 1
        return [
            SliceLease(
                name=f"slice-{self.attempt}", device_type="v4-16", hosts=2, host_addresses=("10.0.0.1", "10.0.0.2")
            )
        ]

    def start(self, lease: SliceLease, hosts: list[HostSpec], entrypoint: Entrypoint) -> list[HostRun]:
        return [HostRun(lease, 0, h, handle=(self.attempt, 0, h)) for h in range(lease.hosts)]

    def wait_any(self, runs: list[HostRun], timeout: float) -> list[HostOutcome]:
        self.step(self, self.clock.now)
        self.clock.now += timeout
        out = []
        for r in runs:
            if r.handle in self.cancelled:
                out.append(HostOutcome(r, HostOutcomeKind.CANCELLED))
            elif r.handle in self.ended:
                out.append(HostOutcome(r, self.ended[r.handle], result=r.handle[2]))
        return out

    def cancel(self, runs: list[HostRun], grace: float | None = None) -> None:
        self.cancelled.update(r.handle for r in runs)

    def release(self, leases: list[SliceLease]) -> None:
        self.released.extend(lease.name for lease in leases)


@attrs.define(eq=False)
class Reporting(ScriptedProvider):
    def started_runs(self, runs: list[HostRun]) -> list[HostRun]:
        return [r for r in runs if r.handle in self.started]


def run(provider: ScriptedProvider, preemptions: int = 1) -> tuple[JobInfo, list[tuple[str, str | None]]]:
    seen: list[tuple[str, str | None]] = []
    request = JobRequest(
        name="job",
        entrypoint=Entrypoint(binary="train"),
        resources=ResourceConfig.with_tpu("v4-16"),
        max_retries_preemption=preemptions,
    )
    runner = GangRunner(
        "job-1",
        request,
        provider,
        policy=POLICY,
        clock=provider.clock,
        wall=provider.clock,
        sleep=lambda s: None,
        on_change=lambda info: seen.append((info.status.value, info.progress)),
    )
    runner.run()
    return runner.info, seen


def test_running_only_once_every_host_reported_in_and_the_progress_says_how_many() -> None:
    def step(p: ScriptedProvider, t: float) -> None:
        if t == 3.0:
            p.started.add((0, 0, 1))
        if t == 6.0:
            p.started.add((0, 0, 0))
        if t == 9.0:
            p.ended.update({(0, 0, 0): HostOutcomeKind.SUCCEEDED, (0, 0, 1): HostOutcomeKind.SUCCEEDED})

    info, seen = run(Reporting(Clock(), step))
    assert info.status == JobStatus.SUCCEEDED and info.result == [0, 1]
    assert seen[seen.index(("PENDING", "attempt 0: 1 of 2 hosts started on slice-0")) - 1] == (
        "PENDING",
        "attempt 0: starting 2 hosts on slice-0",
    )
    assert ("RUNNING", "attempt 0: running on slice-0") in seen
    assert all(status == "PENDING" for status, _ in seen[: seen.index(("RUNNING", "attempt 0: running on slice-0"))])
    assert info.attempts[0].hosts_started_at == 7.0  # noticed after the wait in which the last host reported


def test_hosts_that_never_start_end_the_attempt_as_preempted_at_the_start_deadline() -> None:
    def step(p: ScriptedProvider, t: float) -> None:
        if p.attempt == 0:
            p.started.add((0, 0, 0))  # host 1 of attempt 0 never starts (its node is gone)
        else:
            p.started.update({(1, 0, 0), (1, 0, 1)})
            p.ended.update({(1, 0, 0): HostOutcomeKind.SUCCEEDED, (1, 0, 1): HostOutcomeKind.SUCCEEDED})

    provider = Reporting(Clock(), step)
    info, seen = run(provider)
    assert info.status == JobStatus.SUCCEEDED and info.preemptions == 1 and info.failures == 0
    first = info.attempts[0]
    assert first.outcome.value == "PREEMPTED" and first.hosts_started_at is None
    assert (
        "host start timed out: 1 of 2 hosts had not started 30 s after" in first.cause
        and "slice 0 (slice-0) host 1" in first.cause
    )
    assert first.ended_at - first.started_at >= POLICY.host_start_timeout
    assert {(0, 0, 0), (0, 0, 1)} <= provider.cancelled and provider.released == ["slice-0", "slice-1"]
    assert ("RUNNING", "attempt 0: running on slice-0") not in seen


def test_a_provider_that_cannot_tell_counts_hosts_started_when_start_returned() -> None:
    def step(p: ScriptedProvider, t: float) -> None:
        p.ended.update({(0, 0, 0): HostOutcomeKind.SUCCEEDED, (0, 0, 1): HostOutcomeKind.SUCCEEDED})

    info, seen = run(ScriptedProvider(Clock(), step))
    assert info.status == JobStatus.SUCCEEDED and info.attempts[0].hosts_started_at == 0.0
    assert seen[1:3] == [
        ("PENDING", "attempt 0: starting 2 hosts on slice-0"),
        ("RUNNING", "attempt 0: running on slice-0"),
    ]


def test_the_attempt_record_keeps_when_its_hosts_were_up() -> None:
    from fray_core.types import Attempt

    a = Attempt(index=0, started_at=1.0, hosts_started_at=2.5)
    assert Attempt.from_json(a.to_json()) == a
    assert Attempt.from_json({"index": 0}).hosts_started_at is None  # records written before the field


# ------------------------------------------------------------------------------ hosts the backend queues


@attrs.define(eq=False)
class Queueing(Reporting):
    """A provider whose leases reserve nothing: its hosts wait in the backend's queue until ``placed_at``
    (then start at once), as a plain Ray task does (``SliceProvider.queued``); ``room_gone_at``: from then
    the backend can never place them."""

    placed_at: float = 0.0
    room_gone_at: float | None = None
    asked: list[float] = attrs.field(factory=list)

    def heartbeats(self, runs: Sequence[HostRun]) -> dict[HostRun, Heartbeat]:
        return {}  # no host has beaten yet: a startup timeout that counted the queue would end the attempt

    def queued(self, runs: list[HostRun]) -> str | None:
        self.asked.append(self.clock.now)
        if self.room_gone_at is not None and self.clock.now >= self.room_gone_at:
            raise Unschedulable("no node has room for it any more", permanent=True)
        if self.clock.now < self.placed_at:
            return "waiting in the backend's queue for 2 x {CPU: 1}"
        return None


def _queued_step(p: ScriptedProvider, t: float) -> None:
    q = p
    assert isinstance(q, Queueing)
    if t >= q.placed_at:
        p.started.update({(p.attempt, 0, 0), (p.attempt, 0, 1)})
    if t >= q.placed_at + 5.0:
        p.ended.update({(p.attempt, 0, 0): HostOutcomeKind.SUCCEEDED, (p.attempt, 0, 1): HostOutcomeKind.SUCCEEDED})


def test_hosts_the_backend_queues_keep_the_job_pending_with_the_reason_past_the_start_timeout() -> None:
    """A queue holds nothing: the job is PENDING saying why for as long as the backend queues its hosts (here
    4x ``host_start_timeout``), spends no budget, and its attempt holds resources (goodput) only from when
    the hosts left the queue."""
    provider = Queueing(Clock(), _queued_step, placed_at=4 * POLICY.host_start_timeout)
    reasons: list[tuple[str, str | None]] = []
    request = JobRequest(
        name="job",
        entrypoint=Entrypoint(binary="train"),
        resources=ResourceConfig.with_tpu("v4-16"),
        startup_timeout=20,
    )
    runner = GangRunner(
        "job-1", request, provider, policy=POLICY, clock=provider.clock, wall=provider.clock, sleep=lambda s: None,
        on_change=lambda info: reasons.append((info.status.value, info.pending_reason)),
    )  # fmt: skip
    runner.run()
    info = runner.info
    assert info.status is JobStatus.SUCCEEDED and info.preemptions == 0 and info.failures == 0, info
    assert [a.outcome.value for a in info.attempts] == ["SUCCEEDED"]
    assert ("PENDING", "waiting in the backend's queue for 2 x {CPU: 1}") in reasons
    running = reasons.index(("RUNNING", None))
    assert all(status == "PENDING" for status, _ in reasons[:running])
    assert info.pending_reason is None
    a = info.attempts[0]
    assert a.acquired_at is not None and a.acquired_at >= provider.placed_at  # held from leaving the queue
    assert info.goodput is not None and info.goodput.pending_s >= provider.placed_at
    # the startup timeout (20 s; no host ever beats here, it ends 5 s after leaving the queue) did not count the
    # queue either: it would have stalled the attempt at 20 s
    assert [a.outcome.value for a in info.attempts] == ["SUCCEEDED"] and info.preemptions == 0
    assert provider.asked and max(provider.asked) <= provider.placed_at + POLICY.poll_interval


def test_hosts_the_backend_can_never_place_fail_the_job_as_unschedulable_not_forever() -> None:
    provider = Queueing(Clock(), _queued_step, placed_at=float("inf"), room_gone_at=50.0)
    info, _ = run(provider, preemptions=3)
    assert info.status is JobStatus.FAILED and info.preemptions == 0 and info.failures == 0, info
    assert [a.outcome.value for a in info.attempts] == ["UNSCHEDULABLE"]
    assert "no node has room for it any more" in (info.error or "")
    assert {(0, 0, 0), (0, 0, 1)} <= provider.cancelled and provider.released == ["slice-0"]
    assert info.pending_reason is None


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    placed=st.floats(min_value=0.0, max_value=2000.0),
    start_timeout=st.floats(min_value=1.0, max_value=100.0),
)
def test_a_queued_host_is_never_taken_as_lost_however_long_it_waits(placed: float, start_timeout: float) -> None:
    """Whatever the queue's length and the start timeout: no preemption, no failure, one attempt, and the
    job RUNNING only after the hosts left the queue."""
    provider = Queueing(Clock(), _queued_step, placed_at=placed)
    seen: list[tuple[str, float]] = []
    runner = GangRunner(
        "job-1",
        JobRequest(name="job", entrypoint=Entrypoint(binary="train"), resources=ResourceConfig.with_tpu("v4-16")),
        provider,
        policy=attrs.evolve(POLICY, host_start_timeout=start_timeout),
        clock=provider.clock,
        wall=provider.clock,
        sleep=lambda s: None,
        on_change=lambda info: seen.append((info.status.value, provider.clock.now)),
    )
    runner.run()
    info = runner.info
    assert info.status is JobStatus.SUCCEEDED and len(info.attempts) == 1, info
    assert info.preemptions == 0 and info.failures == 0
    assert all(t >= placed for status, t in seen if status == "RUNNING")


# ------------------------------------------------------------------- hosts the host's machine cannot start


@attrs.define(eq=False)
class StartFails(ScriptedProvider):
    """Every start fails with ``error``, as a provider that cannot write the attempt's files (a full $TMPDIR)."""

    error: Exception = attrs.field(factory=lambda: OSError(errno.ENOSPC, "No space left on device", "/tmp/x/entry.pkl"))
    starts: int = 0

    def start(self, lease: SliceLease, hosts: list[HostSpec], entrypoint: Entrypoint) -> list[HostRun]:
        self.starts += 1
        raise self.error


def _start_fails(error: Exception, failures: int = 0) -> tuple[JobInfo, StartFails]:
    provider = StartFails(Clock(), lambda p, t: None, error=error)
    request = JobRequest(
        name="job",
        entrypoint=Entrypoint(binary="train"),
        resources=ResourceConfig.with_tpu("v4-16"),
        max_retries_failure=failures,  # the preemption budget keeps its default: 100 retries
    )
    policy = attrs.evolve(POLICY, backoff_initial=1.0, backoff_max=60.0)
    runner = GangRunner(
        "job-1", request, provider, policy=policy, clock=provider.clock, wall=provider.clock,
        sleep=lambda s: setattr(provider.clock, "now", provider.clock.now + s),
    )  # fmt: skip
    runner.run()
    return runner.info, provider


def _wrapped_enospc() -> Exception:
    """A backend's own error raised from the OSError (the runner looks through the chain)."""
    try:
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/x/entry.pkl")
    except OSError as e:
        try:
            raise RuntimeError("cannot prepare the host's files") from e
        except RuntimeError as wrapped:
            return wrapped


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device", "/tmp/x/entry.pkl"),
        OSError(errno.EDQUOT, "Disk quota exceeded", "/tmp/x/entry.pkl"),
        OSError(errno.EROFS, "Read-only file system", "/tmp/x/entry.pkl"),
        _wrapped_enospc(),
    ],
    ids=["ENOSPC", "EDQUOT", "EROFS", "wrapped"],
)
def test_a_host_start_failing_on_the_machines_state_fails_the_job_at_once_naming_it(error: Exception) -> None:
    """A full disk when the hosts start is the machine's state, not a lost slice: the attempt is FAILED (not
    PREEMPTED), so the job ends after one attempt with the cause and the path, instead of retrying on the
    preemption budget for minutes (101 attempts, ~8 min of backoff on the local defaults)."""
    info, provider = _start_fails(error)
    assert info.status is JobStatus.FAILED, info
    assert info.preemptions == 0 and info.failures == 1 and provider.starts == 1, info
    assert [a.outcome.value for a in info.attempts] == ["FAILED"]
    root = error if isinstance(error, OSError) else error.__cause__
    assert isinstance(root, OSError) and root.strerror is not None
    assert f"host start failed: {root.strerror.lower()}: /tmp/x/entry.pkl" in (info.error or ""), info.error
    assert "not a preemption" in (info.error or "")
    assert provider.released == ["slice-0"]  # released, as on every path
    assert info.finished_at is not None and info.finished_at - info.submitted_at < 1.0  # no backoff, no retry


def test_host_start_failures_of_the_machines_state_spend_the_failure_budget_only() -> None:
    info, provider = _start_fails(OSError(errno.ENOSPC, "No space left on device", "/tmp/x/entry.pkl"), failures=2)
    assert info.status is JobStatus.FAILED and provider.starts == 3, info
    assert info.failures == 3 and info.preemptions == 0
    assert "failed 3 time(s), max_retries_failure=2" in (info.error or ""), info.error
    assert info.finished_at is not None and info.finished_at - info.submitted_at <= 1.0 + 2.0  # the two backoffs


def test_a_transient_host_start_error_is_still_retried_on_the_preemption_budget() -> None:
    """A fork that failed with EAGAIN is the machine's moment, not its state: retried as before."""
    info, provider = _start_fails(BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable"))
    assert info.status is JobStatus.FAILED and info.failures == 0, info
    assert info.preemptions == 101 and provider.starts == 101

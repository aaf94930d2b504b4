"""Gang scheduling and retries, written once for every backend.

A backend implements the :class:`~fray_core.provider.SliceProvider` contract (acquire / start / wait_any /
cancel / release, and optional capabilities whose defaults mean "cannot tell"; see :mod:`fray_core.provider`,
whose types this module re-exports); :class:`GangRunner` holds all the policy: all-or-nothing slices,
per-host environment (including ``MEGASCALE_*`` recomputed every attempt), cancel-siblings-on-first-failure,
classification of an attempt (any host preempted -> PREEMPTED, else FAILED), two retry budgets with backoff,
release on every path, and no retry after ``terminate``.

CPU/GPU jobs use the same runner: their gang is one pseudo-slice of ``replicas`` processes.

Example (with any provider)::

    runner = GangRunner(job_id, request, provider)
    outcome = runner.run()          # blocks; call runner.stop() from another thread to terminate
    outcome.status, outcome.results
"""

from __future__ import annotations

import errno
import math
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from fray_core.errors import Unschedulable
from fray_core.limits import MAX_SECONDS, MIN_POLL_INTERVAL, check_number
from fray_core.provider import (
    HostOutcome,
    HostOutcomeKind,
    HostRun,
    HostSpec,
    LeaseHealth,
    LeaseState,
    Outcome,
    SliceLease,
    SliceProvider,
)
from fray_core.types import (
    Attempt,
    AttemptOutcome,
    ElasticConfig,
    Goodput,
    JobId,
    JobInfo,
    JobRequest,
    JobStatus,
    ResourceConfig,
    TpuConfig,
)

__all__ = [
    "GangRunner",
    "HostOutcome",
    "HostOutcomeKind",
    "HostRun",
    "HostSpec",
    "LeaseHealth",
    "LeaseState",
    "Outcome",
    "RetryPolicy",
    "SliceLease",
    "SliceProvider",
    "format_exception",
    "host_envs",
    "slice_hosts",
]

MEGASCALE_DEFAULT_PORT = 8081

# A host start that failed on its machine's lasting state: a full disk, a quota, a read-only file system. No
# slice went away (not a preemption), and the same machine meets the same state a backoff later, so it is not
# retried on the preemption budget (~100 attempts: a full $TMPDIR kept a local job PENDING for ~8 minutes): the
# attempt is FAILED, and the failure budget bounds the retries.
_MACHINE_STATE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


# RetryPolicy's fields: (name, minimum, minimum excluded)
_POLICY_BOUNDS = (
    ("backoff_initial", 0.0, False),
    ("backoff_max", 0.0, False),
    ("backoff_multiplier", 1.0, False),
    ("schedule_timeout", 0.0, False),
    ("poll_interval", MIN_POLL_INTERVAL, False),
    ("cancel_grace", 0.0, False),
    ("host_start_timeout", 0.0, True),
    ("progress_interval", MIN_POLL_INTERVAL, False),  # a poll interval too when no stall detection asks
)


@attrs.define
class RetryPolicy:
    """Timing of the runner. Budgets come from the JobRequest; these are how long to wait and back off."""

    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    backoff_multiplier: float = 2.0
    schedule_timeout: float = 600.0  # per attempt: how long to wait for the slices before UNSCHEDULABLE
    poll_interval: float = 0.5  # granularity of terminate checks while waiting
    cancel_grace: float = 5.0  # how long to collect the outcomes of cancelled siblings
    # per attempt, for providers that report host start: every host must have started within this many
    # seconds after start() returned, else the slice is taken as lost (PREEMPTED)
    host_start_timeout: float = 300.0
    # how often heartbeats are read for the job's last step when no stall detection asks for every poll
    progress_interval: float = 5.0

    def __attrs_post_init__(self) -> None:
        # Checked once here, not on assignment: a NaN or zero poll_interval would spin a core, a NaN
        # timeout never expire.
        for field, minimum, exclusive in _POLICY_BOUNDS:
            check_number(
                f"RetryPolicy.{field}",
                getattr(self, field),
                minimum=minimum,
                exclusive=exclusive,
                maximum=MAX_SECONDS,
                unit="seconds" if field != "backoff_multiplier" else "",
            )

    def backoff(self, consecutive: int) -> float:
        """The wait before the next attempt after ``consecutive`` bad ones in a row: ``backoff_initial``
        times ``backoff_multiplier ** (consecutive - 1)``, at most ``backoff_max``. Never overflows: the
        count never resets while a job keeps failing, and ``2.0 ** 1024`` raises.

        >>> RetryPolicy().backoff(3), RetryPolicy().backoff(10**6)
        (4.0, 60.0)
        """
        if consecutive <= 0 or self.backoff_initial <= 0:
            return 0.0
        cap, initial = self.backoff_max, self.backoff_initial
        if initial >= cap:
            return cap
        # in logs (every term finite: initial > 0, cap > initial): the cap is reached before the power overflows
        growth = (consecutive - 1) * math.log(self.backoff_multiplier)
        if growth >= math.log(cap) - math.log(initial):
            return cap
        if growth < 700.0:  # multiplier ** (consecutive - 1) < e**700: a finite float, exact as before
            return min(cap, initial * self.backoff_multiplier ** (consecutive - 1))
        return min(cap, math.exp(math.log(initial) + growth))  # a subnormal initial: the power alone overflows


def format_exception(exc: BaseException) -> str:
    """``"Type: message"`` followed by the traceback, the form kept in ``Attempt.cause``."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{type(exc).__name__}: {exc}\n{tb}"


def host_envs(
    job_id: str,
    attempt: int,
    leases: Sequence[SliceLease],
    tpu: TpuConfig | None,
    user_env: dict[str, str] | None = None,
    megascale_port: int = MEGASCALE_DEFAULT_PORT,
    elastic: ElasticConfig | None = None,
) -> list[list[dict[str, str]]]:
    """The environment of every host of every slice for one attempt: ``envs[slice][host]``.

    Recomputed from the slices actually held, so a retry never sees a stale coordinator. An elastic job's
    hosts also get ``FRAY_ELASTIC=1`` and ``FRAY_ELASTIC_GRACE`` (seconds to checkpoint when stopped).
    """
    hosts = slice_hosts(job_id, attempt, leases, tpu, user_env, megascale_port, elastic)
    return [[h.env for h in per_slice] for per_slice in hosts]  # type: ignore[misc]


def slice_hosts(
    job_id: str,
    attempt: int,
    leases: Sequence[SliceLease],
    tpu: TpuConfig | None,
    user_env: dict[str, str] | None = None,
    megascale_port: int = MEGASCALE_DEFAULT_PORT,
    elastic: ElasticConfig | None = None,
) -> Iterator[list[HostSpec]]:
    """The :class:`HostSpec` of every host, one slice at a time (what :meth:`SliceProvider.start` gets):
    the runner starts each slice's hosts before the next slice's specs exist, so an attempt over many
    slices never holds every host's env at once.

    >>> lease = SliceLease(name="v4-16-0", device_type="v4-16", hosts=2)
    >>> [h.env["TPU_WORKER_ID"] for h in next(slice_hosts("job-1", 0, [lease], TpuConfig("v4-16")))]
    ['0', '1']
    """
    n_slices = len(leases)
    total = sum(lease.hosts for lease in leases)
    # Built per job, then per slice, then copied per host: this runs for every host of every attempt
    # (176,000 hosts in bench/runner_scale.py).
    job_env = dict(user_env or {})
    job_env.update(
        FRAY_JOB_ID=str(job_id), FRAY_ATTEMPT=str(attempt), FRAY_NUM_SLICES=str(n_slices), FRAY_NUM_REPLICAS=str(total)
    )
    job_env["FRAY_REPLICA_COUNT"] = job_env["FRAY_NUM_REPLICAS"]  # marin's name for it
    if elastic is not None:
        job_env.update(FRAY_ELASTIC="1", FRAY_ELASTIC_GRACE=f"{elastic.grace:g}")
    if tpu is not None:
        job_env.update(TPU_ACCELERATOR_TYPE=tpu.type, TPU_TOPOLOGY=tpu.resolved_topology)
        if n_slices > 1:
            addr = leases[0].host_addresses[0] if leases[0].host_addresses else "127.0.0.1"
            job_env.update(
                MEGASCALE_COORDINATOR_ADDRESS=f"{addr}:{megascale_port}",
                MEGASCALE_NUM_SLICES=str(n_slices),
                MEGASCALE_PORT=str(megascale_port),
            )
    rank = 0
    job = str(job_id)
    for s, lease in enumerate(leases):
        slice_env = dict(job_env, FRAY_SLICE_ID=str(s), FRAY_HOSTS_PER_SLICE=str(lease.hosts))
        if tpu is not None:
            slice_env["TPU_NAME"] = lease.name
            if n_slices > 1:
                slice_env["MEGASCALE_SLICE_ID"] = str(s)
        per_slice = []
        for h in range(lease.hosts):
            env = slice_env.copy()
            env["FRAY_HOST_ID"] = str(h)
            env["FRAY_REPLICA_ID"] = str(rank)
            if tpu is not None:
                env["TPU_WORKER_ID"] = str(h)
            per_slice.append(HostSpec(attempt, s, h, env, job))
            rank += 1
        yield per_slice


@attrs.define
class RunOutcome:
    status: JobStatus
    results: list[Any] | None
    error: str | None


def _steady_wall(wall: Callable[[], float], clock: Callable[[], float]) -> Callable[[], float]:
    """Wall-clock timestamps that advance with the monotonic ``clock``: the wall clock is read once, then
    carried forward, so a jump of the system clock (NTP, a resumed VM) during a job never makes an attempt's
    duration negative or its goodput 0% or a year."""
    wall0, clock0 = wall(), clock()
    return lambda: wall0 + (clock() - clock0)


class GangRunner:
    """Runs one job to completion over a :class:`SliceProvider`, within the request's retry budgets.

    ``clock`` (monotonic seconds) and ``sleep`` are injectable so tests can drive thousands of attempts
    on a fake clock. ``on_change(info)`` is called after every state change (to persist the job record).
    ``received_at``: when the job reached this process, by ``wall`` (default: its record's
    ``submitted_at``, which its client stamped: on a cluster another machine's clock); the goodput's pending
    share counts from it.
    """

    def __init__(
        self,
        job_id: JobId | str,
        request: JobRequest,
        provider: SliceProvider,
        *,
        policy: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        on_change: Callable[[JobInfo], None] | None = None,
        info: JobInfo | None = None,
        received_at: float | None = None,
    ) -> None:
        self.job_id = JobId(str(job_id))
        self.request = request
        self.provider = provider
        self.policy = policy or RetryPolicy()
        self.clock = clock
        self.wall = _steady_wall(wall, clock)
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._on_change = on_change
        self.info = info or JobInfo(
            job_id=self.job_id, name=request.name, status=JobStatus.PENDING, submitted_at=wall()
        )
        self._attempt: Attempt | None = None  # the attempt being acquired for
        self._stall_is_startup = False  # the last STALLED attempt: no first heartbeat (else: one stopped coming)
        self._t0 = wall()  # when run() began (reset by run())
        # When the job reached whoever runs it, by our wall clock: what a goodput's pending share counts
        # from. The record's submitted_at is its client's wall clock, on a cluster another machine's (an hour
        # behind would count an hour pending).
        self._received_at = received_at

    # ------------------------------------------------------------------------------------- control

    def stop(self) -> None:
        """Terminate: cancel the running attempt and never retry. Safe from any thread."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.info)

    # ----------------------------------------------------------------------------------------- run

    def run(self) -> RunOutcome:
        req = self.request
        res = req.resources
        tpu = res.device if isinstance(res.device, TpuConfig) else None
        counts = res.replica_counts if tpu is not None else (1,)
        consecutive_bad = 0
        self._t0 = self.wall()
        self.provider.prepare_entry(req.entrypoint)  # e.g. pickled while the slices are being acquired
        while True:
            if self.stopped:
                return self._finish(JobStatus.STOPPED, None, "terminated")
            # the attempt is recorded once it gets its slices (see _acquire) or gives up waiting for them:
            # a job waiting for capacity that other jobs hold has no attempt to show for it
            attempt = Attempt(index=len(self.info.attempts), started_at=self.wall())
            self._attempt = attempt
            try:
                outcome, cause, results = self._run_attempt(attempt, res, tpu, counts)
            except Unschedulable as e:  # can never fit: fail now, retrying cannot help
                self._record(attempt)
                attempt.outcome, attempt.cause, attempt.ended_at = AttemptOutcome.UNSCHEDULABLE, str(e), self.wall()
                return self._finish(JobStatus.FAILED, None, f"unschedulable: {e}")
            self._record(attempt)
            attempt.outcome = outcome
            attempt.cause = cause
            attempt.ended_at = self.wall()
            if outcome is AttemptOutcome.SUCCEEDED:
                self.info.result = results
                return self._finish(JobStatus.SUCCEEDED, results, None)
            if outcome is AttemptOutcome.CANCELLED or self.stopped:
                return self._finish(JobStatus.STOPPED, None, "terminated")
            if outcome is AttemptOutcome.RESIZED:  # ended by us to grow: no budget, no backoff
                consecutive_bad = 0
                self.info.progress = f"attempt {attempt.index} resized; restarting on more slices"
                self._changed()
                continue
            # a stall after progress may be the user's (a deadlock, a hung data loader): the failure budget; a
            # host that never sent its first heartbeat is an init hang, usually the platform's: the preemption one
            if outcome is AttemptOutcome.FAILED or (outcome is AttemptOutcome.STALLED and not self._stall_is_startup):
                self.info.failures += 1
                if self.info.failures > req.max_retries_failure:
                    what = "failed or stalled" if outcome is AttemptOutcome.STALLED else "failed"
                    return self._finish(
                        JobStatus.FAILED,
                        None,
                        f"{what} {self.info.failures} time(s), max_retries_failure={req.max_retries_failure}; "
                        f"last error: {_first_line(cause)}",
                    )
            else:  # PREEMPTED, UNSCHEDULABLE or a startup STALL (a permanent Unschedulable already returned FAILED)
                self.info.preemptions += 1
                if self.info.preemptions > req.max_retries_preemption:
                    what = {
                        AttemptOutcome.UNSCHEDULABLE: "preempted or unschedulable",
                        AttemptOutcome.STALLED: "preempted or stalled at startup",
                    }.get(outcome, "preempted")
                    return self._finish(
                        JobStatus.FAILED,
                        None,
                        f"{what} {self.info.preemptions} time(s), max_retries_preemption="
                        f"{req.max_retries_preemption}; last cause: {_first_line(cause)}",
                    )
            consecutive_bad += 1
            delay = self.policy.backoff(consecutive_bad)
            self.info.progress = f"attempt {attempt.index} {outcome.value.lower()}; retrying in {delay:.1f}s"
            self._changed()
            if delay > 0:
                self._sleep(delay)

    def _finish(self, status: JobStatus, results: list[Any] | None, error: str | None) -> RunOutcome:
        self.info.status = status
        self.info.error = error
        self.info.finished_at = self.wall()
        self.info.progress = None
        self.info.pending_reason = None
        self.info.goodput = self._goodput()
        self._changed()
        return RunOutcome(status, results, error)

    def _goodput(self) -> Goodput:
        info = self.info
        tpu = self.request.resources.device
        chips = tpu.chips if isinstance(tpu, TpuConfig) else 0
        wanted = chips * max(self.request.resources.replica_counts) if chips else 0
        finished = info.finished_at if info.finished_at is not None else self.wall()
        # a record made elsewhere was stamped by another clock than ours (its client's; a fake clock in tests)
        submitted = self._received_at if self._received_at is not None else info.submitted_at
        submitted = min(submitted, self._t0)
        return Goodput.of(info.attempts, submitted, finished, chips, wanted)

    def _record(self, attempt: Attempt) -> None:
        if not self.info.attempts or self.info.attempts[-1] is not attempt:
            self.info.attempts.append(attempt)

    def _acquire(self, res: ResourceConfig, tpu: TpuConfig | None, counts: Sequence[int]) -> list[SliceLease] | None:
        """Acquire in short rounds so a terminate is noticed; ``None`` when stopped meanwhile.

        ``schedule_timeout`` counts only time during which capacity is missing: while the provider says
        the capacity exists but other jobs hold it (``Unschedulable.held``), the job waits as long as it
        takes, PENDING, with ``pending_reason`` kept current. The rounds that found capacity missing add
        up, whatever came between them: rounds that alternate between held and missing (a slice that
        keeps looking free and failing) still end the attempt."""
        missing = 0.0  # seconds of rounds that found capacity missing, this attempt
        held = False
        while True:
            if self.stopped:
                return None
            began = self.clock()
            next_round = began + self.policy.poll_interval
            round_deadline = next_round if held else min(began + self.policy.schedule_timeout - missing, next_round)
            try:
                leases = self.provider.acquire(res, counts, round_deadline)
            except Unschedulable as e:
                if e.permanent:
                    raise
                held = e.held  # False from a provider that cannot tell: capacity is missing
                if not held:
                    missing += self.clock() - began
                reason = e.reason or f"waiting for capacity: {e}"
                if reason != self.info.pending_reason:
                    self.info.pending_reason = reason
                    self._changed()
                if not held and missing >= self.policy.schedule_timeout:
                    raise
                continue
            self.info.pending_reason = None
            if self._attempt is not None:
                self._attempt.acquired_at = self.wall()
                self._record(self._attempt)
            return leases

    def _run_attempt(
        self, attempt: Attempt, res: ResourceConfig, tpu: TpuConfig | None, counts: Sequence[int]
    ) -> tuple[AttemptOutcome, str | None, list[Any] | None]:
        what = f"{'/'.join(map(str, counts))} x {tpu.type}" if tpu else f"{res.replicas} process(es)"
        self.info.progress = f"attempt {attempt.index}: waiting for {what}"
        if self.info.status is JobStatus.PENDING and not self.info.pending_reason:
            # until the backend's first answer (a queue's place, a reason it waits): a PENDING job always says why
            self.info.pending_reason = f"looking for {what}"
        self._changed()
        try:
            leases = self._acquire(res, tpu, counts)
        except Unschedulable as e:
            if e.permanent:
                raise
            if self.stopped:  # terminated while waiting: the attempt was cancelled, not unschedulable
                return AttemptOutcome.CANCELLED, "terminated while waiting for capacity", None
            return AttemptOutcome.UNSCHEDULABLE, f"Unschedulable: {e}", None
        if leases is None:
            return AttemptOutcome.CANCELLED, "terminated while waiting for capacity", None
        runs: list[HostRun] = []
        try:
            attempt.slices = [lease.name for lease in leases]
            n_hosts = sum(lease.hosts for lease in leases)
            self.info.progress = f"attempt {attempt.index}: starting {n_hosts} hosts on {', '.join(attempt.slices)}"
            self._changed()
            user_env = self.request.env_vars
            if self.request.resources.device.kind == "cpu":
                # a CPU job placed on a TPU host must not initialise the TPU (and take its lock); the user's
                # own JAX_PLATFORMS wins (a copy: the request's dict is the caller's)
                user_env = {"JAX_PLATFORMS": "cpu", **user_env}
            specs = slice_hosts(self.job_id, attempt.index, leases, tpu, user_env, elastic=self.request.elastic)
            try:
                for lease, hosts in zip(leases, specs):
                    if self.stopped:
                        break
                    runs.extend(self.provider.start(lease, hosts, self.request.entrypoint))
            except Exception as e:  # a host that cannot even start: infrastructure
                # start() is all or nothing, so the failed slice left nothing running; the slices started
                # before it did: stop and collect their hosts before the slices are released and the next
                # attempt starts (else they would keep running into it)
                self._cancel_and_drain(runs, set(runs))
                machine = _machine_state(e)
                if machine is not None:  # the host's machine, as it is: fails again at once (see _MACHINE_STATE_ERRNOS)
                    return (
                        AttemptOutcome.FAILED,
                        f"host start failed: {machine} (the host's machine, not a preemption)\n{format_exception(e)}",
                        None,
                    )
                # a fork that failed with EAGAIN, a backend's transient error: retryable, on the preemption budget
                return AttemptOutcome.PREEMPTED, f"host start failed: {format_exception(e)}", None
            if self.stopped:  # terminated before every host started (maybe none): not a success
                self._cancel_and_drain(runs, set(runs))
                return AttemptOutcome.CANCELLED, "terminated", None
            return self._watch(attempt, runs, leases)
        finally:
            self.provider.release(leases)

    def _all_started(self, attempt: Attempt) -> None:
        attempt.hosts_started_at = self.wall()
        if attempt.acquired_at is None:  # its hosts left the backend's queue by starting (SliceProvider.queued)
            attempt.acquired_at = attempt.hosts_started_at
        self.info.pending_reason = None
        self.info.status = JobStatus.RUNNING
        self.info.progress = f"attempt {attempt.index}: running on {', '.join(attempt.slices)}"
        self._changed()

    def _note_started(self, attempt: Attempt, n_runs: int, not_started: set[HostRun], ended: set[HostRun]) -> None:
        """Update which hosts have started (an ended host had); the job is RUNNING once all have."""
        before = len(not_started)
        not_started -= ended
        if not_started:
            not_started -= set(self.provider.started_runs(list(not_started)) or ())
        if not not_started:
            self._all_started(attempt)
        elif len(not_started) != before:
            self.info.progress = (
                f"attempt {attempt.index}: {n_runs - len(not_started)} of {n_runs} hosts started on "
                f"{', '.join(attempt.slices)}"
            )
            self._changed()

    def _watch(
        self, attempt: Attempt, runs: list[HostRun], leases: list[SliceLease]
    ) -> tuple[AttemptOutcome, str | None, list[Any] | None]:
        results: dict[HostRun, Any] = {}
        pending = set(runs)
        first_bad: Outcome | None = None
        preempted: Outcome | None = None
        # hosts not known to have started; a provider that cannot tell (None) counts them started now
        started = self.provider.started_runs(runs)
        not_started = set(runs).difference(started) if started is not None else set()
        start_deadline = self.clock() + self.policy.host_start_timeout
        queued = False  # hosts wait in the backend's own queue (see SliceProvider.queued)
        if not not_started:
            self._all_started(attempt)
        grow = self._grow_watch(leases)
        req = self.request
        began = self.clock()
        beat_every = (
            self.policy.poll_interval if req.stall_timeout or req.startup_timeout else self.policy.progress_interval
        )
        # when to read the hosts' heartbeats next: not at once (none can have beaten yet, and a job of a few
        # milliseconds then read them for nothing: one GCS call each, issue 29)
        beats_due = began + beat_every
        while pending and first_bad is None:
            if self.stopped:
                self._cancel_and_drain(runs, pending)
                return AttemptOutcome.CANCELLED, "terminated", None
            # the whole gang's leases: a notice stops every host gracefully before its slice is taken away; a
            # slice seen lost ends the attempt now, whatever its hosts have (not yet) reported
            health = self.provider.lease_health(leases)
            draining = [(lease, h) for lease, h in zip(leases, health) if h.state is LeaseState.DRAINING]
            if draining:
                return self._on_notice(attempt, runs, pending, draining)
            lost_leases = [(lease, h) for lease, h in zip(leases, health) if h.state is LeaseState.LOST]
            if lost_leases:
                gone = self._cancel_and_drain(runs, pending)  # a host of it reported lost says it best
                if self.stopped:
                    return AttemptOutcome.CANCELLED, "terminated", None
                return (
                    AttemptOutcome.PREEMPTED,
                    _describe(gone) if gone is not None else _describe_leases(lost_leases),
                    None,
                )
            now = self.clock()
            if now >= beats_due:
                beats_due = now + beat_every
                stalled = self._check_progress(attempt, runs, pending, now - began)
                if stalled is not None:
                    return self._on_stall(attempt, runs, pending, leases, *stalled)
            if grow is not None:
                target = grow()
                if target is not None:
                    elastic = self.request.elastic
                    assert elastic is not None
                    self.info.progress = (
                        f"attempt {attempt.index}: growing from {len(leases)} to {target} slices; "
                        f"stopping the hosts ({elastic.grace:g} s to checkpoint)"
                    )
                    self._changed()
                    self._cancel_and_drain(runs, pending, grace=elastic.grace)
                    if self.stopped:
                        return AttemptOutcome.CANCELLED, "terminated", None
                    return (
                        AttemptOutcome.RESIZED,
                        f"resized: {target} slices of {leases[0].device_type} free for {elastic.grow_after:g} s; "
                        f"growing from {len(leases)} slice(s)",
                        None,
                    )
            if not_started:
                try:
                    why = self.provider.queued(list(not_started))
                except Unschedulable as e:  # the backend can never place them: not worth waiting for
                    self._cancel_and_drain(runs, pending)
                    if self.stopped:
                        return AttemptOutcome.CANCELLED, "terminated", None
                    if e.permanent:
                        raise
                    return AttemptOutcome.UNSCHEDULABLE, f"Unschedulable: {e}", None
                if why is not None or queued:
                    # a queue holds nothing yet: the start and startup timeouts count from leaving it (this
                    # look, or the one that sees the hosts out of it)
                    began = self.clock()
                    start_deadline = began + self.policy.host_start_timeout
                if why is not None:
                    # the attempt holds its resources (goodput) only from leaving the queue; the job says why
                    if not queued:
                        queued, attempt.acquired_at = True, None
                    if why != self.info.pending_reason:
                        self.info.pending_reason = why
                        self._changed()
                elif queued:
                    queued, attempt.acquired_at, self.info.pending_reason = False, self.wall(), None
                    self._changed()
            if not_started and self.clock() >= start_deadline:
                late = sorted(not_started, key=lambda r: (r.slice_index, r.host_index))
                self._cancel_and_drain(runs, pending)
                where = ", ".join(_where(r) for r in late[:4]) + (f" and {len(late) - 4} more" if len(late) > 4 else "")
                return (
                    AttemptOutcome.PREEMPTED,
                    f"host start timed out: {len(late)} of {len(runs)} hosts had not started "
                    f"{self.policy.host_start_timeout:g} s after they were submitted ({where}); their "
                    f"slice is taken as lost",
                    None,
                )
            ended: set[HostRun] = set()
            track = bool(not_started)  # an ended host had started; the set is needed only until all have
            for o in self.provider.wait_any(list(pending), self.policy.poll_interval):
                pending.discard(o.run)
                if track:
                    ended.add(o.run)
                if o.kind is HostOutcomeKind.SUCCEEDED:
                    results[o.run] = o.result
                elif first_bad is None:
                    first_bad = o
                if o.kind is HostOutcomeKind.PREEMPTED and preempted is None:
                    preempted = o
            if not_started and first_bad is None:
                self._note_started(attempt, len(runs), not_started, ended)
        if first_bad is None:
            return AttemptOutcome.SUCCEEDED, None, [results[r] for r in _in_host_order(runs)]
        failed_at = self.clock()
        lost = self._cancel_and_drain(runs, pending)
        if preempted is None:
            preempted = lost
        if self.stopped:
            return AttemptOutcome.CANCELLED, "terminated", None
        cause = _describe(first_bad)
        if preempted is not None:
            return (
                AttemptOutcome.PREEMPTED,
                cause if first_bad is preempted else f"{_describe(preempted)}\n(first failure: {cause})",
                None,
            )
        # a host failed with no host reported lost: before calling it the user's failure, look at the whole
        # gang's leases until the backend would have detected a loss (siblings of a lost slice often fail first)
        blame = self._attribute(leases, pending, failed_at)
        if self.stopped:
            return AttemptOutcome.CANCELLED, "terminated", None
        if blame is not None:
            return AttemptOutcome.PREEMPTED, f"{blame}\n(first failure: {cause})", None
        return AttemptOutcome.FAILED, cause, None

    def _attribute(self, leases: list[SliceLease], pending: set[HostRun], since: float) -> str | None:
        """Why the attempt is the infrastructure's fault after all, or ``None``: a slice of the gang seen lost
        or draining (lease health), a host of it reported PREEMPTED, or the cloud's probe, at any moment until
        ``detection_delay`` after ``since`` (the first failure). Returns at once on a backend that sees
        losses at once."""
        window_end = since + max(0.0, self.provider.detection_delay)
        while True:
            bad = [
                (lease, h)
                for lease, h in zip(leases, self.provider.lease_health(leases))
                if h.state in (LeaseState.LOST, LeaseState.DRAINING)
            ]
            if bad:
                return _describe_leases(bad)
            probed = [lease.name for lease in leases if self.provider.was_preempted(lease)]
            if probed:
                return f"host reported preempted by the cloud ({', '.join(probed)})"
            remaining = window_end - self.clock()
            if remaining <= 0 or self.stopped:
                return None
            step = min(self.policy.poll_interval, remaining)
            if pending:  # hosts of a lost slice not yet collected come back PREEMPTED once it is detected
                for o in self.provider.wait_any(list(pending), step):
                    pending.discard(o.run)
                    if o.kind is HostOutcomeKind.PREEMPTED:
                        return _describe(o)
            else:
                self._sleep(step)

    def _on_notice(
        self,
        attempt: Attempt,
        runs: list[HostRun],
        pending: set[HostRun],
        draining: list[tuple[SliceLease, LeaseHealth]],
    ) -> tuple[AttemptOutcome, str | None, list[Any] | None]:
        """A preemption notice for a slice of the gang: every host of the job is told the deadline and gets
        SIGTERM, the grace until the deadline to checkpoint, then is killed; the attempt is PREEMPTED
        whatever the hosts' exit codes (the next attempt does not get the draining slice)."""
        deadline = (
            min(h.deadline for _, h in draining if h.deadline is not None)
            if any(h.deadline is not None for _, h in draining)
            else self.wall()
        )
        grace = max(0.0, deadline - self.wall())
        what = _describe_leases(draining)
        self.info.progress = f"attempt {attempt.index}: {what}; stopping every host ({grace:.0f} s to checkpoint)"
        self._changed()
        self.provider.announce_preemption(list(pending), deadline)
        self._cancel_and_drain(runs, pending, grace=grace)
        if self.stopped:
            return AttemptOutcome.CANCELLED, "terminated", None
        return (
            AttemptOutcome.PREEMPTED,
            f"{what}; every host got SIGTERM and FRAY_PREEMPTION_DEADLINE with {grace:.1f} s to the deadline",
            None,
        )

    def _check_progress(
        self, attempt: Attempt, runs: list[HostRun], pending: set[HostRun], running_for: float
    ) -> tuple[str, bool] | None:
        """Read the running hosts' heartbeats: keep the job's last step current, and return why the attempt
        stalled (with whether it is a startup stall) when a timeout of the request has passed, else None."""
        beats = self.provider.heartbeats(list(pending))
        if beats is None:
            return None
        if beats:
            newest = min(b.age for b in beats.values())
            steps = [b.step for b in beats.values() if b.step is not None]
            at = self.wall() - newest
            step = max(steps) if steps else self.info.last_step
            if (
                step != self.info.last_step
                or self.info.last_heartbeat_at is None
                or at - self.info.last_heartbeat_at >= 1.0
            ):
                self.info.last_step, self.info.last_heartbeat_at = step, at
                self._changed()
        req = self.request
        if req.stall_timeout is not None:
            late = sorted((r for r, b in beats.items() if b.age > req.stall_timeout), key=_host_key)
            if late:
                b = beats[late[0]]
                last = f", last step {b.step}" if b.step is not None else ""
                return (
                    f"stalled: {_hosts(late, len(runs))} sent no heartbeat for {req.stall_timeout:g} s "
                    f"(stall_timeout; {_where(late[0])} last beat {b.age:.0f} s ago{last})",
                    False,
                )
        if req.startup_timeout is not None and running_for >= req.startup_timeout:
            silent = sorted((r for r in pending if r not in beats), key=_host_key)
            if silent:
                return (
                    f"stalled at startup: {_hosts(silent, len(runs))} sent no first heartbeat within "
                    f"{req.startup_timeout:g} s of the attempt's start (startup_timeout)",
                    True,
                )
        return None

    def _on_stall(
        self,
        attempt: Attempt,
        runs: list[HostRun],
        pending: set[HostRun],
        leases: list[SliceLease],
        why: str,
        startup: bool,
    ) -> tuple[AttemptOutcome, str | None, list[Any] | None]:
        """Stacks of every host to the job log, then stop them; a lost or draining slice makes it a preemption."""
        self.info.progress = f"attempt {attempt.index}: {why}; writing the hosts' stacks to the log"
        self._changed()
        self.provider.dump_stacks(list(pending))
        self._cancel_and_drain(runs, pending)
        if self.stopped:
            return AttemptOutcome.CANCELLED, "terminated", None
        blame = self._attribute(leases, pending, self.clock())
        if blame is not None:
            return AttemptOutcome.PREEMPTED, f"{blame}\n(then: {why})", None
        self._stall_is_startup = startup
        return AttemptOutcome.STALLED, f"{why}; the stacks of every host are in the job log", None

    def _grow_watch(self, leases: list[SliceLease]) -> Callable[[], int | None] | None:
        """For an elastic job below its largest count on a provider that can tell free slices: a check,
        asked every poll, that returns the count to grow to once larger counts have fit without a break
        for ``grow_after`` seconds (else ``None``). ``None`` when the job cannot grow."""
        elastic = self.request.elastic
        tpu = self.request.resources.device
        free_slices = self.provider.free_slices
        held = len(leases)
        counts = self.request.resources.replica_counts
        if elastic is None or not isinstance(tpu, TpuConfig) or held >= counts[0]:
            return None
        since: float | None = None  # since when a larger count has fit, without a break

        def check() -> int | None:
            nonlocal since
            free = free_slices(tpu.type)  # None: the provider cannot tell, so the job never grows
            fits = [c for c in counts if free is not None and held < c <= held + free]
            if not fits:
                since = None
                return None
            now = self.clock()
            if since is None:
                since = now
            return fits[0] if now - since >= elastic.grow_after else None

        return check

    def _cancel_and_drain(
        self, runs: list[HostRun], pending: set[HostRun], grace: float | None = None
    ) -> Outcome | None:
        """Cancel the still-running hosts and collect how they ended, for at most ``cancel_grace``
        (after a graceful stop's ``grace``, which a provider that supports it gives the hosts); returns
        the first of them that was lost (PREEMPTED) rather than cancelled, if any."""
        if not pending:
            return None
        self.provider.cancel(list(pending), grace=grace)
        lost: Outcome | None = None
        deadline = self.clock() + self.policy.cancel_grace + (grace or 0.0)
        while pending:
            remaining = deadline - self.clock()
            if remaining <= 0:
                break
            for o in self.provider.wait_any(list(pending), min(self.policy.poll_interval, remaining)):
                pending.discard(o.run)
                if lost is None and o.kind is HostOutcomeKind.PREEMPTED:
                    lost = o
        return lost


def _machine_state(exc: BaseException) -> str | None:
    """``"no space left on device: /path"`` when ``exc`` (or an exception it was raised from) is an ``OSError`` of
    the machine's lasting state (``_MACHINE_STATE_ERRNOS``), else ``None``.

    >>> _machine_state(OSError(errno.ENOSPC, "No space left on device", "/tmp/fray/entry-a0.pkl"))
    'no space left on device: /tmp/fray/entry-a0.pkl'
    >>> _machine_state(BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")) is None
    True
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # a provider may wrap the OSError in its own error
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _MACHINE_STATE_ERRNOS:
            what = (e.strerror or errno.errorcode.get(e.errno, str(e.errno))).lower()
            return f"{what}: {e.filename}" if e.filename is not None else what
        e = e.__cause__ or e.__context__
    return None


def _in_host_order(runs: list[HostRun]) -> list[HostRun]:
    """``runs`` by (slice, host): the order providers start them in, so usually ``runs`` itself."""
    for a, b in zip(runs, runs[1:]):
        if (a.slice_index, a.host_index) >= (b.slice_index, b.host_index):
            return sorted(runs, key=lambda r: (r.slice_index, r.host_index))
    return runs


def _where(run: HostRun) -> str:
    if run.lease.device_type in ("cpu", "gpu"):
        return f"replica {run.host_index}"
    return f"slice {run.slice_index} ({run.lease.name}) host {run.host_index}"


def _host_key(run: HostRun) -> tuple[int, int]:
    return run.slice_index, run.host_index


def _hosts(runs: list[HostRun], total: int) -> str:
    where = ", ".join(_where(r) for r in runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    return f"{len(runs)} of {total} hosts ({where})"


def _describe_leases(bad: list[tuple[SliceLease, LeaseHealth]]) -> str:
    """``"slice v4-16-1 lost (node dead)"`` / ``"preemption notice: slice v4-16-0 draining (...)"``."""
    parts = []
    for lease, h in bad:
        reason = f" ({h.reason})" if h.reason else ""
        parts.append(f"slice {lease.name} {h.state.value.lower()}{reason}")
    notice = any(h.state is LeaseState.DRAINING for _, h in bad)
    return ("preemption notice: " if notice else "Preempted: ") + ", ".join(parts)


def _describe(o: Outcome) -> str:
    return f"{o.kind.value.lower()} on {_where(o.run)}: {o.error or 'no error text'}"


def _first_line(text: str | None) -> str:
    """The cause's first line; one that ends on ``last output:`` gets the output's last line (a job's error
    read anywhere, ``--json`` and ``JobInfo.error`` too, says what the job said last)."""
    if not text:
        return "unknown"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[-1]}"
    return lines[0]

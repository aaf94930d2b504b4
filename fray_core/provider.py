"""The provider contract: what a backend implements so that the gang runner can run jobs on it.

A backend's :class:`SliceProvider` is the only thing :class:`~fray_core.runner.GangRunner` talks to. The
runner holds all the policy (gangs, per-host env, retries and budgets, cancel-siblings, classification);
the provider only does what the infrastructure does: hold slices, start processes, say how they ended,
stop them, give the slices back. The contract is one abstract base class, like httpx's ``BaseTransport`` or
trio's ``Clock``: five abstract methods every backend writes, and optional capabilities as methods whose
default means "this provider cannot tell" (the runner calls them unconditionally, it never probes a provider
with ``getattr``/``hasattr``).

The types a provider exchanges with the runner live here too: :class:`SliceLease` (a slice held),
:class:`HostSpec` (what to start on one host), :class:`HostRun` (one started host), :class:`HostOutcome` /
:class:`Outcome` (how it ended) and :class:`LeaseHealth` (what the backend knows of a held slice). They
are re-exported by :mod:`fray_core.runner`.

A new backend is checked against the contract by the conformance kit, ``fray_core.testing.conformance``
(see docs/backends.md, "Writing a backend", and ``examples/minimal_backend.py``).

Example: a provider that runs each host as a thread (the whole contract; see the example backend for one
with processes)::

    class ThreadProvider(SliceProvider):
        def acquire(self, resources, counts, deadline):
            n = counts[0] if isinstance(resources.device, TpuConfig) else int(resources.replicas)
            return [SliceLease(name="threads", device_type="cpu", hosts=n)]

        def start(self, lease, hosts, entrypoint):
            return [HostRun(lease, h.slice_index, h.host_index, handle=spawn(entrypoint, h.env)) for h in hosts]

        def wait_any(self, runs, timeout): ...       # outcomes of runs that ended, each reported once
        def cancel(self, runs, grace=None): ...      # stop them: CANCELLED unless already lost
        def release(self, leases): ...               # idempotent
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from fray_core._exits import exit_code_text  # re-exported: how a provider names a command's end (killed by SIGKILL)
from fray_core.request import Entrypoint, ResourceConfig

__all__ = [
    "Heartbeat",
    "HostOutcome",
    "HostOutcomeKind",
    "HostRun",
    "HostSpec",
    "LeaseHealth",
    "LeaseState",
    "Outcome",
    "SliceLease",
    "SliceProvider",
    "exit_code_text",
]


class HostOutcomeKind(str, enum.Enum):
    """How one host of an attempt ended."""

    SUCCEEDED = "SUCCEEDED"
    PREEMPTED = "PREEMPTED"  # the host (or its slice) went away: infrastructure, not the user's fault
    FAILED = "FAILED"  # the user's code raised or exited non-zero
    CANCELLED = "CANCELLED"  # stopped by us (a sibling failed, or terminate)


@attrs.frozen(eq=False)
class SliceLease:
    """A slice held by one attempt: all of its hosts, exclusively, until released.

    ``host_addresses`` are the hosts' IPs as the backend reports them; slice 0 host 0's address is the
    multislice coordinator. ``handle`` is the provider's own bookkeeping.

    >>> SliceLease(name="v4-16-0", device_type="v4-16", hosts=2, host_addresses=("10.0.0.1", "10.0.0.2")).hosts
    2
    """

    name: str
    device_type: str  # TPU pod type ("v4-16"), or "cpu"/"gpu" for a CPU/GPU gang
    hosts: int
    host_addresses: tuple[str, ...] = ()
    handle: Any = None


@attrs.frozen(slots=True)
class HostSpec:
    """What to start on one host of a slice, as the runner computed it for this attempt.

    ``attempt``, ``slice_index`` and ``host_index`` are what a provider needs to name, log or place the host
    (it never parses them back out of ``env``); ``env`` is the host's full environment from fray
    (``FRAY_*``, ``TPU_*``, ``MEGASCALE_*`` and the user's ``env_vars``), to be set as given; ``job_id``
    the job's id. For a CPU/GPU gang (one pseudo-slice) ``host_index`` is the replica's rank.

    >>> spec = HostSpec(attempt=1, slice_index=0, host_index=3, env={"FRAY_HOST_ID": "3"}, job_id="job-1")
    >>> spec.host_index, spec.env["FRAY_HOST_ID"]
    (3, '3')
    """

    attempt: int
    slice_index: int
    host_index: int
    env: Mapping[str, str]
    job_id: str = ""


@attrs.define(eq=False, weakref_slot=False)  # no weak references to runs: one word less per host
class HostRun:
    """One host's process of one attempt, as the provider started it; ``handle`` is the provider's own.

    Read-only to the runner. Not frozen so that a provider may subclass it to keep its per-host state
    on the run itself (one object per host; the in-memory provider does, ``fray_core.testing.RunRecord``).
    """

    lease: SliceLease
    slice_index: int
    host_index: int
    handle: Any = None


@attrs.frozen
class HostOutcome:
    """How one host ended. ``error`` is ``"Type: message"`` plus the traceback, for FAILED/PREEMPTED."""

    run: HostRun
    kind: HostOutcomeKind
    result: Any = None
    error: str | None = None


class Outcome(Protocol):
    """What ``wait_any`` reports for a host that ended: a :class:`HostOutcome`, or any object with the
    same four attributes. A provider whose :class:`HostRun` subclass records how the host ended may
    report the run itself (``run`` returning ``self``), so a host costs one object, not two: the
    in-memory provider does (``fray_core.testing.RunRecord``), for attempts of 16,000 hosts.

    Example::

        for o in provider.wait_any(runs, timeout=0.5):
            if o.kind is HostOutcomeKind.SUCCEEDED:
                results[o.run] = o.result
    """

    @property
    def run(self) -> HostRun: ...

    @property
    def kind(self) -> HostOutcomeKind: ...

    @property
    def result(self) -> Any: ...

    @property
    def error(self) -> str | None: ...


class LeaseState(str, enum.Enum):
    """What a backend knows of a held slice (see :meth:`SliceProvider.lease_health`)."""

    INTACT = "INTACT"  # every host of it is there, as far as the backend can see
    LOST = "LOST"  # the slice (or a host of it) is gone: its hosts cannot succeed
    DRAINING = "DRAINING"  # the slice will be taken away at ``deadline`` (a preemption notice)
    UNKNOWN = "UNKNOWN"  # the backend cannot tell


@attrs.frozen
class LeaseHealth:
    """The health of one held slice: ``state``; for DRAINING the ``deadline`` (epoch seconds) at which it
    is taken away; ``reason`` a short text for the attempt's cause.

    >>> LeaseHealth.draining(1_700_000_030.0, "maintenance").state
    <LeaseState.DRAINING: 'DRAINING'>
    >>> LeaseHealth.unknown().state.value
    'UNKNOWN'
    """

    state: LeaseState
    deadline: float | None = None
    reason: str | None = None

    @classmethod
    def intact(cls) -> LeaseHealth:
        return _INTACT

    @classmethod
    def unknown(cls) -> LeaseHealth:
        return _UNKNOWN

    @classmethod
    def lost(cls, reason: str | None = None) -> LeaseHealth:
        return cls(LeaseState.LOST, reason=reason)

    @classmethod
    def draining(cls, deadline: float, reason: str | None = None) -> LeaseHealth:
        return cls(LeaseState.DRAINING, deadline=deadline, reason=reason)


_INTACT = LeaseHealth(LeaseState.INTACT)
_UNKNOWN = LeaseHealth(LeaseState.UNKNOWN)


@attrs.frozen
class Heartbeat:
    """The last heartbeat of one host (``fray_core.heartbeat(step)`` in host code): ``age`` seconds ago
    (on the provider's clock), with the ``step`` it gave (``None`` when none was given).

    >>> Heartbeat(age=2.5, step=1200).step
    1200
    """

    age: float
    step: int | None = None


class SliceProvider(abc.ABC):
    """The substrate a backend implements for the runner. One provider instance serves one job.

    The five abstract methods are the contract every backend writes:

    - :meth:`acquire`: all-or-nothing slices, the largest acceptable count that fits.
    - :meth:`start`: every host of one slice, all or nothing.
    - :meth:`wait_any`: how hosts ended, each run reported once.
    - :meth:`cancel`: stop runs (optionally gracefully).
    - :meth:`release`: give slices back; idempotent.

    The other methods are optional capabilities with a default that means "this provider cannot tell"
    (or "nothing to do"); a backend overrides the ones it can answer: :meth:`close`,
    :meth:`prepare_entry`, :meth:`was_preempted`, :meth:`free_slices`, :meth:`started_runs`,
    :meth:`queued`, :meth:`lease_health` and :attr:`detection_delay`.

    Threading: the runner calls every method from its one thread; only a backend's own callbacks
    (e.g. a host reporting in) come from elsewhere.

    ``fray_core.testing.conformance.ProviderConformance`` checks a provider against this contract.
    """

    # ------------------------------------------------------------------------------- the contract

    @abc.abstractmethod
    def acquire(self, resources: ResourceConfig, counts: Sequence[int], deadline: float) -> list[SliceLease]:
        """Hold slices for one attempt, all or nothing.

        For a TPU request: ``n`` whole slices of ``resources.device``, ``n`` the largest of ``counts``
        (given largest first) that fits now. For a CPU/GPU request: one pseudo-slice whose ``hosts`` is
        ``resources.replicas`` (an int for CPU/GPU). Waits for capacity at most until ``deadline`` (a value
        of the runner's monotonic clock; the runner calls again in rounds, so a provider may also give up a
        round earlier), then raises :class:`~fray_core.errors.Unschedulable`
        (``permanent=True`` when it can never fit; ``held=True`` when the capacity exists but other jobs
        hold it). Never returns some of the slices: on failure it holds nothing.
        """

    @abc.abstractmethod
    def start(self, lease: SliceLease, hosts: list[HostSpec], entrypoint: Entrypoint) -> list[HostRun]:
        """Start every host of ``lease``, one per :class:`HostSpec` (``len(hosts) == lease.hosts``), with
        its env; never blocks on the user's code.

        All or nothing: returns one :class:`HostRun` per host (in ``hosts`` order), or raises having left
        nothing running (undo the hosts already started before raising). A host that started and died at
        once is not a failed ``start``: report it through :meth:`wait_any`.
        """

    @abc.abstractmethod
    def wait_any(self, runs: list[HostRun], timeout: float) -> Sequence[Outcome]:
        """The outcomes (:class:`Outcome`) of the runs among ``runs`` that have ended, waiting up to
        ``timeout`` seconds for at least one; ``[]`` when none ended in time. Each run is reported once,
        over all calls."""

    @abc.abstractmethod
    def cancel(self, runs: list[HostRun], grace: float | None = None) -> None:
        """Stop these runs. Their outcome (still reported by :meth:`wait_any`) becomes CANCELLED unless the
        host was already lost (PREEMPTED) or had ended. ``grace=None``: stop now (terminate, a failed
        sibling). ``grace=s`` (an elastic job resized): ask the hosts to stop (SIGTERM), give them ``s``
        seconds to checkpoint, then stop what is left; a provider that cannot signal may stop them at once.
        Runs that already ended are ignored."""

    @abc.abstractmethod
    def release(self, leases: list[SliceLease]) -> None:
        """Give the slices back. Idempotent (a lease released twice is released once); the runner calls it
        on every path, after cancelling and collecting the slices' runs."""

    # ------------------------------------------------------------------- optional, with defaults

    def close(self) -> None:
        """The job ended (the runner returned, or crashed): free what the provider still holds for it,
        e.g. a place in a scheduler's queue or a host still running. Default: nothing to do."""

    def prepare_entry(self, entrypoint: Entrypoint) -> None:
        """Called once by the runner before the first ``acquire``: a chance to prepare the entrypoint
        (pickle it, upload it) while slices are being acquired. Must not raise for a bad entrypoint: a
        failure belongs to :meth:`start`. Idempotent. Default: nothing to do."""

    def was_preempted(self, lease: SliceLease) -> bool:
        """Asked when an attempt failed without any host reported PREEMPTED: whether the slice was in fact
        preempted (e.g. a cloud metadata probe), which makes the attempt PREEMPTED. Default: False
        (cannot tell; the failure counts as the user's)."""
        return False

    def free_slices(self, tpu_type: str) -> int | None:
        """How many free slices of ``tpu_type`` this job could take now (not reserved for a job waiting
        ahead of it); cheap and non-blocking (asked every poll of an elastic job). An elastic job
        (``JobRequest.elastic``) grows only on a provider that answers. Default: ``None`` (cannot tell:
        never grows)."""
        return None

    def started_runs(self, runs: list[HostRun]) -> list[HostRun] | None:
        """The runs among ``runs`` whose host process has actually started (reported in); cheap and
        non-blocking (asked every poll until all have). A provider that answers makes the job RUNNING only
        once every host started, and an attempt whose hosts do not all start within
        ``RetryPolicy.host_start_timeout`` PREEMPTED. Default: ``None`` (cannot tell: a host counts as
        started when :meth:`start` returned)."""
        return None

    def queued(self, runs: list[HostRun]) -> str | None:
        """Why hosts among ``runs`` (started by :meth:`start`, not started yet by :meth:`started_runs`)
        wait in the backend's own queue for resources, or ``None`` when none does; cheap and non-blocking
        (asked every poll until all hosts started). A provider whose lease reserves nothing (its
        :meth:`acquire` checked only that the cluster has room for the hosts at all, and :meth:`start` hands
        them to the backend's queue, as a plain Ray task is) says so here: this is the job's ``pending_reason``
        (PENDING, or RUNNING on a retry, as for any attempt waiting for capacity), ``host_start_timeout`` and
        ``startup_timeout`` count only from when the hosts left the queue, and the attempt's ``acquired_at`` is
        then. Raises :class:`~fray_core.errors.Unschedulable`
        (``permanent=True``) when the queued hosts can never be placed (the nodes that had room are gone and
        no autoscaler may add any): the job fails, never waits forever. Default: ``None`` (every lease
        reserved its hosts' resources; :meth:`start` started them).

        Example::

            def queued(self, runs):
                waiting = [r for r in runs if self.backend.is_queued(r.handle)]
                return f"queued by the backend for {len(waiting)} host(s)" if waiting else None
        """
        return None

    def lease_health(self, leases: Sequence[SliceLease]) -> list[LeaseHealth]:
        """What the backend knows of each held slice, in ``leases`` order: intact, lost, draining (with the
        deadline of a preemption notice) or unknown; cheap and non-blocking. Lets the runner attribute a
        failure to a lost slice and act on a notice before the hosts die. Default: every lease UNKNOWN."""
        return [_UNKNOWN] * len(leases)

    @property
    def detection_delay(self) -> float:
        """Seconds this backend may need to notice that a slice was lost (e.g. a control plane's node
        timeout): a host failure within that long of a slice loss may be the loss itself. Default: 0.0
        (losses are seen at once)."""
        return 0.0

    def heartbeats(self, runs: Sequence[HostRun]) -> Mapping[HostRun, Heartbeat] | None:
        """The last heartbeat of each run among ``runs`` that has sent one (a run that has not is absent);
        cheap and non-blocking. What ``JobRequest.stall_timeout``/``startup_timeout`` and the job's last step
        are computed from. Default: ``None`` (cannot tell: no stall detection)."""
        return None

    def dump_stacks(self, runs: Sequence[HostRun]) -> None:
        """Write the Python stacks of every thread of these hosts to the job log, each under its host's
        prefix (before a stalled attempt's hosts are stopped). Best effort, non-blocking. Default: nothing."""

    def announce_preemption(self, runs: Sequence[HostRun], deadline: float) -> None:
        """Tell these hosts a preemption is due at ``deadline`` (epoch seconds), just before the runner
        stops them gracefully (``cancel(runs, grace=...)``, whose SIGTERM they get): afterwards
        ``fray_core.preemption_notice()`` in host code returns the deadline. Default: nothing (the hosts
        only get the SIGTERM)."""

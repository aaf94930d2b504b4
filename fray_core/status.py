"""What the cluster reports about a job: its status, attempts, goodput and per-process tasks.

:class:`JobInfo` is the snapshot ``poll``/``list_jobs`` return and the record the job store keeps
(``to_json``/``from_json``); :class:`JobStatus` where a job is, :class:`Attempt` and :class:`AttemptOutcome`
each try at running the gang. What a caller builds to run a job is in :mod:`fray_core.request`.

>>> JobStatus("running") is JobStatus.RUNNING, AttemptOutcome.PREEMPTED.value
(True, 'PREEMPTED')
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NewType

import attrs

from fray_core.request import GpuConfig, JobRequest, TpuConfig

__all__ = [
    "Attempt",
    "AttemptOutcome",
    "Goodput",
    "JobId",
    "JobInfo",
    "JobStatus",
    "StoredResult",
    "TaskStatus",
    "summarize_request",
]

JobId = NewType("JobId", str)


class JobStatus(str, enum.Enum):
    """Where a job is: PENDING -> RUNNING -> SUCCEEDED | FAILED | STOPPED (UNKNOWN: unreadable record)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    #: only in ``list_jobs()``: the job's record cannot be read; ``JobInfo.error`` says why. ``poll`` of such
    #: a job raises :class:`~fray_core.errors.RecordError` instead.
    UNKNOWN = "UNKNOWN"

    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)

    @staticmethod
    def finished(status: JobStatus | str) -> bool:
        """marin's spelling of :meth:`is_terminal`: ``JobStatus.finished(info.status)``."""
        return JobStatus(status).is_terminal()

    # marin's Fray spelled the values in lowercase (``info.status == "succeeded"``). A member equals its value
    # in either case, so both spellings keep working; the value (and so JSON and the CLI) stays uppercase.
    # The hash is the uppercase value's: a set or dict keyed by lowercase strings does not find members.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, str) and not isinstance(other, JobStatus):
            return self.value == other.upper()
        return self is other

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.value)

    @classmethod
    def _missing_(cls, value: object) -> JobStatus | None:
        # JobStatus("succeeded") as marin wrote it
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        return None

    def __str__(self) -> str:
        return self.value


class AttemptOutcome(str, enum.Enum):
    """How one attempt ended."""

    SUCCEEDED = "SUCCEEDED"
    PREEMPTED = "PREEMPTED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    UNSCHEDULABLE = "UNSCHEDULABLE"
    #: ended by the runner to restart an elastic job on more slices (spends no retry budget)
    RESIZED = "RESIZED"
    #: ended by the runner because a host stopped sending heartbeats (``JobRequest.stall_timeout``) or never
    #: sent its first (``startup_timeout``); see docs/concepts.md for the budget each spends
    STALLED = "STALLED"

    def __str__(self) -> str:
        return self.value


@attrs.define
class Attempt:
    """One try at running the whole gang. ``cause`` keeps the first failed host's error and traceback."""

    index: int
    slices: list[str] = attrs.field(factory=list)
    started_at: float = attrs.field(factory=time.time)
    ended_at: float | None = None
    outcome: AttemptOutcome | None = None
    cause: str | None = None
    #: when the attempt got its slices (wall time); ``None`` when it never did (waited, then gave up)
    acquired_at: float | None = None
    hosts_started_at: float | None = None  # when every host had started (reported in); None: never

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "slices": list(self.slices),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "outcome": self.outcome.value if self.outcome else None,
            "cause": self.cause,
            "acquired_at": self.acquired_at,
            "hosts_started_at": self.hosts_started_at,
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Attempt:
        return Attempt(
            index=d["index"],
            slices=list(d.get("slices") or []),
            started_at=d.get("started_at") or 0.0,
            ended_at=d.get("ended_at"),
            outcome=AttemptOutcome(d["outcome"]) if d.get("outcome") else None,
            cause=d.get("cause"),
            acquired_at=d.get("acquired_at"),
            hosts_started_at=d.get("hosts_started_at"),
        )


@attrs.frozen
class Goodput:
    """How a finished job's wall time (from when it reached its runner, by the runner's clock, to
    ``finished_at``; locally that is ``submitted_at``) was spent, in seconds and in
    chip-seconds: ``pending_s`` queued, acquiring slices or backing off between attempts; ``productive_s``
    the attempt that produced the result, from getting its slices to its end; ``lost_s`` attempts that did
    not (preempted, failed, cancelled, resized to grow an elastic job). The three add up to the wall time.
    Chip-seconds count the TPU chips held (``pending_chip_s``: the chips asked for, while waiting); 0 for
    CPU/GPU jobs.

    >>> g = Goodput(pending_s=10.0, productive_s=80.0, lost_s=10.0)
    >>> g.ratio, g.wall_s
    (0.8, 100.0)
    >>> Goodput.from_json(g.to_json()) == g
    True
    """

    pending_s: float = 0.0
    productive_s: float = 0.0
    lost_s: float = 0.0
    pending_chip_s: float = 0.0
    productive_chip_s: float = 0.0
    lost_chip_s: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.pending_s + self.productive_s + self.lost_s

    @property
    def ratio(self) -> float:
        """``productive_s / (pending_s + productive_s + lost_s)``; 0.0 for a job that took no time."""
        total = self.wall_s
        return self.productive_s / total if total > 0 else 0.0

    @property
    def chip_ratio(self) -> float:
        """The same ratio in chip-seconds; 0.0 when no chips were involved."""
        total = self.pending_chip_s + self.productive_chip_s + self.lost_chip_s
        return self.productive_chip_s / total if total > 0 else 0.0

    def to_json(self) -> dict[str, float]:
        return {**attrs.asdict(self), "ratio": self.ratio, "chip_ratio": self.chip_ratio}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Goodput:
        return Goodput(**{f.name: float(d.get(f.name) or 0.0) for f in attrs.fields(Goodput)})

    @staticmethod
    def of(
        attempts: Sequence[Attempt],
        submitted_at: float,
        finished_at: float,
        chips_per_slice: int = 0,
        chips_wanted: int = 0,
    ) -> Goodput:
        """Computed from a job's attempts: each attempt's time holding slices (``acquired_at`` to
        ``ended_at``) is productive for a SUCCEEDED attempt and lost otherwise; the rest of the wall time is
        pending. ``chips_per_slice`` and ``chips_wanted`` give the chip-seconds."""
        productive = lost = productive_chip = lost_chip = 0.0
        for a in attempts:
            if a.acquired_at is None or a.ended_at is None:
                continue
            held = max(0.0, min(a.ended_at, finished_at) - max(a.acquired_at, submitted_at))
            chips = held * chips_per_slice * len(a.slices)
            if a.outcome is AttemptOutcome.SUCCEEDED:
                productive, productive_chip = productive + held, productive_chip + chips
            else:
                lost, lost_chip = lost + held, lost_chip + chips
        pending = max(0.0, finished_at - submitted_at - productive - lost)
        return Goodput(pending, productive, lost, pending * chips_wanted, productive_chip, lost_chip)


class StoredResult:
    """A job's results that live in a job store: ``load()`` reads and unpickles them, only when called.

    Backends put one in a :class:`JobInfo` instead of the results themselves, so listing and polling never
    unpickle anything and a long-lived process does not keep every job's results in memory.
    """

    __slots__ = ("_load", "size")

    def __init__(self, load: Callable[[], list[Any]], size: int | None = None) -> None:
        self._load = load
        self.size = size  # bytes of the stored (pickled) results, when known

    def load(self) -> list[Any]:
        return self._load()

    def __repr__(self) -> str:
        return "StoredResult(...)"


def _result_converter(value: Any) -> Any:
    if value is None or isinstance(value, StoredResult):
        return value
    return list(value)


@attrs.frozen
class TaskStatus:
    """One process of a job (``JobInfo.tasks``), as marin's Fray reported it: its status and, when it
    failed, why.

    >>> TaskStatus(JobStatus.FAILED, "ValueError: bad").status == "failed"
    True
    """

    status: JobStatus
    error_message: str | None = None


_CAUSE_WHERE = re.compile(r"^(?:failed|preempted) on (?:replica (\d+)|slice (\d+) \(.*?\) host (\d+)):")


@attrs.define
class JobInfo:
    """A snapshot of a job: a plain record, equal to another snapshot with the same fields, and
    JSON-serialisable with :meth:`to_json` (the record the job store keeps).

    ``result`` is a list, one entry per process in (slice, host) order, from the successful attempt (``None``
    until the job succeeds). It is loaded on first access (results may be large, and they are only unpickled
    when asked for: see docs/backends.md, "The job store"). It raises
    :class:`~fray_core.errors.ResultUnavailableError` when a SUCCEEDED job's results cannot be loaded, e.g.
    ``result_error`` says why they were never stored, or their classes cannot be imported here. Results
    take no part in ``==`` and are not in ``to_json()``.

    >>> info = JobInfo(job_id="j", name="n", status=JobStatus.SUCCEEDED, result=[1, 2])
    >>> info.result, info.to_json()["status"]
    ([1, 2], 'SUCCEEDED')
    """

    job_id: JobId
    name: str
    status: JobStatus
    attempts: list[Attempt] = attrs.field(factory=list)
    preemptions: int = 0
    failures: int = 0
    error: str | None = None
    # the results, or a StoredResult that loads them; `result` (the property below) is the public face
    _result: list[Any] | StoredResult | None = attrs.field(
        default=None, alias="result", converter=_result_converter, eq=False, repr=False
    )
    submitted_at: float = attrs.field(factory=time.time)
    finished_at: float | None = None
    backend: str = "local"
    request_summary: dict[str, Any] = attrs.field(factory=dict)
    progress: str | None = None  # what the job is doing now, e.g. "waiting for 2 x v4-16"
    #: why a SUCCEEDED job's results are missing (e.g. "cannot be pickled: ..."); None when they were stored
    result_error: str | None = None
    #: why the job is PENDING now, e.g. "queued: 2nd for 4 x v4-16; fleet: 1 free, 3 held by a, b"; else None
    pending_reason: str | None = None
    #: how the wall time was spent, set when the job finishes (see :class:`Goodput`)
    goodput: Goodput | None = None
    #: a held session's calls so far (see :mod:`fray_core.session`; counted by the session's client); 0 for a job
    calls: int = 0
    #: the latest step a host gave ``fray_core.heartbeat(step)``, and when (epoch s) the latest heartbeat came
    last_step: int | None = None
    last_heartbeat_at: float | None = None
    _loaded: tuple[list[Any]] | None = attrs.field(init=False, default=None, eq=False, repr=False)  # (results,)

    @property
    def kind(self) -> str:
        """``"session"`` for a held session (:meth:`Cluster.hold <fray_core.cluster.Cluster.hold>`), else ``"job"``."""
        return "session" if (self.request_summary or {}).get("kind") == "session" else "job"

    @property
    def result(self) -> list[Any] | None:
        """The per-process results (loaded from the job store on first access), ``None`` before success."""
        if isinstance(self._result, StoredResult):
            if self._loaded is None:
                self._loaded = (self._result.load(),)
            return self._loaded[0]
        if self._result is None and self.status is JobStatus.SUCCEEDED and self.result_error:
            from fray_core.errors import ResultUnavailableError

            raise ResultUnavailableError(f"job {self.job_id}: {self.result_error}")
        return self._result

    @result.setter
    def result(self, value: list[Any] | StoredResult | None) -> None:
        self._result = _result_converter(value)
        self._loaded = None

    @property
    def stored_result(self) -> StoredResult | None:
        """Where the results are stored, when this object refers to a stored copy; never loads."""
        return self._result if isinstance(self._result, StoredResult) else None

    @property
    def result_in_memory(self) -> list[Any] | None:
        """The results when this object holds them itself (not yet stored), else ``None``; never loads."""
        return None if isinstance(self._result, StoredResult) else self._result

    @property
    def current_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def error_message(self) -> str | None:
        """marin's name for :attr:`error`."""
        return self.error

    @property
    def tasks(self) -> list[TaskStatus]:
        """One :class:`TaskStatus` per process of the current attempt, in (slice, host) order (marin's
        per-replica status). Fray runs a job as a gang: when one process fails the others are stopped, so
        a FAILED job has one FAILED task (the first that failed, named in the attempt's cause) and the rest
        STOPPED. Empty while no attempt has its processes."""
        att = self.current_attempt
        summary = self.request_summary or {}
        device = summary.get("device") or {}
        if device.get("kind") == "tpu":
            hosts = int(device.get("hosts") or 1)
            n = hosts * len(att.slices) if att is not None else 0
        else:
            hosts = 1
            replicas = summary.get("replicas", 1)
            n = int(replicas if isinstance(replicas, int) else (len(att.slices) if att is not None else 0))
        if att is None or not att.slices or n <= 0:
            return []
        if self.status is JobStatus.FAILED or (self.status.is_terminal() and att.outcome is AttemptOutcome.FAILED):
            m = _CAUSE_WHERE.match(att.cause or "")
            bad = None
            if m is not None:
                bad = int(m.group(1)) if m.group(1) is not None else int(m.group(2)) * hosts + int(m.group(3))
            return [
                TaskStatus(JobStatus.FAILED, self.error)
                if i == bad or (bad is None and i == 0)
                else TaskStatus(JobStatus.STOPPED, "stopped: another process of the job failed")
                for i in range(n)
            ]
        status = JobStatus.RUNNING if self.status is JobStatus.PENDING else self.status
        return [TaskStatus(status, self.error if status is not JobStatus.SUCCEEDED else None) for _ in range(n)]

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "status": self.status.value,
            "attempts": [a.to_json() for a in self.attempts],
            "preemptions": self.preemptions,
            "failures": self.failures,
            "error": self.error,
            "submitted_at": self.submitted_at,
            "finished_at": self.finished_at,
            "backend": self.backend,
            "request": self.request_summary,
            "progress": self.progress,
            "result_error": self.result_error,
            "pending_reason": self.pending_reason,
            "goodput": self.goodput.to_json() if self.goodput is not None else None,
            "kind": self.kind,
            "calls": self.calls,
            "last_step": self.last_step,
            "last_heartbeat_at": self.last_heartbeat_at,
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> JobInfo:
        """The inverse of :meth:`to_json`; a malformed record raises ``ValueError`` naming the field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"expected a JSON object, got {type(d).__name__} {_short(d)}")

        def get(key: str, types: type | tuple[type, ...], default: Any = None, required: bool = False) -> Any:
            if key not in d or d[key] is None:
                if required:
                    raise ValueError(f"field {key!r} is missing")
                return default
            value = d[key]
            if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
                raise ValueError(f"field {key!r}: expected {_names(types)}, got {_short(value)}")
            if not isinstance(value, types):
                raise ValueError(f"field {key!r}: expected {_names(types)}, got {_short(value)}")
            return value

        status = get("status", str, required=True)
        try:
            status_value = JobStatus(status)
        except ValueError:
            raise ValueError(f"field 'status': unknown status {_short(status)}") from None
        attempts = []
        for i, a in enumerate(get("attempts", list, [])):
            try:
                attempts.append(Attempt.from_json(a))
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                raise ValueError(f"field 'attempts'[{i}]: cannot read {_short(a)}: {type(e).__name__}: {e}") from None
        return JobInfo(
            job_id=JobId(get("job_id", str, required=True)),
            name=get("name", str, required=True),
            status=status_value,
            attempts=attempts,
            preemptions=get("preemptions", int, 0),
            failures=get("failures", int, 0),
            error=get("error", str),
            submitted_at=float(get("submitted_at", (int, float), 0.0)),
            finished_at=get("finished_at", (int, float)),
            backend=get("backend", str, "local"),
            request_summary=dict(get("request", dict, {})),
            progress=get("progress", str),
            result_error=get("result_error", str),
            pending_reason=get("pending_reason", str),
            goodput=_goodput_from_json(get("goodput", dict)),
            calls=_count(get("calls", int, 0), "calls"),
            last_step=get("last_step", int),
            last_heartbeat_at=get("last_heartbeat_at", (int, float)),
        )


def _count(value: int, field: str) -> int:
    if value < 0:
        raise ValueError(f"field {field!r}: expected a count >= 0, got {value}")
    return value


def _goodput_from_json(d: Mapping[str, Any] | None) -> Goodput | None:
    if d is None:
        return None
    try:
        return Goodput.from_json(d)
    except (TypeError, ValueError) as e:
        raise ValueError(f"field 'goodput': cannot read {_short(d)}: {type(e).__name__}: {e}") from None


def _names(types: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summarize_request(request: JobRequest) -> dict[str, Any]:
    """The JSON-safe part of a request, kept in the job record."""
    res = request.resources
    dev = res.device
    device: dict[str, Any] = {"kind": dev.kind}
    if isinstance(dev, TpuConfig):
        device.update(type=dev.type, topology=dev.resolved_topology, hosts=dev.hosts)
    elif isinstance(dev, GpuConfig):
        device.update(type=dev.type, count=dev.count)
    return {
        "kind": request.kind,
        "entrypoint": request.entrypoint.describe(),
        "cpu": res.cpu,
        "ram": str(res.ram),
        "disk": str(res.disk),
        "device": device,
        "replicas": list(res.replicas) if isinstance(res.replicas, tuple) else res.replicas,
        "preemptible": res.preemptible,
        "max_retries_failure": request.max_retries_failure,
        "max_retries_preemption": request.max_retries_preemption,
        "env_vars": sorted(request.env_vars),
        "elastic": (
            {"grow_after": request.elastic.grow_after, "grace": request.elastic.grace} if request.elastic else None
        ),
        "stall_timeout": request.stall_timeout,
        "startup_timeout": request.startup_timeout,
    }

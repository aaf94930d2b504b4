"""The request and status types: frozen attrs classes, validated at construction.

Every validation error names the field, the value given and what is allowed::

    >>> ResourceConfig(cpu=-1)
    Traceback (most recent call last):
    ...
    ValueError: ResourceConfig.cpu: must be >= 0, got -1
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NewType, Union

import attrs

from fray_core.tpu import TpuSpec, get_tpu_spec, normalize_tpu_type

__all__ = [
    "Attempt",
    "AttemptOutcome",
    "CpuConfig",
    "DeviceConfig",
    "Entrypoint",
    "EnvironmentConfig",
    "GpuConfig",
    "JobId",
    "JobInfo",
    "JobRequest",
    "JobStatus",
    "ResourceConfig",
    "TpuConfig",
    "create_environment",
    "format_size",
    "parse_size",
]

JobId = NewType("JobId", str)

# ---------------------------------------------------------------------------------------------- sizes

_UNITS = {"": 1024**3, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtpb]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(value: str | int | float, field: str = "size") -> int:
    """Parse a memory/disk size into bytes.

    Units are binary and case-insensitive: ``"512m"``, ``"16g"``, ``"16G"``, ``"16GiB"``, ``"1.5t"``.
    A bare number means **gigabytes** (``"16"`` and ``16`` are 16 GiB), because that is what call sites
    such as ``ResourceConfig(ram="16")`` mean. ``"100b"`` is 100 bytes.

    >>> parse_size("16g") == parse_size("16") == 16 * 1024**3
    True
    """
    if isinstance(value, bool):
        raise TypeError(f"{field}: expected a size like '16g', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{field}: must be >= 0, got {value!r}")
        return int(value * _UNITS[""])
    if not isinstance(value, str):
        raise TypeError(f"{field}: expected a size like '16g' or a number of GiB, got {value!r}")
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(
            f"{field}: cannot parse size {value!r}; use a number with an optional unit "
            "b/k/m/g/t/p, e.g. '512m', '16g', '1.5t' (a bare number means GiB)"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(nbytes: int) -> str:
    """The shortest exact-ish spelling of a byte count: ``format_size(16 * 1024**3) == '16g'``."""
    for unit in ("p", "t", "g", "m", "k"):
        scale = _UNITS[unit]
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:g}{unit}" if v == round(v, 3) else f"{round(v, 3)}{unit}"
    return f"{nbytes}b"


# -------------------------------------------------------------------------------------------- devices


@attrs.frozen
class CpuConfig:
    """No accelerator: the job's processes need only CPUs and memory."""

    kind: str = attrs.field(default="cpu", init=False)


def _check_positive_int(field: str) -> Callable[[Any, attrs.Attribute, Any], None]:
    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{field}: expected an int >= 1, got {value!r}")
        if value < 1:
            raise ValueError(f"{field}: must be >= 1, got {value!r}")

    return check


@attrs.frozen
class GpuConfig:
    """``count`` GPUs of ``type`` (e.g. ``"A100"``, or ``"auto"`` for any) per process."""

    type: str = attrs.field(default="auto")
    count: int = attrs.field(default=1, validator=_check_positive_int("GpuConfig.count"))
    kind: str = attrs.field(default="gpu", init=False)

    @type.validator
    def _check_type(self, _a: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"GpuConfig.type: expected a non-empty str like 'A100', got {value!r}")


def _normalize_tpu(value: Any) -> Any:
    return normalize_tpu_type(value) if isinstance(value, str) else value


@attrs.frozen
class TpuConfig:
    """A TPU slice of pod type ``type`` (``"v4-16"``, ``"v5litepod-4"``, ``"v6e-16"``, ...).

    ``type`` is checked against the catalog (:mod:`fray_core.tpu`); ``hosts``, ``chips`` and
    ``chips_per_host`` come from it.

    >>> TpuConfig(type="v4-16").hosts
    2
    """

    type: str = attrs.field(converter=_normalize_tpu)
    topology: str | None = attrs.field(default=None)
    kind: str = attrs.field(default="tpu", init=False)

    @type.validator
    def _check_type(self, _a: attrs.Attribute, value: Any) -> None:
        get_tpu_spec(value)  # raises a ValueError naming the field and the nearest valid types

    @topology.validator
    def _check_topology(self, _a: attrs.Attribute, value: str | None) -> None:
        if value is None:
            return
        spec = get_tpu_spec(self.type)
        if not isinstance(value, str) or not re.fullmatch(r"\d+(x\d+){1,2}", value):
            raise ValueError(f"TpuConfig.topology: expected e.g. '2x2x2', got {value!r}")
        n = 1
        for d in value.split("x"):
            n *= int(d)
        if n != spec.chips:
            raise ValueError(
                f"TpuConfig.topology: {value!r} has {n} chips but {self.type} has {spec.chips} "
                f"(default topology {spec.topology})"
            )

    @property
    def spec(self) -> TpuSpec:
        return get_tpu_spec(self.type)

    @property
    def hosts(self) -> int:
        return self.spec.hosts

    @property
    def chips(self) -> int:
        return self.spec.chips

    @property
    def chips_per_host(self) -> int:
        return self.spec.chips_per_host

    @property
    def resolved_topology(self) -> str:
        return self.topology or self.spec.topology


DeviceConfig = Union[CpuConfig, GpuConfig, TpuConfig]

# ----------------------------------------------------------------------------------------- resources


def _replicas_converter(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return value


def _check_number(field: str, minimum: float) -> Callable[[Any, attrs.Attribute, Any], None]:
    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{field}: expected a number >= {minimum:g}, got {value!r}")
        if value < minimum:
            raise ValueError(f"{field}: must be >= {minimum:g}, got {value!r}")

    return check


def _check_size(field: str) -> Callable[[Any, attrs.Attribute, Any], None]:
    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        parse_size(value, field)

    return check


@attrs.frozen
class ResourceConfig:
    """What every process of a job needs, and how many processes (or TPU slices) run together.

    - ``cpu``: CPUs per process. ``ram``/``disk``: sizes per process (``"16g"``, ``"512m"``; a bare
      number such as ``"16"`` means GiB).
    - ``device``: :class:`CpuConfig` (default), :class:`GpuConfig` or :class:`TpuConfig`.
    - ``replicas``: for a TPU device, the number of slices (one process per host of every slice);
      a sequence such as ``[1, 2]`` lists acceptable slice counts and the largest that fits wins.
      For CPU/GPU, the number of processes started together.
    - ``preemptible``: ``False`` places the job on non-preemptible capacity (e.g. the Ray head node).
    - ``regions``: acceptable regions, informational for backends that have none.

    >>> ResourceConfig.with_tpu("v4-16", slice_count=2).replicas
    2
    """

    cpu: float = attrs.field(default=1, validator=_check_number("ResourceConfig.cpu", 0))
    ram: str | int | float = attrs.field(default="4g", validator=_check_size("ResourceConfig.ram"))
    disk: str | int | float = attrs.field(default="16g", validator=_check_size("ResourceConfig.disk"))
    device: DeviceConfig = attrs.field(factory=CpuConfig)
    replicas: int | tuple[int, ...] = attrs.field(default=1, converter=_replicas_converter)
    preemptible: bool = attrs.field(default=True)
    regions: tuple[str, ...] | None = attrs.field(
        default=None, converter=lambda v: tuple(v) if isinstance(v, (list, tuple)) else v
    )

    @device.validator
    def _check_device(self, _a: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, (CpuConfig, GpuConfig, TpuConfig)):
            raise TypeError(
                f"ResourceConfig.device: expected CpuConfig(), GpuConfig(...) or TpuConfig(...), got {value!r}"
            )

    @replicas.validator
    def _check_replicas(self, _a: attrs.Attribute, value: Any) -> None:
        what = "slice counts" if isinstance(self.device, TpuConfig) else "process counts"
        if isinstance(value, tuple):
            if not value:
                raise ValueError(
                    f"ResourceConfig.replicas: an empty list allows nothing; give {what} >= 1, e.g. [1, 2]"
                )
            for v in value:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(
                        f"ResourceConfig.replicas: every entry must be an int >= 1, got {v!r} in {list(value)}"
                    )
            if not isinstance(self.device, TpuConfig) and len(set(value)) > 1:
                raise ValueError(
                    f"ResourceConfig.replicas: a list of acceptable counts is only allowed for TPU "
                    f"slices (flexible multislice), got {list(value)} for {type(self.device).__name__}"
                )
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"ResourceConfig.replicas: expected an int >= 1 or a list of them, got {value!r}")
        if value < 1:
            raise ValueError(f"ResourceConfig.replicas: must be >= 1, got {value!r}")

    @regions.validator
    def _check_regions(self, _a: attrs.Attribute, value: Any) -> None:
        if value is not None and not all(isinstance(r, str) and r for r in value):
            raise ValueError(f"ResourceConfig.regions: expected a list of region names, got {value!r}")

    @property
    def replica_counts(self) -> tuple[int, ...]:
        """Acceptable counts, largest first: ``replicas=[1, 2]`` gives ``(2, 1)``."""
        counts = self.replicas if isinstance(self.replicas, tuple) else (self.replicas,)
        return tuple(sorted(set(counts), reverse=True))

    @property
    def ram_bytes(self) -> int:
        return parse_size(self.ram, "ResourceConfig.ram")

    @property
    def disk_bytes(self) -> int:
        return parse_size(self.disk, "ResourceConfig.disk")

    @property
    def is_tpu(self) -> bool:
        return isinstance(self.device, TpuConfig)

    @staticmethod
    def with_tpu(tpu_type: str, slice_count: int | Sequence[int] = 1, **kwargs: Any) -> ResourceConfig:
        """``ResourceConfig.with_tpu("v5p-16", slice_count=2, cpu=8)``."""
        topology = kwargs.pop("topology", None)
        return ResourceConfig(device=TpuConfig(type=tpu_type, topology=topology), replicas=slice_count, **kwargs)

    @staticmethod
    def with_gpu(gpu_type: str = "auto", count: int = 1, **kwargs: Any) -> ResourceConfig:
        """``ResourceConfig.with_gpu("A100", count=8, cpu=32)``."""
        return ResourceConfig(device=GpuConfig(type=gpu_type, count=count), **kwargs)

    @staticmethod
    def with_cpu(**kwargs: Any) -> ResourceConfig:
        """``ResourceConfig.with_cpu(cpu=4, ram="8g")``."""
        return ResourceConfig(device=CpuConfig(), **kwargs)


# --------------------------------------------------------------------------------------- entrypoint


@attrs.frozen
class Entrypoint:
    """What every process of the job runs: a Python callable or a command.

    Exactly one of ``callable`` and ``binary``::

        Entrypoint(callable=train, function_args={"steps": 10})
        Entrypoint.from_callable(train, args=(10,))
        Entrypoint(binary="python", args=["-c", "print(1)"])

    The callable is shipped with cloudpickle; ``launch`` checks that it pickles, in the caller's process.
    """

    callable: Callable[..., Any] | None = None
    function_args: Mapping[str, Any] = attrs.field(factory=dict, converter=lambda v: dict(v or {}))
    binary: str | None = None
    args: tuple[Any, ...] = attrs.field(default=(), converter=lambda v: tuple(v or ()))

    def __attrs_post_init__(self) -> None:
        if (self.callable is None) == (self.binary is None):
            given = "both" if self.callable is not None else "neither"
            raise ValueError(
                f"Entrypoint: give exactly one of callable=... or binary=..., got {given} "
                f"(callable={self.callable!r}, binary={self.binary!r})"
            )
        if self.callable is not None:
            if not callable(self.callable):
                raise TypeError(f"Entrypoint.callable: expected a callable, got {self.callable!r}")
        else:
            if not isinstance(self.binary, str) or not self.binary.strip():
                raise ValueError(f"Entrypoint.binary: expected a non-empty command, got {self.binary!r}")
            if self.function_args:
                raise ValueError("Entrypoint.function_args: only allowed with callable=..., not binary=...")
            if not all(isinstance(a, (str, int, float)) for a in self.args):
                raise TypeError(f"Entrypoint.args: command arguments must be strings, got {list(self.args)!r}")
        for k in self.function_args:
            if not isinstance(k, str):
                raise TypeError(f"Entrypoint.function_args: keys must be str, got {k!r}")

    @property
    def positional(self) -> tuple[Any, ...]:
        """Positional args for a callable entrypoint (from ``from_callable(fn, args=...)``)."""
        return self.args if self.callable is not None else ()

    @staticmethod
    def from_callable(
        fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Entrypoint:
        """``Entrypoint.from_callable(train, args=(10,), kwargs={"lr": 1e-3})``."""
        return Entrypoint(callable=fn, function_args=kwargs or {}, args=tuple(args))

    @staticmethod
    def from_binary(cmd: str, args: Sequence[str] = ()) -> Entrypoint:
        """``Entrypoint.from_binary("python", ["-c", "print(1)"])``."""
        return Entrypoint(binary=cmd, args=tuple(args))

    @property
    def command(self) -> list[str]:
        assert self.binary is not None
        return [self.binary, *(str(a) for a in self.args)]

    def describe(self) -> str:
        if self.callable is not None:
            mod = getattr(self.callable, "__module__", None) or "?"
            name = getattr(self.callable, "__qualname__", None) or repr(self.callable)
            return f"{mod}:{name}"
        return " ".join(self.command)


# --------------------------------------------------------------------------------------- environment


def _check_env_vars(_inst: Any, _a: attrs.Attribute, value: Mapping[str, str]) -> None:
    for k, v in value.items():
        if not isinstance(k, str) or not k or "=" in k:
            raise ValueError(f"EnvironmentConfig.env_vars: invalid variable name {k!r}")
        if not isinstance(v, str):
            raise TypeError(f"EnvironmentConfig.env_vars[{k!r}]: values must be str, got {v!r}")


@attrs.frozen
class EnvironmentConfig:
    """The software environment of every process: pip packages, env vars, extras, a working dir.

    On Ray these become the ``runtime_env`` (pip, env_vars, working_dir). Locally nothing is installed:
    ``launch`` warns about pip packages this Python lacks, and ``workspace`` is the processes' working
    directory (and first on their ``sys.path``).
    """

    pip_packages: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    env_vars: Mapping[str, str] = attrs.field(factory=dict, converter=dict, validator=_check_env_vars)
    extras: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    workspace: str | None = None


def create_environment(
    pip_packages: Sequence[str] = (),
    env_vars: Mapping[str, str] | None = None,
    extras: Sequence[str] = (),
    workspace: str | None = None,
) -> EnvironmentConfig:
    """``create_environment(pip_packages=["optax"], env_vars={"WANDB_MODE": "offline"})``."""
    return EnvironmentConfig(pip_packages=pip_packages, env_vars=env_vars or {}, extras=extras, workspace=workspace)


# ------------------------------------------------------------------------------------------- request


@attrs.frozen
class JobRequest:
    """A job: a name, what to run, on what, in which environment, with two retry budgets.

    ``max_retries_failure=N`` allows N retries after the user's code fails: at most N+1 attempts end
    FAILED. ``max_retries_preemption=N`` likewise bounds attempts that end PREEMPTED or UNSCHEDULABLE.

    >>> req = JobRequest(name="hello", entrypoint=Entrypoint(binary="echo", args=["hi"]))
    >>> req.max_retries_preemption
    100
    """

    name: str = attrs.field()
    entrypoint: Entrypoint = attrs.field()
    resources: ResourceConfig = attrs.field(factory=ResourceConfig)
    environment: EnvironmentConfig | None = attrs.field(default=None)
    max_retries_failure: int = attrs.field(default=0)
    max_retries_preemption: int = attrs.field(default=100)

    @name.validator
    def _check_name(self, _a: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"JobRequest.name: expected a non-empty str, got {value!r}")

    @entrypoint.validator
    def _check_entrypoint(self, _a: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, Entrypoint):
            raise TypeError(f"JobRequest.entrypoint: expected an Entrypoint, got {value!r}")

    @resources.validator
    def _check_resources(self, _a: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, ResourceConfig):
            raise TypeError(f"JobRequest.resources: expected a ResourceConfig, got {value!r}")

    @environment.validator
    def _check_environment(self, _a: attrs.Attribute, value: Any) -> None:
        if value is not None and not isinstance(value, EnvironmentConfig):
            raise TypeError(f"JobRequest.environment: expected create_environment(...), got {value!r}")

    @max_retries_failure.validator
    @max_retries_preemption.validator
    def _check_budget(self, a: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"JobRequest.{a.name}: expected an int >= 0, got {value!r}")

    @property
    def env_vars(self) -> dict[str, str]:
        return dict(self.environment.env_vars) if self.environment else {}


# -------------------------------------------------------------------------------------------- status


class JobStatus(str, enum.Enum):
    """Where a job is: PENDING -> RUNNING -> SUCCEEDED | FAILED | STOPPED."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)

    def __str__(self) -> str:
        return self.value


class AttemptOutcome(str, enum.Enum):
    """How one attempt ended."""

    SUCCEEDED = "SUCCEEDED"
    PREEMPTED = "PREEMPTED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    UNSCHEDULABLE = "UNSCHEDULABLE"

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
    hosts_started_at: float | None = None  # when every host had started (reported in); None: never

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "slices": list(self.slices),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "outcome": self.outcome.value if self.outcome else None,
            "cause": self.cause,
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
            hosts_started_at=d.get("hosts_started_at"),
        )


@attrs.define
class JobInfo:
    """A snapshot of a job. ``result`` is a list, one entry per process in (slice, host) order, from the
    successful attempt (``None`` until the job succeeds)."""

    job_id: JobId
    name: str
    status: JobStatus
    attempts: list[Attempt] = attrs.field(factory=list)
    preemptions: int = 0
    failures: int = 0
    error: str | None = None
    result: list[Any] | None = None
    submitted_at: float = attrs.field(factory=time.time)
    finished_at: float | None = None
    backend: str = "local"
    request_summary: dict[str, Any] = attrs.field(factory=dict)
    progress: str | None = None  # what the job is doing now, e.g. "waiting for 2 x v4-16"

    @property
    def current_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

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
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> JobInfo:
        return JobInfo(
            job_id=JobId(d["job_id"]),
            name=d["name"],
            status=JobStatus(d["status"]),
            attempts=[Attempt.from_json(a) for a in d.get("attempts") or []],
            preemptions=d.get("preemptions", 0),
            failures=d.get("failures", 0),
            error=d.get("error"),
            submitted_at=d.get("submitted_at") or 0.0,
            finished_at=d.get("finished_at"),
            backend=d.get("backend", "local"),
            request_summary=dict(d.get("request") or {}),
            progress=d.get("progress"),
        )


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
    }

"""What a caller builds to run a job: the request types, frozen attrs classes validated at construction.

:class:`JobRequest` (a name, an :class:`Entrypoint`, a :class:`ResourceConfig` with its device config
(:class:`CpuConfig`, :class:`GpuConfig`, :class:`TpuConfig`), an :class:`EnvironmentConfig`, the retry
budgets); what the cluster reports about a job is in :mod:`fray_core.status`.

Every validation error names the field, the value given and what is allowed::

    >>> ResourceConfig(cpu=-1)
    Traceback (most recent call last):
    ...
    ValueError: ResourceConfig.cpu: must be >= 0, got -1
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from fray_core.limits import (
    MAX_CPUS,
    MAX_GPUS,
    MAX_HOSTS_PER_JOB,
    MAX_REPLICAS,
    MAX_RETRIES,
    MAX_SECONDS,
    check_flag,
    check_name,
    check_path,
    is_finite,
    sequence_converter,
    show_number,
    show_text,
)
from fray_core.tpu import TpuSpec, get_tpu_spec, normalize_tpu_type

__all__ = [
    "JOB_KINDS",
    "MAX_SIZE",
    "CpuConfig",
    "DeviceConfig",
    "ElasticConfig",
    "Entrypoint",
    "EnvironmentConfig",
    "GpuConfig",
    "JobRequest",
    "ResourceConfig",
    "TpuConfig",
    "create_environment",
    "format_size",
    "parse_size",
]
#: the values of ``JobRequest.kind``: a job, or a held session (see :mod:`fray_core.session`)
JOB_KINDS = ("job", "session")

# ---------------------------------------------------------------------------------------------- sizes

_UNITS = {"": 1024**3, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtpb]?)(?:i?b)?\s*$", re.IGNORECASE)


#: the largest size accepted anywhere (1024p = 1 EiB): more is a typo, not a machine
MAX_SIZE = 1024 * _UNITS["p"]
# digits of a size's whole part: 1 EiB in bytes has 19, so more is over MAX_SIZE in any unit
_MAX_SIZE_DIGITS = 30


def parse_size(value: str | int | float, field: str = "size") -> int:
    """Parse a memory/disk size into bytes.

    Units are binary and case-insensitive: ``"512m"``, ``"16g"``, ``"16G"``, ``"16GiB"``, ``"1.5t"``.
    A bare number means **gigabytes** (``"16"`` and ``16`` are 16 GiB), because that is what call sites
    such as ``ResourceConfig(ram="16")`` mean. ``"100b"`` is 100 bytes. Sizes are finite, >= 0 and at most
    ``1024p``; anything else raises ``ValueError`` (``TypeError`` for a value that is not a str or number).

    >>> parse_size("16g") == parse_size("16") == 16 * 1024**3
    True
    """
    if isinstance(value, bool):
        raise TypeError(f"{field}: expected a size like '16g', got {value!r}")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{field}: expected a finite size like '16g' or a number of GiB, got {value!r}")
        if value < 0:
            raise ValueError(f"{field}: must be >= 0, got {show_number(value)}")
        nbytes = value * _UNITS[""]
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        if not m:
            raise ValueError(
                f"{field}: cannot parse size {value!r}; use a number with an optional unit "
                "b/k/m/g/t/p, e.g. '512m', '16g', '1.5t' (a bare number means GiB)"
            )
        scale = _UNITS[m.group(2).lower()]
        digits = m.group(1)
        if len(digits.split(".")[0].lstrip("0")) > _MAX_SIZE_DIGITS:  # int() of 5,000 digits raises; no size has 30
            raise ValueError(f"{field}: {show_text(value)} is more than the largest size allowed, 1024p (1 EiB)")
        # exact for integers of any length; a float for fractions (never inf: the regex allows no exponent)
        nbytes = int(digits) * scale if digits.isdigit() else float(digits) * scale
    else:
        raise TypeError(f"{field}: expected a size like '16g' or a number of GiB, got {value!r}")
    if nbytes > MAX_SIZE:
        shown = show_text(value) if isinstance(value, str) else show_number(value)
        raise ValueError(f"{field}: {shown} is more than the largest size allowed, 1024p (1 EiB)")
    return int(nbytes)


def format_size(nbytes: int) -> str:
    """The shortest exact spelling of a byte count: ``parse_size(format_size(n)) == n`` for every size.

    >>> format_size(16 * 1024**3), format_size(1536 * 1024**2), format_size(1000)
    ('16g', '1.5g', '1000b')
    """
    for unit in ("p", "t", "g", "m", "k"):
        scale = _UNITS[unit]
        if nbytes >= scale:
            text = f"{nbytes / scale:.3f}".rstrip("0").rstrip(".")
            if parse_size(f"{text}{unit}") == nbytes:
                return f"{text}{unit}"
    return f"{nbytes}b"


# -------------------------------------------------------------------------------------------- devices


@attrs.frozen
class CpuConfig:
    """No accelerator: the job's processes need only CPUs and memory."""

    kind: str = attrs.field(default="cpu", init=False)


def _check_positive_int(field: str, maximum: int, what: str) -> Callable[[Any, attrs.Attribute, Any], None]:
    """An int in ``[1, maximum]``: above ``maximum`` (``what`` of it allowed), a typo refused here rather than
    at ``launch`` or inside a backend."""

    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{field}: expected an int >= 1, got {value!r}")
        if value < 1:
            raise ValueError(f"{field}: must be >= 1, got {show_number(value)}")
        if value > maximum:
            raise ValueError(f"{field}: at most {maximum:,} {what} allowed, got {show_number(value)}")

    return check


@attrs.frozen
class GpuConfig:
    """``count`` GPUs of ``type`` (e.g. ``"A100"``, or ``"auto"`` for any) per process; at most
    :data:`~fray_core.limits.MAX_GPUS`.

    >>> GpuConfig(count=10**30)
    Traceback (most recent call last):
    ...
    ValueError: GpuConfig.count: at most 1,024 GPUs per process allowed, got an int of 31 digits
    """

    type: str = attrs.field(default="auto")
    count: int = attrs.field(default=1, validator=_check_positive_int("GpuConfig.count", MAX_GPUS, "GPUs per process"))
    kind: str = attrs.field(default="gpu", init=False)

    @type.validator
    def _check_type(self, _a: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"GpuConfig.type: expected a non-empty str like 'A100', got {value!r}")
        # a name's limits: the type is matched against device names and quoted in launch's messages
        check_name("GpuConfig.type", value)


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
        # ASCII digits, and few: int() of 5,000 digits raises, and no side of a pod has more than 2. No leading
        # zero: '02x2x2' has the right chips but is not the label a slice carries (Ray's ray.io/tpu-topology),
        # so no slice would ever match it
        if not isinstance(value, str) or not re.fullmatch(r"[1-9][0-9]{0,5}(x[1-9][0-9]{0,5}){1,2}", value):
            shown = show_text(value) if isinstance(value, str) else repr(value)
            raise ValueError(
                f"TpuConfig.topology: expected 2 or 3 sides of at most 6 digits each, without leading zeros, "
                f"e.g. '2x2x2', got {shown}"
            )
        sides = value.split("x")
        if len(sides) != spec.dimensions:
            # v4, v5p and v7x slices are 3-D tori, v5litepod and v6e 2-D: a shape of the other kind is no slice
            # of the type, and on Ray no slice is labelled with it (the job would wait forever)
            raise ValueError(
                f"TpuConfig.topology: {value!r} has {len(sides)} sides but {spec.generation} slices are "
                f"{spec.dimensions}-D: expected {spec.dimensions} sides whose product is {self.type}'s "
                f"{spec.chips} chips, like {spec.topology!r} (its default)"
            )
        n = 1
        for d in sides:
            n *= int(d)
        if n != spec.chips:
            raise ValueError(
                f"TpuConfig.topology: {value!r} has {n} chips but {self.type} has {spec.chips} "
                f"(default topology {spec.topology})"
            )
        if not spec.offers(value):
            # the right chips in a shape no slice has (v4-128 as 2x4x8): on Ray no slice is labelled with it
            raise ValueError(f"TpuConfig.topology: {value!r} is no shape of a {self.type} slice: {spec.shapes()}")

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


DeviceConfig = CpuConfig | GpuConfig | TpuConfig

# ----------------------------------------------------------------------------------------- resources


def _replicas_converter(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return value


def _check_number(field: str, minimum: float, maximum: int, what: str) -> Callable[[Any, attrs.Attribute, Any], None]:
    """A finite number in ``[minimum, maximum]`` (``what`` names the unit of ``maximum`` in the message)."""

    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{field}: expected a number >= {minimum:g}, got {value!r}")
        if not is_finite(value):  # also an int too large for a float (10**400): out of range
            raise ValueError(f"{field}: expected a finite number >= {minimum:g}, got {show_number(value)}")
        if value < minimum:
            raise ValueError(f"{field}: must be >= {minimum:g}, got {show_number(value)}")
        if value > maximum:
            raise ValueError(f"{field}: at most {maximum:,} {what} allowed, got {show_number(value)}")

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

    cpu: float = attrs.field(default=1, validator=_check_number("ResourceConfig.cpu", 0, MAX_CPUS, "CPUs per process"))
    ram: str | int | float = attrs.field(default="4g", validator=_check_size("ResourceConfig.ram"))
    disk: str | int | float = attrs.field(default="16g", validator=_check_size("ResourceConfig.disk"))
    device: DeviceConfig = attrs.field(factory=CpuConfig)
    replicas: int | tuple[int, ...] = attrs.field(default=1, converter=_replicas_converter)
    preemptible: bool = attrs.field(default=True)
    regions: tuple[str, ...] | None = attrs.field(
        default=None, converter=lambda v: tuple(v) if isinstance(v, (list, tuple)) else v
    )

    @preemptible.validator
    def _check_preemptible(self, _a: attrs.Attribute, value: Any) -> None:
        check_flag("ResourceConfig.preemptible", value)

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
                    listed = ", ".join(show_number(x) for x in value[:10]) + (", ..." if len(value) > 10 else "")
                    raise ValueError(
                        f"ResourceConfig.replicas: every entry must be an int >= 1, got {show_number(v)} in [{listed}]"
                    )
            if not isinstance(self.device, TpuConfig) and len(set(value)) > 1:
                raise ValueError(
                    f"ResourceConfig.replicas: a list of acceptable counts is only allowed for TPU "
                    f"slices (flexible multislice), got {list(value)} for {type(self.device).__name__}"
                )
            self._check_replica_limits(max(value))
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"ResourceConfig.replicas: expected an int >= 1 or a list of them, got {value!r}")
        if value < 1:
            raise ValueError(f"ResourceConfig.replicas: must be >= 1, got {show_number(value)}")
        self._check_replica_limits(value)

    def _check_replica_limits(self, largest: int) -> None:
        # Far above any real job: a typo fails here, in one line, not as a MemoryError or an endless
        # start-up inside the runner (fray_core.limits, docs/troubleshooting.md).
        if largest > MAX_REPLICAS:
            what = "slices per TPU job" if isinstance(self.device, TpuConfig) else "processes per job"
            shown = f"{largest:,}" if largest < 10**30 else show_number(largest)
            raise ValueError(f"ResourceConfig.replicas: at most {MAX_REPLICAS:,} {what} allowed, got {shown}")
        if isinstance(self.device, TpuConfig) and largest * self.hosts_per_replica > MAX_HOSTS_PER_JOB:
            raise ValueError(
                f"ResourceConfig.replicas: {largest:,} x {self.device.type} is {largest * self.hosts_per_replica:,} "
                f"host processes; at most {MAX_HOSTS_PER_JOB:,} per job allowed"
            )

    @regions.validator
    def _check_regions(self, _a: attrs.Attribute, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, str):
            raise TypeError(
                f"ResourceConfig.regions: expected a list of region names, got the string {value!r} "
                f"(write regions=[{value!r}])"
            )
        if not isinstance(value, tuple) or not all(isinstance(r, str) and r.strip() for r in value):
            raise ValueError(
                f"ResourceConfig.regions: expected a list of non-empty region names like ['us-central2'], got {value!r}"
            )

    @property
    def replica_counts(self) -> tuple[int, ...]:
        """Acceptable counts, largest first: ``replicas=[1, 2]`` gives ``(2, 1)``."""
        counts = self.replicas if isinstance(self.replicas, tuple) else (self.replicas,)
        return tuple(sorted(set(counts), reverse=True))

    @property
    def hosts_per_replica(self) -> int:
        """Host processes one replica runs: a TPU slice's hosts, else 1 (a job runs ``count * hosts_per_replica``
        for each of its ``replica_counts``).

        >>> ResourceConfig(device=TpuConfig(type="v4-32"), replicas=[1, 2]).hosts_per_replica
        4
        >>> ResourceConfig(replicas=3).hosts_per_replica
        1
        """
        return self.device.hosts if isinstance(self.device, TpuConfig) else 1

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


def _mapping_converter(field: str, example: str) -> Callable[[Any], dict[Any, Any]]:
    def convert(value: Any) -> dict[Any, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise TypeError(f"{field}: expected a mapping like {example}, got {value!r}")
        return dict(value)

    return convert


def _check_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Fail now, in the caller, when ``fn(*args, **kwargs)`` could not even be called (every host would fail).

    >>> _check_call(lambda steps: steps, (1,), {"step": 1})
    Traceback (most recent call last):
    ...
    TypeError: Entrypoint.function_args: <lambda>() cannot take args=(1,), function_args={'step': 1}: got an unexpected keyword argument 'step'
    """  # noqa: E501 - a doctest's expected exception message cannot be wrapped
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or extension without a signature: the hosts will tell
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        field = "function_args" if kwargs and "keyword" in str(e) else "args"
        name = getattr(fn, "__qualname__", None) or repr(fn)
        raise TypeError(
            f"Entrypoint.{field}: {name}() cannot take args={tuple(args)!r}, function_args={dict(kwargs)!r}: {e}"
        ) from None


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
    function_args: Mapping[str, Any] = attrs.field(
        factory=dict, converter=_mapping_converter("Entrypoint.function_args", "{'steps': 10}")
    )
    binary: str | None = None
    args: tuple[Any, ...] = attrs.field(
        default=(), converter=sequence_converter("Entrypoint.args", "arguments", "args=['--steps', '10']")
    )

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
            _check_call(self.callable, self.args, self.function_args)
        else:
            if not isinstance(self.binary, str) or not self.binary.strip():
                raise ValueError(f"Entrypoint.binary: expected a non-empty command, got {self.binary!r}")
            if self.function_args:
                raise ValueError("Entrypoint.function_args: only allowed with callable=..., not binary=...")
            if not all(isinstance(a, (str, int, float)) for a in self.args):
                raise TypeError(f"Entrypoint.args: command arguments must be strings, got {list(self.args)!r}")
            for a in (self.binary, *self.args):
                if "\0" in str(a):
                    raise ValueError(
                        f"Entrypoint: command {self.command!r} contains a NUL byte, which no command can hold"
                    )
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
        # the constructor's converter refuses a lone string (tuple("ab") is ('a', 'b')) and a non-iterable
        return Entrypoint(callable=fn, function_args=kwargs or {}, args=args)

    @staticmethod
    def from_binary(cmd: str, args: Sequence[str] = ()) -> Entrypoint:
        """``Entrypoint.from_binary("python", ["-c", "print(1)"])``."""
        return Entrypoint(binary=cmd, args=args)  # the converter refuses a lone string, as above

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
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise ValueError(
                f"EnvironmentConfig.env_vars: invalid variable name {k!r}; allowed: a non-empty str without '=' "
                "or NUL bytes"
            )
        if not isinstance(v, str):
            raise TypeError(f"EnvironmentConfig.env_vars[{k!r}]: values must be str, got {v!r}")
        if "\0" in v:
            raise ValueError(
                f"EnvironmentConfig.env_vars[{k!r}]: value {v!r} contains a NUL byte, which no process environment "
                "can hold"
            )


def _check_packages(_inst: Any, _a: attrs.Attribute, value: tuple[Any, ...]) -> None:
    for p in value:
        if not isinstance(p, str) or not p.strip():
            raise ValueError(
                f"EnvironmentConfig.pip_packages: every entry must be a non-empty requirement like 'optax>=0.2', "
                f"got {p!r} in {list(value)}"
            )


def _check_extras(_inst: Any, _a: attrs.Attribute, value: tuple[Any, ...]) -> None:
    if value:
        raise ValueError(
            f"EnvironmentConfig.extras: no backend installs extras (got {list(value)!r}); list what the job needs in "
            "pip_packages instead, e.g. pip_packages=['myproject[tpu]'] (the Ray backend installs them through "
            "runtime_env; the local backend warns about the ones this Python lacks). Allowed: () only"
        )


def _check_workspace(_inst: Any, _a: attrs.Attribute, value: Any) -> None:
    check_path("EnvironmentConfig.workspace", value)


@attrs.frozen
class EnvironmentConfig:
    """The software environment of every process: pip packages, env vars and a working dir.

    On Ray these become the ``runtime_env`` (pip, env_vars, working_dir). Locally nothing is installed:
    ``launch`` warns about pip packages this Python lacks, and ``workspace`` is the processes' working
    directory (and first on their ``sys.path``). ``extras`` is kept for signature compatibility and must stay
    empty: no backend installs extras, so name the packages (``"myproject[tpu]"``) in ``pip_packages``.

    >>> EnvironmentConfig(pip_packages=["optax"], env_vars={"WANDB_MODE": "offline"}).pip_packages
    ('optax',)
    """

    pip_packages: tuple[str, ...] = attrs.field(
        default=(),
        converter=sequence_converter("EnvironmentConfig.pip_packages", "requirements", "pip_packages=['numpy']"),
        validator=_check_packages,
    )
    env_vars: Mapping[str, str] = attrs.field(
        factory=dict,
        converter=_mapping_converter("EnvironmentConfig.env_vars", "{'WANDB_MODE': 'offline'}"),
        validator=_check_env_vars,
    )
    extras: tuple[str, ...] = attrs.field(
        default=(),
        converter=sequence_converter("EnvironmentConfig.extras", "extras", "extras=['tpu']"),
        validator=_check_extras,
    )
    workspace: str | None = attrs.field(
        default=None, converter=lambda v: os.fspath(v) if isinstance(v, os.PathLike) else v, validator=_check_workspace
    )
    #: Ray's name for ``workspace`` (``runtime_env["working_dir"]``): give one or the other. On Ray the
    #: directory is shipped to the cluster; without either, the directory of the entrypoint's module is, when
    #: that module is not installed here (see ``fray_ray.code``).
    working_dir: str | None = attrs.field(
        default=None,
        kw_only=True,
        eq=False,
        repr=False,
        converter=lambda v: os.fspath(v) if isinstance(v, os.PathLike) else v,
    )

    def __attrs_post_init__(self) -> None:
        if self.working_dir is None:
            return
        _check_workspace(self, None, self.working_dir)  # type: ignore[arg-type]
        if self.workspace is not None and self.workspace != self.working_dir:
            raise ValueError(
                f"EnvironmentConfig: working_dir={self.working_dir!r} and workspace={self.workspace!r} "
                f"name the same thing; give one"
            )
        object.__setattr__(self, "workspace", self.working_dir)
        object.__setattr__(self, "working_dir", None)  # one field holds it: records and equality see workspace

    @staticmethod
    def create(
        pip_packages: Sequence[str] = (),
        env_vars: Mapping[str, str] | None = None,
        extras: Sequence[str] = (),
        workspace: str | None = None,
    ) -> EnvironmentConfig:
        """marin's spelling of :func:`create_environment`.

        >>> EnvironmentConfig.create(env_vars={"WANDB_MODE": "offline"}).env_vars
        {'WANDB_MODE': 'offline'}
        """
        return create_environment(pip_packages=pip_packages, env_vars=env_vars, extras=extras, workspace=workspace)


def create_environment(
    pip_packages: Sequence[str] = (),
    env_vars: Mapping[str, str] | None = None,
    extras: Sequence[str] = (),
    workspace: str | None = None,
) -> EnvironmentConfig:
    """``create_environment(pip_packages=["optax"], env_vars={"WANDB_MODE": "offline"})``."""
    return EnvironmentConfig(pip_packages=pip_packages, env_vars=env_vars or {}, extras=extras, workspace=workspace)


# ------------------------------------------------------------------------------------------- request


def _check_seconds(field: str, *, positive: bool) -> Callable[[Any, attrs.Attribute, Any], None]:
    allowed = "> 0" if positive else ">= 0"

    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not is_finite(value)
            or (value <= 0 if positive else value < 0)
            or value > MAX_SECONDS
        ):
            raise ValueError(f"{field}: expected seconds {allowed}, got {show_number(value)}")

    return check


@attrs.frozen
class ElasticConfig:
    """Elastic multislice: a TPU job with several acceptable slice counts grows when slices free up.

    The job starts on the largest acceptable count that fits (as any job with ``replicas=[...]``). While it
    runs below the largest count, once more slices have been free (and not reserved for a job waiting in
    the fleet's queue) for ``grow_after`` seconds without a break, the runner stops the attempt gracefully
    (SIGTERM to every host, ``grace`` seconds to checkpoint, then kill) and starts the next attempt on the
    larger count. That attempt ends ``RESIZED``, which spends no retry budget. A preempted slice ends the
    attempt as usual (PREEMPTED) and the next attempt takes what fits: the job shrinks. Hosts see
    ``FRAY_ELASTIC=1`` and ``FRAY_ELASTIC_GRACE`` (seconds) in their env.

    >>> ElasticConfig(grow_after=600.0, grace=30.0).grace
    30.0
    >>> ElasticConfig(grow_after=0)
    Traceback (most recent call last):
    ...
    ValueError: ElasticConfig.grow_after: expected seconds > 0, got 0
    """

    grow_after: float = attrs.field(default=600.0, validator=_check_seconds("ElasticConfig.grow_after", positive=True))
    grace: float = attrs.field(default=30.0, validator=_check_seconds("ElasticConfig.grace", positive=False))

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "grow_after", float(self.grow_after))
        object.__setattr__(self, "grace", float(self.grace))


@attrs.frozen
class JobRequest:
    """A job: a name, what to run, on what, in which environment, with two retry budgets.

    ``max_retries_failure=N`` allows N retries after the user's code fails: at most N+1 attempts end
    FAILED. ``max_retries_preemption=N`` likewise bounds attempts that end PREEMPTED or UNSCHEDULABLE.
    ``elastic``: an :class:`ElasticConfig` lets a TPU job with several acceptable slice counts
    (``replicas=[4, 2, 1]``) grow to a larger count when slices free up (attempts ended to grow are
    RESIZED and spend no budget).

    Stall detection, for hosts that call ``fray_core.heartbeat(step)``: ``stall_timeout=s`` ends an attempt
    STALLED when a host that has sent a heartbeat sends none for ``s`` seconds (a hang after progress: spends
    the failure budget); ``startup_timeout=s`` ends it STALLED when some host has not sent its first
    heartbeat ``s`` seconds after the attempt's hosts were started (an init hang: spends the preemption
    budget). Before the hosts are stopped, the stacks of all their threads go to the job log.

    ``kind``: ``"job"`` (the default: the entrypoint runs once per host and the job ends), or ``"session"``
    for held slices (:meth:`Cluster.hold <fray_core.cluster.Cluster.hold>` sets it): every host runs a
    persistent worker, a callable, that takes calls until the session is closed. The job's record and
    ``JobInfo.kind`` say which; nothing else looks at the entrypoint to tell.

    >>> req = JobRequest(name="hello", entrypoint=Entrypoint(binary="echo", args=["hi"]))
    >>> req.max_retries_preemption, req.kind
    (100, 'job')
    >>> JobRequest(name="hello", entrypoint=Entrypoint(binary="echo"), kind="sessions")
    Traceback (most recent call last):
    ...
    ValueError: JobRequest.kind: expected 'job' or 'session', got 'sessions'
    """

    name: str = attrs.field()
    entrypoint: Entrypoint = attrs.field()
    resources: ResourceConfig = attrs.field(factory=ResourceConfig)
    environment: EnvironmentConfig | None = attrs.field(default=None)
    max_retries_failure: int = attrs.field(default=0)
    max_retries_preemption: int = attrs.field(default=100)
    elastic: ElasticConfig | None = attrs.field(default=None)
    stall_timeout: float | None = attrs.field(default=None)
    startup_timeout: float | None = attrs.field(default=None)
    kind: str = attrs.field(default="job")

    @kind.validator
    def _check_kind(self, _a: attrs.Attribute, value: Any) -> None:
        if value not in JOB_KINDS:
            raise ValueError(f"JobRequest.kind: expected 'job' or 'session', got {value!r}")
        if value == "session" and self.entrypoint.callable is None:
            # a session's hosts run its worker loop (a callable); a binary cannot take calls
            raise ValueError(
                f"JobRequest.kind: 'session' needs a callable entrypoint (the session's worker), got "
                f"{self.entrypoint.describe()!r}"
            )

    @stall_timeout.validator
    @startup_timeout.validator
    def _check_timeout(self, a: attrs.Attribute, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not is_finite(value) or value <= 0:
            raise ValueError(f"JobRequest.{a.name}: expected seconds > 0 or None, got {show_number(value)}")
        if value > MAX_SECONDS:
            raise ValueError(
                f"JobRequest.{a.name}: expected seconds > 0 or None, got {value!r} (at most {MAX_SECONDS:g})"
            )

    @name.validator
    def _check_name(self, _a: attrs.Attribute, value: Any) -> None:
        check_name("JobRequest.name", value)

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
            raise ValueError(f"JobRequest.{a.name}: expected an int >= 0, got {show_number(value)}")
        if value > MAX_RETRIES:  # a typo: no job retries a million times, and a record holds at most 19 digits
            raise ValueError(f"JobRequest.{a.name}: at most {MAX_RETRIES:,} retries allowed, got {show_number(value)}")

    @elastic.validator
    def _check_elastic(self, _a: attrs.Attribute, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, ElasticConfig):
            raise TypeError(
                f"JobRequest.elastic: expected ElasticConfig(grow_after=..., grace=...) or None, got {value!r}"
            )
        res = self.resources
        if not isinstance(res.device, TpuConfig) or len(res.replica_counts) < 2:
            what = "TPU" if isinstance(res.device, TpuConfig) else type(res.device).__name__
            got = list(res.replicas) if isinstance(res.replicas, tuple) else res.replicas
            raise ValueError(
                f"JobRequest.elastic: needs a TPU device and more than one acceptable slice count, "
                f"e.g. ResourceConfig(device=TpuConfig(type='v4-16'), replicas=[4, 2, 1]); got {what} with "
                f"replicas={got!r}"
            )

    @property
    def env_vars(self) -> dict[str, str]:
        return dict(self.environment.env_vars) if self.environment else {}

"""The request types: validation in the caller, with messages naming field, value and what is allowed."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fray_core import (
    CpuConfig,
    Entrypoint,
    GpuConfig,
    JobInfo,
    JobRequest,
    JobStatus,
    ResourceConfig,
    TpuConfig,
    create_environment,
    parse_size,
)
from fray_core.status import summarize_request
from fray_core.tpu import TPU_CATALOG, TPU_GENERATIONS, get_tpu_spec


def work(x: int = 1) -> int:
    return x


# ------------------------------------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("16g", 16 * 1024**3),
        ("16G", 16 * 1024**3),
        ("10G", 10 * 1024**3),
        ("16", 16 * 1024**3),  # marin call sites write ram="16" meaning 16 GB
        (16, 16 * 1024**3),
        ("512m", 512 * 1024**2),
        ("1.5t", int(1.5 * 1024**4)),
        ("16GiB", 16 * 1024**3),
        ("100b", 100),
    ],
)
def test_parse_size_accepts_the_spellings_call_sites_use(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "16x", "", "-1g", "1.2.3g"])
def test_parse_size_rejects_garbage_naming_field_and_value(bad: str) -> None:
    with pytest.raises(ValueError, match=rf"ResourceConfig\.ram: cannot parse size {re.escape(repr(bad))}"):
        ResourceConfig(ram=bad)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["k", "m", "g", "t", "K", "M", "G", "T"]))
def test_parse_size_units_scale_by_1024(n: int, unit: str) -> None:
    power = "kmgt".index(unit.lower()) + 1
    assert parse_size(f"{n}{unit}") == n * 1024**power
    assert parse_size(f"{n}{unit}") == parse_size(f"{n} {unit.lower()}")


@given(st.floats(min_value=0, max_value=1e4, allow_nan=False))
def test_bare_numbers_are_gigabytes(x: float) -> None:
    assert parse_size(x) == int(x * 1024**3)


# ---------------------------------------------------------------------------------------------- catalog


def test_catalog_covers_every_generation_and_the_documented_shapes() -> None:
    assert {s.generation for s in TPU_CATALOG.values()} == set(TPU_GENERATIONS)
    expect = {  # pod type: (chips, hosts) from ray-tpu-facts.md
        "v4-8": (4, 1), "v4-16": (8, 2), "v4-32": (16, 4), "v4-4096": (2048, 512),
        "v5p-16": (8, 2), "v5p-12288": (6144, 1536),
        "v5litepod-1": (1, 1), "v5litepod-2": (2, 1), "v5litepod-8": (8, 1), "v5litepod-16": (16, 4),
        "v5litepod-256": (256, 64),
        "v6e-4": (4, 1), "v6e-16": (16, 4), "v6e-256": (256, 64),
        "v7x-8": (4, 1), "v7x-16": (8, 2), "v7x-128": (64, 16),
    }  # fmt: skip
    for name, (chips, hosts) in expect.items():
        spec = get_tpu_spec(name)
        assert (spec.chips, spec.hosts) == (chips, hosts), name
    assert get_tpu_spec("v4-16").topology == "2x2x2"


@given(st.sampled_from(sorted(TPU_CATALOG)))
def test_catalog_invariants(name: str) -> None:
    spec = TPU_CATALOG[name]
    assert spec.chips == spec.hosts * spec.chips_per_host
    suffix = int(name.rsplit("-", 1)[1])
    # the suffix counts TensorCores (2 per chip) for v4/v5p/v7x and chips for v5litepod/v6e
    assert suffix == spec.chips * (2 if spec.generation in ("v4", "v5p", "v7x") else 1)
    assert spec.chips_per_host in (1, 2, 4, 8)
    if spec.hosts > 1:
        assert spec.chips_per_host == 4
    assert math.prod(int(d) for d in spec.topology.split("x")) == spec.chips
    tpu = TpuConfig(type=name)
    assert (tpu.hosts, tpu.chips, tpu.chips_per_host) == (spec.hosts, spec.chips, spec.chips_per_host)


def test_gcp_spellings_are_accepted() -> None:
    assert TpuConfig(type="tpu7x-16").type == "v7x-16"
    assert TpuConfig(type="v5e-4").type == "v5litepod-4"


@pytest.mark.parametrize("bad, suggestion", [("v4-12", "v4-16"), ("v4-17", "v4-16"), ("v5litepod-3", "v5litepod-4")])
def test_unknown_tpu_type_suggests_nearest(bad: str, suggestion: str) -> None:
    with pytest.raises(ValueError) as e:
        TpuConfig(type=bad)
    msg = str(e.value)
    assert msg.startswith("TpuConfig.type:") and repr(bad) in msg and suggestion in msg


def test_unknown_generation_lists_generations() -> None:
    with pytest.raises(ValueError, match=r"TpuConfig.type: unknown TPU type 'v9-8'.*generations: v4, v5p"):
        TpuConfig(type="v9-8")


def test_topology_must_match_the_chip_count() -> None:
    assert TpuConfig(type="v4-16", topology="2x2x2").resolved_topology == "2x2x2"
    with pytest.raises(ValueError, match=r"TpuConfig.topology: '2x2x4' has 16 chips but v4-16 has 8"):
        TpuConfig(type="v4-16", topology="2x2x4")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def _shapes(draw: st.DrawFn) -> tuple[str, list[int]]:
    """A catalog type and sides whose product is its chips, of 2 or 3 dimensions (either, whatever the type)."""
    spec = TPU_CATALOG[draw(st.sampled_from(sorted(TPU_CATALOG)))]
    a = draw(st.sampled_from(_divisors(spec.chips)))
    if draw(st.booleans()):
        return spec.name, [a, spec.chips // a]
    b = draw(st.sampled_from(_divisors(spec.chips // a)))
    return spec.name, [a, b, spec.chips // a // b]


@given(_shapes())
def test_a_topology_is_accepted_exactly_when_it_has_the_generations_dimensions(shape: tuple[str, list[int]]) -> None:
    """v4, v5p and v7x slices are 3-D tori, v5litepod and v6e 2-D: ``TpuConfig("v4-16", topology="2x4")`` has
    the right chips but is no v4 slice (on Ray no slice carries that label: the job waited for ever). Of the
    right dimensions, a shape is taken exactly when the type offers it (its default; the larger v4/v5p tori,
    sides multiples of 4; tests/test_tpu_catalog.py checks that rule against Ray's table)."""
    name, sides = shape
    spec = get_tpu_spec(name)
    topology = "x".join(map(str, sides))
    if len(sides) == (3 if spec.generation in ("v4", "v5p", "v7x") else 2):
        if spec.offers(topology):
            assert TpuConfig(type=name, topology=topology).resolved_topology == topology
        else:
            with pytest.raises(ValueError, match=rf"^TpuConfig\.topology: '{topology}' is no shape of a {name} slice"):
                TpuConfig(type=name, topology=topology)
        return
    with pytest.raises(ValueError) as e:
        TpuConfig(type=name, topology=topology)
    assert str(e.value) == (
        f"TpuConfig.topology: {topology!r} has {len(sides)} sides but {spec.generation} slices are "
        f"{spec.dimensions}-D: expected {spec.dimensions} sides whose product is {name}'s {spec.chips} chips, like "
        f"{spec.topology!r} (its default)"
    )


def test_a_topology_of_the_wrong_dimension_names_the_shapes_allowed() -> None:
    with pytest.raises(ValueError, match=r"^TpuConfig\.topology: '2x4' has 2 sides but v4 slices are 3-D: .*'2x2x2'"):
        TpuConfig(type="v4-16", topology="2x4")
    with pytest.raises(ValueError, match=r"'2x2x2' has 3 sides but v5litepod slices are 2-D: .* like '2x4'"):
        TpuConfig(type="v5e-8", topology="2x2x2")
    assert TpuConfig(type="v4-256", topology="4x8x4").resolved_topology == "4x8x4"  # any order, as Ray takes it


def test_a_topology_with_a_leading_zero_is_refused() -> None:
    """``'02x2x2'`` has v4-16's 8 chips, but no slice is labelled with it: on Ray the job waited for ever."""
    with pytest.raises(ValueError, match=r"^TpuConfig\.topology: .*without leading zeros.*, got '02x2x2'$"):
        TpuConfig(type="v4-16", topology="02x2x2")


@pytest.mark.parametrize(
    "bad",
    ["v4-\u00b2", "v4-\u0661\u0666", "v4-" + "1" * 400, "v4-" + "1" * 5000, "x" * 5000],
    ids=["superscript", "arabic-indic", "400-digits", "5000-digits", "5000-chars"],
)
def test_a_tpu_type_that_is_not_ascii_digits_or_is_huge_gets_the_unknown_type_message(bad: str) -> None:
    """``int('²')``, ``log2`` of 10**400 and ``int()`` of 5,000 digits each raised their own message."""
    with pytest.raises(ValueError, match=r"^TpuConfig\.type: unknown TPU type .*\((valid v4 types|generations)") as e:
        TpuConfig(type=bad)
    assert len(str(e.value)) < 400 and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "bad", ["9" * 5000 + "x1", "2x2x\u0662", "1x" + "0" * 400 + "8"], ids=["5000-digits", "arabic-indic", "zeros"]
)
def test_a_topology_of_huge_or_non_ascii_sides_names_the_field(bad: str) -> None:
    with pytest.raises(ValueError, match=r"^TpuConfig\.topology: expected 2 or 3 sides of at most 6 digits") as e:
        TpuConfig(type="v4-16", topology=bad)
    assert len(str(e.value)) < 300


@pytest.mark.parametrize("field", ["ram", "disk"])
@pytest.mark.parametrize(
    "bad", ["9" * 5000, "9" * 5000 + "g", "0" * 5000 + "1" * 5000, 10**5000], ids=["digits", "unit", "zeros", "int"]
)
def test_a_size_of_thousands_of_digits_names_the_field(field: str, bad: object) -> None:
    """``int()`` of more than 4,300 digits raised Python's own limit message, not the field's."""
    with pytest.raises(ValueError, match=rf"^ResourceConfig\.{field}: ") as e:
        ResourceConfig(**{field: bad})
    assert len(str(e.value)) < 300


# -------------------------------------------------------------------------------------------- resources


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"cpu": -1}, r"ResourceConfig.cpu: must be >= 0, got -1"),
        ({"replicas": 0}, r"ResourceConfig.replicas: must be >= 1, got 0"),
        ({"replicas": []}, r"ResourceConfig.replicas: an empty list allows nothing"),
        (
            {"replicas": [1, 0], "device": TpuConfig(type="v4-8")},
            r"ResourceConfig.replicas: every entry must be an int >= 1, got 0",
        ),
        ({"replicas": [1, 2]}, r"only allowed for TPU slices"),
        ({"disk": "big"}, r"ResourceConfig.disk: cannot parse size 'big'"),
        ({"device": "tpu"}, r"ResourceConfig.device: expected CpuConfig\(\), GpuConfig\(...\) or TpuConfig"),
    ],
)
def test_bad_resources_fail_at_construction(kwargs: dict, pattern: str) -> None:
    with pytest.raises((ValueError, TypeError), match=pattern):
        ResourceConfig(**kwargs)


def test_replicas_list_means_acceptable_slice_counts_largest_first() -> None:
    res = ResourceConfig.with_tpu("v4-16", slice_count=[1, 2])
    assert res.replicas == (1, 2) and res.replica_counts == (2, 1)
    assert res.is_tpu and res.device == TpuConfig(type="v4-16")


def test_helpers_build_the_same_configs_as_the_constructor() -> None:
    assert ResourceConfig.with_tpu("v5p-16", slice_count=2, cpu=8) == ResourceConfig(
        cpu=8, device=TpuConfig(type="v5p-16"), replicas=2
    )
    assert ResourceConfig.with_gpu("A100", count=8, ram="64g").device == GpuConfig(type="A100", count=8)
    assert ResourceConfig.with_cpu(cpu=4) == ResourceConfig(cpu=4, device=CpuConfig())
    with pytest.raises(ValueError, match=r"GpuConfig.count: must be >= 1, got 0"):
        GpuConfig(count=0)


# ------------------------------------------------------------------------------------------- entrypoint


def test_entrypoint_needs_exactly_one_kind() -> None:
    with pytest.raises(ValueError, match=r"Entrypoint: give exactly one of callable=... or binary=..., got neither"):
        Entrypoint()
    with pytest.raises(ValueError, match=r"got both"):
        Entrypoint(callable=work, binary="python")
    with pytest.raises(TypeError, match=r"Entrypoint.callable: expected a callable, got 3"):
        Entrypoint(callable=3)  # type: ignore[arg-type]


def test_entrypoint_arguments_that_the_callable_cannot_take_fail_at_construction() -> None:
    """Every host would fail the same way: the caller hears it now, with the field and the values."""

    def train(steps: int, *, lr: float = 1e-3) -> None: ...

    Entrypoint.from_callable(train, args=(10,), kwargs={"lr": 0.1})
    Entrypoint(callable=train, function_args={"steps": 10})
    with pytest.raises(
        TypeError, match=r"Entrypoint\.args: .*train\(\) cannot take args=\(\), .*missing a required argument: 'steps'"
    ):
        Entrypoint(callable=train)
    with pytest.raises(TypeError, match=r"Entrypoint\.args: .*too many positional arguments"):
        Entrypoint.from_callable(train, args=(10, 0.1))
    with pytest.raises(TypeError, match=r"Entrypoint\.function_args: .*unexpected keyword argument 'step'"):
        Entrypoint.from_callable(train, args=(10,), kwargs={"step": 1})
    Entrypoint(callable=print, args=(1, 2))  # no signature to check against: the hosts will tell


def test_entrypoint_constructors_agree() -> None:
    assert Entrypoint.from_callable(work, kwargs={"x": 2}) == Entrypoint(callable=work, function_args={"x": 2})
    ep = Entrypoint.from_binary("python", ["-c", "print(1)"])
    assert ep.command == ["python", "-c", "print(1)"]
    assert Entrypoint.from_callable(work, args=(5,)).positional == (5,)


@pytest.mark.parametrize("args", ["hi", b"hi", 1, object()], ids=["str", "bytes", "int", "object"])
def test_entrypoint_helpers_refuse_a_string_or_a_non_iterable_for_args(args: object) -> None:
    """``from_binary("echo", "hi")`` ran ``echo h i``: the helpers called tuple() before the constructor's guard."""
    with pytest.raises(TypeError, match=r"^Entrypoint\.args: expected a list of arguments, got"):
        Entrypoint.from_binary("echo", args)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^Entrypoint\.args: expected a list of arguments, got"):
        Entrypoint.from_callable(print, args=args)  # type: ignore[arg-type]
    assert Entrypoint.from_binary("echo", ["hi"]).command == ["echo", "hi"]
    assert Entrypoint.from_callable(print, args=iter([1, 2])).positional == (1, 2)


# ---------------------------------------------------------------------------------------------- request


def test_job_request_defaults_and_validation() -> None:
    req = JobRequest(name="x", entrypoint=Entrypoint(callable=work))
    assert (req.max_retries_failure, req.max_retries_preemption) == (0, 100)
    assert req.resources == ResourceConfig()
    with pytest.raises(ValueError, match=r"JobRequest.name: expected a non-empty str, got ''"):
        JobRequest(name="", entrypoint=Entrypoint(callable=work))
    with pytest.raises(ValueError, match=r"JobRequest.max_retries_failure: expected an int >= 0, got -1"):
        JobRequest(name="x", entrypoint=Entrypoint(callable=work), max_retries_failure=-1)
    with pytest.raises(ValueError, match=r"^JobRequest.name: a name with a NUL byte is not allowed, got 'a\\x00b'"):
        JobRequest(name="a\0b", entrypoint=Entrypoint(callable=work))
    with pytest.raises(TypeError, match=r"JobRequest.entrypoint: expected an Entrypoint"):
        JobRequest(name="x", entrypoint=work)  # type: ignore[arg-type]


def test_a_session_is_marked_by_the_request_kind_not_by_its_entrypoint() -> None:
    """``JobRequest.kind`` says whether a request is a held session; the record keeps it as given, whatever the
    entrypoint is, and a kind that cannot work fails at construction naming the field."""
    job = JobRequest(name="x", entrypoint=Entrypoint(callable=work))
    session = JobRequest(name="x", entrypoint=Entrypoint(callable=work), kind="session")
    assert (job.kind, summarize_request(job)["kind"]) == ("job", "job")
    assert (session.kind, summarize_request(session)["kind"]) == ("session", "session")
    info = JobInfo(job_id="j", name="x", status=JobStatus.RUNNING, request_summary=summarize_request(session))  # type: ignore[arg-type]
    assert JobInfo.from_json(info.to_json()).kind == "session"
    with pytest.raises(ValueError, match=r"JobRequest.kind: expected 'job' or 'session', got 'Session'"):
        JobRequest(name="x", entrypoint=Entrypoint(callable=work), kind="Session")
    with pytest.raises(ValueError, match=r"JobRequest.kind: 'session' needs a callable entrypoint .*'echo hi'"):
        JobRequest(name="x", entrypoint=Entrypoint(binary="echo", args=["hi"]), kind="session")


def test_request_and_status_modules_split_the_types_and_types_keeps_every_old_name() -> None:
    """What a caller builds lives in ``fray_core.request``, what the cluster reports in ``fray_core.status``;
    ``fray_core.types`` re-exports both, so every existing import keeps working."""
    import fray_core.request
    import fray_core.status
    import fray_core.types

    assert JobRequest.__module__ == "fray_core.request" and JobInfo.__module__ == "fray_core.status"
    assert not set(fray_core.request.__all__) & set(fray_core.status.__all__)
    for name in fray_core.types.__all__:
        home = fray_core.request if name in fray_core.request.__all__ else fray_core.status
        assert getattr(fray_core.types, name) is getattr(home, name), name


def test_environment_env_vars_are_validated() -> None:
    env = create_environment(pip_packages=["optax"], env_vars={"WANDB_MODE": "offline"})
    assert env.pip_packages == ("optax",) and env.env_vars == {"WANDB_MODE": "offline"}
    with pytest.raises(TypeError, match=r"EnvironmentConfig.env_vars\['N'\]: values must be str, got 1"):
        create_environment(env_vars={"N": 1})  # type: ignore[dict-item]


def test_job_status_terminal_states_and_info_round_trip() -> None:
    assert [s for s in JobStatus if s.is_terminal()] == [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED]
    info = JobInfo(job_id="j", name="n", status=JobStatus.RUNNING, preemptions=2)  # type: ignore[arg-type]
    assert JobInfo.from_json(info.to_json()) == info

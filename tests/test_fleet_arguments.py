"""The simulated fleet's arguments, checked at construction (audit: each was checked only when used).

``TpuFleet(fault_plan=...)``, ``TpuFleet(state_dir=...)``, ``LocalCluster(fleet=..., jobs_dir=...)``, the
fault events (``FailHost(crash=...)``, ``DropCapacity(tpu_type=...)``) and the rest of that family: a wrong
argument used to surface at the first attempt, the first host start or the first launch (or as a bare
``AttributeError``), far from the line that made it. Now each fails where it is made, in one line naming the
argument, the value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fray_core.clock import FakeClock
from fray_core.fleet import DirtyHost, DropCapacity, FailHost, FaultPlan, Fleet, PreemptSlice
from fray_local import LocalCluster, LocalClusterConfig, TpuFleet
from fray_local.fleet import parse_fleet

# (what is made, the exception, the whole message): the message is the contract, so it is compared whole
REFUSED: dict[str, tuple[Callable[[], object], type[Exception], str]] = {
    "TpuFleet.fault_plan": (
        lambda: TpuFleet(fault_plan="chaos"),  # type: ignore[arg-type]
        TypeError,
        "TpuFleet: fault_plan: expected a FaultPlan([...]) or None, got 'chaos'",
    ),
    "TpuFleet.fault_plan (a list)": (
        lambda: TpuFleet(fault_plan=[PreemptSlice(attempt=0)]),  # type: ignore[arg-type]
        TypeError,
        "TpuFleet: fault_plan: expected a FaultPlan([...]) or None, got "
        "[PreemptSlice(attempt=0, slice_index=0, after=0.5, restore_after=0.0)]",
    ),
    "TpuFleet.state_dir": (
        lambda: TpuFleet(state_dir=5),  # type: ignore[arg-type]
        TypeError,
        "TpuFleet: state_dir: expected a directory path (str) or None, got 5",
    ),
    "TpuFleet.state_dir (a file)": (
        lambda: TpuFleet(state_dir="/dev/null"),
        ValueError,
        "TpuFleet: state_dir: expected a directory (made if missing), got the file '/dev/null'",
    ),
    "TpuFleet.capacity": (
        lambda: TpuFleet(capacity=2),  # type: ignore[arg-type]
        TypeError,
        "TpuFleet: capacity: expected a mapping of TPU type to slice count like {'v4-16': 2}, got 2",
    ),
    "TpuFleet.capacity (a type)": (
        lambda: TpuFleet({16: 2}),  # type: ignore[dict-item]
        TypeError,
        "TpuFleet: capacity: expected a TPU type (str) like 'v4-16', got 16",
    ),
    "TpuFleet.on_demand": (
        lambda: TpuFleet(on_demand="no"),  # type: ignore[arg-type]
        TypeError,
        "TpuFleet: on_demand: expected True or False, got 'no'",
    ),
    "TpuFleet.clean_lockfiles": (
        lambda: TpuFleet(clean_lockfiles="no"),  # type: ignore[arg-type]
        TypeError,
        "TpuFleet: clean_lockfiles: expected True or False, got 'no'",
    ),
    "TpuFleet.detection_delay": (
        lambda: TpuFleet(detection_delay=1e300),
        ValueError,
        "TpuFleet: detection_delay: expected a finite number of seconds >= 0 (at most 1e+09), got 1e+300",
    ),
    "Fleet.clock": (
        lambda: Fleet(clock=5),  # type: ignore[arg-type]
        TypeError,
        "Fleet: clock: expected a FleetClock (now() and call_later()) or None, got 5",
    ),
    "Fleet.on_dirt": (
        lambda: Fleet(on_dirt="rm -rf"),  # type: ignore[arg-type]
        TypeError,
        "Fleet: on_dirt: expected a callable or None, got 'rm -rf'",
    ),
    "LocalCluster.fleet": (
        lambda: LocalCluster(fleet="v4-16:2"),  # type: ignore[arg-type]
        TypeError,
        "LocalCluster.fleet: expected a TpuFleet({'v4-16': 2}) or None (slices made on demand), got 'v4-16:2'",
    ),
    "LocalCluster.jobs_dir": (
        lambda: LocalCluster(jobs_dir=5),  # type: ignore[arg-type]
        TypeError,
        "LocalCluster.jobs_dir: expected a directory path or URL (str) or None, got 5",
    ),
    "LocalCluster.retry_policy": (
        lambda: LocalCluster(retry_policy={"backoff_initial": 1.0}),  # type: ignore[arg-type]
        TypeError,
        "LocalCluster.retry_policy: expected a RetryPolicy(...) or None (DEFAULT_LOCAL_POLICY), got "
        "{'backoff_initial': 1.0}",
    ),
    "LocalCluster.config": (
        lambda: LocalCluster(config={"log_to": "logging"}),  # type: ignore[arg-type]
        TypeError,
        "LocalCluster.config: expected a LocalClusterConfig(...) or None, got {'log_to': 'logging'}",
    ),
    "LocalClusterConfig.fleet": (
        lambda: LocalClusterConfig(fleet={"v4-16": 2}),  # type: ignore[arg-type]
        TypeError,
        "LocalClusterConfig.fleet: expected a TpuFleet({'v4-16': 2}) or None (slices made on demand), got {'v4-16': 2}",
    ),
    "LocalClusterConfig.jobs_dir": (
        lambda: LocalClusterConfig(jobs_dir=5),  # type: ignore[arg-type]
        TypeError,
        "LocalClusterConfig.jobs_dir: expected a directory path or URL (str) or None, got 5",
    ),
    "LocalClusterConfig.retry_policy": (
        lambda: LocalClusterConfig(retry_policy=5),  # type: ignore[arg-type]
        TypeError,
        "LocalClusterConfig.retry_policy: expected a RetryPolicy(...) or None (DEFAULT_LOCAL_POLICY), got 5",
    ),
    "LocalClusterConfig.use_isolated_env": (
        lambda: LocalClusterConfig(use_isolated_env="no"),  # type: ignore[arg-type]
        TypeError,
        "LocalClusterConfig.use_isolated_env: expected True or False, got 'no'",
    ),
    "FailHost.crash": (
        lambda: FailHost(attempt=0, crash="no"),  # type: ignore[arg-type]
        TypeError,
        "FailHost.crash: expected True or False, got 'no'",
    ),
    "FailHost.message": (
        lambda: FailHost(attempt=0, message=5),  # type: ignore[arg-type]
        ValueError,
        "FailHost.message: expected a non-empty str, got 5",
    ),
    "FailHost.message (NUL)": (
        lambda: FailHost(attempt=0, message="bad\0HBM"),
        ValueError,
        "FailHost.message: a name with a NUL byte is not allowed, got 'bad\\x00HBM'",
    ),
    "DropCapacity.tpu_type": (
        lambda: DropCapacity(attempt=0, tpu_type="v4-15", to=0),
        ValueError,
        "DropCapacity.tpu_type: unknown TPU type 'v4-15'; did you mean v4-16, v4-8? (valid v4 types: v4-8, v4-16, "
        "v4-32, v4-64, v4-128, v4-256, v4-384, v4-512, v4-768, v4-1024, v4-1152, v4-1536 ...)",
    ),
    "DropCapacity.tpu_type (not a str)": (
        lambda: DropCapacity(attempt=0, tpu_type=16, to=0),  # type: ignore[arg-type]
        TypeError,
        "DropCapacity.tpu_type: expected a TPU type (str) like 'v4-16', got 16",
    ),
    "FaultPlan.faults (an entry)": (
        lambda: FaultPlan([PreemptSlice(attempt=0), "preempt"]),  # type: ignore[list-item]
        TypeError,
        "FaultPlan.faults: expected PreemptSlice, FailHost, DropCapacity or DirtyHost entries, got 'preempt' (entry 1)",
    ),
    "FaultPlan.faults (one fault, not a list)": (
        lambda: FaultPlan(DirtyHost(attempt=0)),  # type: ignore[arg-type]
        TypeError,
        "FaultPlan.faults: expected a list of faults, got DirtyHost(attempt=0, slice_index=0, host_index=0)",
    ),
    "Fleet.add_slices: n (a str)": (
        lambda: Fleet({"v4-16": 1}).add_slices("v4-16", "2"),  # type: ignore[arg-type]
        TypeError,
        "Fleet: add_slices: n: expected an int >= 0, got '2'",
    ),
    "Fleet.add_slices: n (a bool)": (
        lambda: Fleet().add_slices("v4-16", True),
        TypeError,
        "Fleet: add_slices: n: expected an int >= 0, got True",
    ),
    "Fleet.add_slices: n (negative)": (
        lambda: Fleet().add_slices("v4-16", -1),
        ValueError,
        "Fleet: add_slices: n: expected an int >= 0, got -1",
    ),
    "Fleet.add_slices: n (past the limit, with those it has)": (
        lambda: Fleet({"v4-16": 3}).add_slices("v4-16", 10_000),
        ValueError,
        "Fleet: at most 10,000 slices of v4-16 allowed in a fleet, asked for 10,003",
    ),
    "PreemptSlice.attempt (past every attempt a job can have)": (
        lambda: PreemptSlice(attempt=10**30),
        ValueError,
        "PreemptSlice.attempt: expected an int >= 0 (at most 2,000,000), got an int of 31 digits",
    ),
    "FailHost.slice_index (past every slice a job can have)": (
        lambda: FailHost(attempt=0, slice_index=10_000),
        ValueError,
        "FailHost.slice_index: expected an int >= 0 (at most 9999), got 10000",
    ),
    "DirtyHost.host_index (past every host a job can have)": (
        lambda: DirtyHost(attempt=0, host_index=100_000),
        ValueError,
        "DirtyHost.host_index: expected an int >= 0 (at most 99999), got 100000",
    ),
    "FaultPlan.seed": (
        lambda: FaultPlan([], seed="7"),  # type: ignore[arg-type]
        TypeError,
        "FaultPlan.seed: expected an int or None, got '7'",
    ),
    "FaultPlan.chaos: seed": (
        lambda: FaultPlan.chaos(seed=1.5, rate=0.5),  # type: ignore[arg-type]
        TypeError,
        "FaultPlan.chaos: seed: expected an int or None, got 1.5",
    ),
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_a_wrong_argument_fails_at_construction_naming_it(what: str) -> None:
    make, kind, message = REFUSED[what]
    with pytest.raises(kind) as e:
        make()
    assert str(e.value) == message


def test_the_models_settings_are_checked_when_set_too(tmp_path: Path) -> None:
    """``fleet.model.fault_plan = ...`` (the documented way to change the plan) was checked at the next attempt."""
    fleet = TpuFleet({"v4-16": 1}, state_dir=str(tmp_path))
    try:
        with pytest.raises(
            TypeError, match=r"^TpuFleet: fault_plan: expected a FaultPlan\(\[\.\.\.\]\) or None, got \["
        ):
            fleet.model.fault_plan = [PreemptSlice(attempt=0)]  # type: ignore[assignment]
        with pytest.raises(TypeError, match=r"^TpuFleet: on_demand: expected True or False, got 'yes'$"):
            fleet.model.on_demand = "yes"  # type: ignore[assignment]
        fleet.model.fault_plan = None  # no faults
        assert fleet.model.fault_plan == FaultPlan() and fleet.model.on_demand is False
    finally:
        fleet.close()


def test_paths_are_taken_as_path_objects(tmp_path: Path) -> None:
    """``LocalCluster(jobs_dir=Path(...))`` raised ``AttributeError: 'PosixPath' object has no attribute 'rstrip'``."""
    fleet = TpuFleet({"v4-16": 1}, state_dir=tmp_path / "fleet")  # type: ignore[arg-type]
    cluster = LocalCluster(fleet=fleet, jobs_dir=tmp_path / "jobs")  # type: ignore[arg-type]
    try:
        assert cluster.store.root == str(tmp_path / "jobs") and fleet.state_dir == str(tmp_path / "fleet")
        assert LocalClusterConfig(jobs_dir=tmp_path / "jobs").jobs_dir == str(tmp_path / "jobs")  # type: ignore[arg-type]
    finally:
        cluster.close()


def test_a_drop_of_a_gcp_spelling_is_kept_by_its_catalog_name() -> None:
    drop = DropCapacity(attempt=0, tpu_type="v5e-4", to=0)
    assert drop == DropCapacity(attempt=0, tpu_type="v5litepod-4", to=0) and drop.tpu_type == "v5litepod-4"
    fleet = Fleet({"v5litepod-4": 2}, FakeClock())
    assert fleet.drop_capacity(drop.tpu_type, drop.to) == ["v5litepod-4-0", "v5litepod-4-1"]


# values that are not True or False: each turned a setting on or off by its truthiness
NOT_A_FLAG = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.just([]))
FLAGS: dict[str, Callable[[Any], object]] = {
    "FailHost.crash": lambda v: FailHost(attempt=0, crash=v),
    "TpuFleet: on_demand": lambda v: TpuFleet(on_demand=v),
    "TpuFleet: clean_lockfiles": lambda v: TpuFleet(clean_lockfiles=v),
    "Fleet: on_demand": lambda v: Fleet(on_demand=v),
    "Fleet: clean_hosts": lambda v: Fleet(clean_hosts=v),
    "LocalClusterConfig.use_isolated_env": lambda v: LocalClusterConfig(use_isolated_env=v),
}


@settings(max_examples=150, deadline=None)
@given(field=st.sampled_from(sorted(FLAGS)), value=NOT_A_FLAG)
def test_every_flag_takes_only_a_bool(field: str, value: object) -> None:
    with pytest.raises(TypeError) as e:
        FLAGS[field](value)
    assert str(e.value).startswith(f"{field}: expected True or False, got "), str(e.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("v4-16:" + "9" * 5000, "at most 10,000 slices of a type allowed, got a count of 5,000 digits"),
        ("v4-16:-1", "count of 'v4-16' must be an int >= 1, got '-1'"),
        ("v4-16:\u00b2", "count of 'v4-16' must be an int >= 1, got '\u00b2'"),
        ("v9-16:1", "TpuConfig.type: unknown TPU type 'v9-16'"),
    ],
)
def test_a_fleet_spec_names_the_spec_and_what_is_wrong(spec: str, message: str) -> None:
    """A count of 5,000 digits was 'must be an int' (it is one) with every digit repeated; an unknown type did
    not say which spec it was in."""
    with pytest.raises(ValueError) as e:
        parse_fleet(spec)
    assert str(e.value).startswith("fleet spec ") and message in str(e.value), str(e.value)
    assert len(str(e.value)) < 400 and "\n" not in str(e.value)
    assert parse_fleet(" v4-16 : 2 , v5e-4") == {"v4-16": 2, "v5litepod-4": 1}

"""Fray's TPU catalog against the installed Ray's own TPU tables and helpers (no Ray cluster, no ray.init).

Ray knows a pod type through its topology table (``VALID_TPU_TOPOLOGY``: every shape it accepts per
generation, so a pod type may have several, e.g. v4-256 is 4x4x8, 4x8x4 or 8x4x4) and derives chips, chips
per host, hosts, the ``accelerator_type:TPU-V4`` resource and the ``TPU-<pod>-head`` resource from the pod type
string. For every pod type both know, all of these must agree with ``fray_core.tpu``.

Deliberate differences (also commented in fray_core/tpu.py), asserted below so that a Ray upgrade that
changes them is noticed:
- v4-4096 (8x16x16, 2048 chips): GCP offers it; Ray 2.60's v4 table stops at 12x12x16.
- v5litepod-2 (1x2, 2 chips on one host): Ray's 2D table has no 1x2 shape; its chips and per-host helpers agree.
"""

from __future__ import annotations

import pytest

from fray_core.request import TpuConfig
from fray_core.tpu import TPU_CATALOG, TPU_GENERATIONS, TpuSpec, get_tpu_spec, normalize_tpu_type

pytest.importorskip("ray")

from ray._private.accelerators import tpu as ray_tpu  # noqa: E402
from ray._private.accelerators.tpu import TPUAcceleratorManager  # noqa: E402
from ray.util.tpu import get_tpu_worker_resources  # noqa: E402

ONLY_IN_FRAY = {"v4-4096", "v5litepod-2"}


def ray_pod_types() -> dict[str, set[str]]:
    """Pod type -> the topologies Ray accepts for it, for the generations Fray knows."""
    types: dict[str, set[str]] = {}
    for gen in TPU_GENERATIONS:
        for topology in ray_tpu.VALID_TPU_TOPOLOGY[gen]:
            pod = ray_tpu.infer_tpu_pod_type_from_topology(topology, f"TPU-{gen.upper()}")
            assert pod is not None
            types.setdefault(pod, set()).add(topology)
    return types


def _sort_key(name: str) -> tuple[str, int]:
    gen, _, size = name.rpartition("-")
    return gen, int(size)


def _disagreements_without_topology(spec: TpuSpec) -> list[str]:
    """What Ray derives from the pod type string alone, against the catalog."""
    ray = {
        "chips": ray_tpu.get_total_chips_from_accelerator_type(spec.name),
        "cores_per_chip": ray_tpu.get_tpu_cores_per_chip(spec.name),
        "chips_per_host": ray_tpu.get_num_tpu_visible_chips_per_host(spec.name),
    }
    return [f"{spec.name}.{k}: fray {getattr(spec, k)}, ray {v}" for k, v in ray.items() if getattr(spec, k) != v]


def test_ray_knows_every_generation_fray_knows() -> None:
    assert set(TPU_GENERATIONS) <= set(ray_tpu.VALID_TPU_TYPES)
    assert set(TPU_GENERATIONS) <= set(ray_tpu.VALID_TPU_TOPOLOGY)


def test_the_same_pod_types_up_to_the_documented_differences() -> None:
    ray_types = set(ray_pod_types())
    assert sorted(ray_types - set(TPU_CATALOG), key=_sort_key) == [], "pod types Ray knows and the catalog lacks"
    assert set(TPU_CATALOG) - ray_types == ONLY_IN_FRAY


def test_every_pod_type_both_know_agrees() -> None:
    """Chips, TensorCores per chip, chips per host, hosts and the default topology, for every shared type."""
    ray_types = ray_pod_types()
    shared = sorted(set(ray_types) & set(TPU_CATALOG), key=_sort_key)
    assert len(shared) == len(TPU_CATALOG) - len(ONLY_IN_FRAY)
    problems: list[str] = []
    for name in shared:
        spec = TPU_CATALOG[name]
        problems += _disagreements_without_topology(spec)
        if spec.topology not in ray_types[name]:
            problems.append(f"{name}.topology: fray {spec.topology}, ray accepts {sorted(ray_types[name])}")
            continue
        assert TPUAcceleratorManager.is_valid_tpu_accelerator_topology(spec.generation, spec.topology)
        per_host_of_topology = ray_tpu.get_chips_per_host(spec.topology, spec.generation)
        if per_host_of_topology != spec.chips_per_host:
            problems.append(
                f"{name}: chips per host of {spec.topology}: fray {spec.chips_per_host}, ray {per_host_of_topology}"
            )
        hosts, per_host = get_tpu_worker_resources(spec.topology, spec.generation, tpu_resource_per_chip=1)
        if (hosts, per_host["TPU"]) != (spec.hosts, spec.chips_per_host):
            problems.append(
                f"{name}: hosts x chips: fray {spec.hosts} x {spec.chips_per_host}, ray {hosts} x {per_host['TPU']}"
            )
    assert problems == []


def _shapes(chips: int, dims: int) -> list[str]:
    """Every ordered way to write ``chips`` as ``dims`` sides."""
    if dims == 1:
        return [str(chips)]
    return [f"{a}x{rest}" for a in range(1, chips + 1) if chips % a == 0 for rest in _shapes(chips // a, dims - 1)]


def test_a_topology_is_taken_exactly_when_ray_has_that_shape_for_the_type() -> None:
    """``TpuConfig(type, topology)`` is made for every shape Ray's table gives the type and refused, naming
    the shapes, for every other way to write its chips in its dimensions (v4-128 as 2x4x8, v5litepod-16 as
    8x2): on Ray no slice is labelled with such a shape, so a job asking for it would wait forever. The pod
    types only Fray knows take their default only."""
    ray_types = ray_pod_types()
    problems: list[str] = []
    for name, spec in TPU_CATALOG.items():
        offered = ray_types.get(name, {spec.topology})
        for shape in _shapes(spec.chips, spec.dimensions):
            try:
                TpuConfig(type=name, topology=shape)
                taken = True
            except ValueError as e:
                taken = False
                assert str(e).startswith(f"TpuConfig.topology: {shape!r} is no shape of a {name} slice: "), str(e)
            if taken != (shape in offered):
                problems.append(f"{name} {shape}: fray {'takes' if taken else 'refuses'} it, ray's table does not")
    assert problems == []


def test_the_pod_types_only_fray_knows_agree_where_ray_can_say() -> None:
    problems = [p for name in sorted(ONLY_IN_FRAY) for p in _disagreements_without_topology(TPU_CATALOG[name])]
    assert problems == []
    assert not TPUAcceleratorManager.is_valid_tpu_accelerator_topology("v4", TPU_CATALOG["v4-4096"].topology)


@pytest.mark.parametrize("gcp_name", ["v4-16", "v5p-128", "v5litepod-16", "v6e-8", "v7x-32", "tpu7x-16", "tpu7x-8"])
def test_resources_and_labels_are_what_ray_gives_a_host_of_that_type(
    gcp_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's own node-resource code, run on the environment GKE gives a TPU host (no metadata server asked):
    the pod type, ``accelerator_type:TPU-V..`` and ``TPU-<pod>-head`` resources the catalog names are the same."""
    spec = get_tpu_spec(gcp_name)
    assert normalize_tpu_type(gcp_name) == ray_tpu.normalize_tpu_accelerator_type(gcp_name) == spec.name
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", gcp_name)
    monkeypatch.setenv("TPU_TOPOLOGY", spec.topology)
    monkeypatch.setenv("TPU_NAME", "my-slice")
    monkeypatch.setenv("TPU_WORKER_ID", "0")
    assert TPUAcceleratorManager.get_current_node_tpu_pod_type() == spec.name
    assert f"accelerator_type:{TPUAcceleratorManager.get_current_node_accelerator_type()}" == spec.accelerator_resource
    assert TPUAcceleratorManager.get_current_node_additional_resources() == {"my-slice": 1, spec.head_resource: 1}
    labels = TPUAcceleratorManager.get_current_node_accelerator_labels()
    assert (labels["ray.io/tpu-pod-type"], labels["ray.io/tpu-topology"]) == (spec.name, spec.topology)
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    assert TPUAcceleratorManager.get_current_node_additional_resources() == {"my-slice": 1}

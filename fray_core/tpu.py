"""The TPU topology catalog: every pod type Fray knows, with chips, hosts (VMs) and default topology.

The number after the generation counts TensorCores for v4/v5p/v7x (2 per chip) and chips for
v5litepod/v6e. Hosts per slice = chips / chips per VM.

Example:
    >>> spec = get_tpu_spec("v4-16")
    >>> (spec.chips, spec.hosts, spec.chips_per_host, spec.topology)
    (8, 2, 4, '2x2x2')
"""

from __future__ import annotations

import difflib
import math

import attrs

__all__ = ["TpuSpec", "TPU_CATALOG", "TPU_GENERATIONS", "get_tpu_spec", "tpu_types"]


@attrs.frozen
class TpuSpec:
    """One TPU pod type from the catalog."""

    name: str  # e.g. "v4-16"
    generation: str  # e.g. "v4"
    chips: int
    hosts: int
    chips_per_host: int
    topology: str  # default topology, e.g. "2x2x2"
    cores_per_chip: int  # 2 when the suffix counts TensorCores, 1 when it counts chips

    @property
    def accelerator_resource(self) -> str:
        """Ray's ``accelerator_type:TPU-V4`` style resource name."""
        return f"accelerator_type:TPU-{self.generation.upper()}"

    @property
    def head_resource(self) -> str:
        """Ray's ``TPU-<pod_type>-head`` resource, present on worker 0 of a slice."""
        return f"TPU-{self.name}-head"


def _topology_3d(chips: int) -> str:
    """Default 3D torus for v4/v5p/v7x as GCP lays them out: 4 chips are 2x2x1, then the smallest
    dimension doubles (the last of equals), giving 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ..."""
    dims = [2, 2, 1]
    n = 4
    while n < chips:
        smallest = min(dims)
        i = max(j for j, d in enumerate(dims) if d == smallest)
        dims[i] *= 2
        n *= 2
    return "x".join(str(d) for d in dims)


def _topology_2d(chips: int) -> str:
    a = 2 ** (int(math.log2(chips)) // 2)
    b = chips // a
    return f"{min(a, b)}x{max(a, b)}"


def _build_catalog() -> dict[str, TpuSpec]:
    catalog: dict[str, TpuSpec] = {}

    def add_3d(gen: str, max_cores: int) -> None:
        cores = 8
        while cores <= max_cores:
            chips = cores // 2
            hosts = max(1, chips // 4)
            catalog[f"{gen}-{cores}"] = TpuSpec(
                f"{gen}-{cores}", gen, chips, hosts, chips // hosts, _topology_3d(chips), 2
            )
            cores *= 2

    add_3d("v4", 4096)
    add_3d("v7x", 128)
    # v5p goes in powers of two up to 8192 cores, plus the full pod of 12288 cores (6144 chips).
    add_3d("v5p", 8192)
    catalog["v5p-12288"] = TpuSpec("v5p-12288", "v5p", 6144, 1536, 4, "16x16x24", 2)

    for gen in ("v5litepod", "v6e"):
        singles = [1, 2, 4, 8] if gen == "v5litepod" else [1, 4, 8]
        for chips in singles:
            catalog[f"{gen}-{chips}"] = TpuSpec(
                f"{gen}-{chips}", gen, chips, 1, chips, _topology_2d(chips), 1
            )
        for chips in (16, 32, 64, 128, 256):
            catalog[f"{gen}-{chips}"] = TpuSpec(
                f"{gen}-{chips}", gen, chips, chips // 4, 4, _topology_2d(chips), 1
            )
    return catalog


TPU_CATALOG: dict[str, TpuSpec] = _build_catalog()
TPU_GENERATIONS: tuple[str, ...] = ("v4", "v5p", "v5litepod", "v6e", "v7x")
_ALIASES = {"v5e": "v5litepod", "tpu7x": "v7x", "v5lite": "v5litepod"}


def tpu_types() -> list[str]:
    """Every pod type in the catalog, e.g. ``["v4-8", "v4-16", ...]``."""
    return list(TPU_CATALOG)


def normalize_tpu_type(tpu_type: str) -> str:
    """Map GCP spellings (``tpu7x-16``, ``v5e-4``) to catalog names; other strings pass through."""
    gen, sep, rest = tpu_type.strip().lower().partition("-")
    return f"{_ALIASES.get(gen, gen)}{sep}{rest}"


def get_tpu_spec(tpu_type: str) -> TpuSpec:
    """Look up a pod type; raises ``ValueError`` naming the nearest valid types when it is unknown."""
    if not isinstance(tpu_type, str):
        raise TypeError(f"TpuConfig.type must be a str like 'v4-16', got {tpu_type!r}")
    name = normalize_tpu_type(tpu_type)
    spec = TPU_CATALOG.get(name)
    if spec is None:
        gen, _, suffix = name.partition("-")
        same_gen = [t for t in TPU_CATALOG if t.startswith(gen + "-")]
        if same_gen and suffix.isdigit():  # nearest sizes of the same generation
            n = max(int(suffix), 1)
            near = sorted(same_gen, key=lambda t: abs(math.log2(int(t.rsplit("-", 1)[1]) / n)))[:2]
        else:
            near = difflib.get_close_matches(name, TPU_CATALOG.keys(), n=4, cutoff=0.5)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        allowed = (
            f"valid {gen} types: {', '.join(same_gen[:12])}{' ...' if len(same_gen) > 12 else ''}"
            if same_gen
            else f"generations: {', '.join(TPU_GENERATIONS)} (e.g. v4-16, v5litepod-4)"
        )
        raise ValueError(f"TpuConfig.type: unknown TPU type {tpu_type!r}{hint} ({allowed})")
    return spec

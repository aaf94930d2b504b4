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

from fray_core.limits import show_text

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
    def dimensions(self) -> int:
        """Sides of the slice's topology: 3 for v4, v5p and v7x (3-D tori), 2 for v5litepod and v6e.

        >>> get_tpu_spec("v4-16").dimensions, get_tpu_spec("v5litepod-16").dimensions
        (3, 2)
        """
        return self.topology.count("x") + 1

    def offers(self, topology: str) -> bool:
        """Whether a slice of this type can have ``topology`` (sides joined by ``x``, their product this type's
        chips): its default; for v4 and v5p of 64 chips and more, any torus whose sides are multiples of 4
        within the generation's (in that order, as Ray's topology table has them); for v5litepod and v6e of
        16 chips, also a 2x8 strip. Any other shape is no slice GCP makes, so no slice on Ray is labelled
        with it: a job asking for it would wait forever.

        >>> spec = get_tpu_spec("v4-128")
        >>> spec.offers("4x4x4"), spec.offers("2x4x8"), get_tpu_spec("v4-256").offers("4x8x4")
        (True, False, True)
        """
        if topology == self.topology:
            return True
        sides = tuple(int(d) for d in topology.split("x"))
        if math.prod(sides) != self.chips:
            return False
        if len(sides) == 2:
            return self.chips == 16 and topology == "2x8" and self.generation in _STRIP_GENERATIONS
        limits = _TORUS_SIDES.get(self.generation)
        return (
            limits is not None and self.chips >= 64 and all(d % 4 == 0 and d <= most for d, most in zip(sides, limits))
        )

    def shapes(self) -> str:
        """The shapes :meth:`offers` takes, in words (for an error message).

        >>> get_tpu_spec("v4-256").shapes()
        "sides multiples of 4, at most 12x12x16 in that order, whose product is 128 chips, like '4x4x8'"
        """
        if self.dimensions == 2:
            strip = self.chips == 16 and self.generation in _STRIP_GENERATIONS
            return f"{self.topology!r} or '2x8'" if strip else f"{self.topology!r} only"
        limits = _TORUS_SIDES.get(self.generation)
        default = [int(d) for d in self.topology.split("x")]
        if limits is None or self.chips < 64 or any(d > most for d, most in zip(default, limits)):
            return f"{self.topology!r} only"  # (v4-4096, past v4's sides, has no other shape within them)
        most = "x".join(map(str, limits))
        return f"sides multiples of 4, at most {most} in that order, whose product is {self.chips} chips, like " + (
            f"{self.topology!r}"
        )

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


# v4 and v5p slices of 64 chips and more may be any torus whose three sides are multiples of 4, up to these
# sides (smallest first): 4x4x12 is a v4-384, 4x4x20 a v5p-640. The same shapes as Ray 2.60's topology table
# (tests/test_tpu_catalog.py compares them). v4-4096 (8x16x16) is past v4's sides: GCP offers it, Ray's table
# stops at 12x12x16 (a deliberate difference).
_TORUS_SIDES: dict[str, tuple[int, int, int]] = {"v4": (12, 12, 16), "v5p": (16, 16, 24)}
# 2-D generations whose 16 chips may also be a 2x8 strip (Ray 2.60's table), besides the default 4x4
_STRIP_GENERATIONS = frozenset({"v5litepod", "v6e"})


def _tori(max_sides: tuple[int, int, int]) -> dict[int, str]:
    """Chips -> the most cube-like torus with sides multiples of 4 within ``max_sides`` (smallest side first):
    the smallest longest side, then the largest shortest side (768 chips: 8x8x12, not 4x12x16)."""
    best: dict[int, tuple[int, int, int]] = {}
    a_max, b_max, c_max = max_sides
    for a in range(4, a_max + 1, 4):
        for b in range(a, b_max + 1, 4):
            for c in range(b, c_max + 1, 4):
                n = a * b * c
                if n not in best or (c, -a) < (best[n][2], -best[n][0]):
                    best[n] = (a, b, c)
    return {n: "x".join(map(str, dims)) for n, dims in best.items()}


def _build_catalog() -> dict[str, TpuSpec]:
    catalog: dict[str, TpuSpec] = {}

    def add_3d(gen: str, max_cores: int) -> None:
        """Powers of two from 8 TensorCores (4 chips) to ``max_cores``, plus the other tori of the generation."""
        topologies = {2**k // 2: _topology_3d(2**k // 2) for k in range(3, int(math.log2(max_cores)) + 1)}
        topologies = {**_tori(_TORUS_SIDES[gen]), **topologies} if gen in _TORUS_SIDES else topologies
        for chips in sorted(topologies):
            hosts = max(1, chips // 4)
            name = f"{gen}-{chips * 2}"
            catalog[name] = TpuSpec(name, gen, chips, hosts, chips // hosts, topologies[chips], 2)

    add_3d("v4", 4096)
    add_3d("v5p", 8192)  # with the tori: up to the full v5p-12288 (16x16x24, 6144 chips)
    add_3d("v7x", 4096)  # up to 8x16x16 (2048 chips), as GKE and Ray 2.60 list tpu7x topologies

    for gen in ("v5litepod", "v6e"):
        singles = [1, 2, 4, 8] if gen == "v5litepod" else [1, 4, 8]
        for chips in singles:
            catalog[f"{gen}-{chips}"] = TpuSpec(f"{gen}-{chips}", gen, chips, 1, chips, _topology_2d(chips), 1)
        for chips in (16, 32, 64, 128, 256):
            catalog[f"{gen}-{chips}"] = TpuSpec(f"{gen}-{chips}", gen, chips, chips // 4, 4, _topology_2d(chips), 1)
    return catalog


TPU_CATALOG: dict[str, TpuSpec] = _build_catalog()
TPU_GENERATIONS: tuple[str, ...] = ("v4", "v5p", "v5litepod", "v6e", "v7x")
_ALIASES = {"v5e": "v5litepod", "tpu7x": "v7x", "v5lite": "v5litepod"}


# an unknown type is compared with the catalog only when it could be a spelling of a catalog name
_MAX_TYPE_CHARS = 64
_MAX_SIZE_DIGITS = 8  # the largest pod (v7x-4096) has 4 digits


def tpu_types() -> list[str]:
    """Every pod type in the catalog, e.g. ``["v4-8", "v4-16", ...]``."""
    return list(TPU_CATALOG)


def normalize_tpu_type(tpu_type: str) -> str:
    """Map GCP spellings (``tpu7x-16``, ``v5e-4``) to catalog names; other strings pass through."""
    gen, sep, rest = tpu_type.strip().lower().partition("-")
    return f"{_ALIASES.get(gen, gen)}{sep}{rest}"


def get_tpu_spec(tpu_type: str, field: str = "TpuConfig.type") -> TpuSpec:
    """Look up a pod type; raises ``ValueError`` naming ``field`` and the nearest valid types when it is
    unknown (``TypeError`` when it is not a str).

    >>> get_tpu_spec(5, field="DropCapacity.tpu_type")
    Traceback (most recent call last):
    ...
    TypeError: DropCapacity.tpu_type: expected a TPU type (str) like 'v4-16', got 5
    """
    if not isinstance(tpu_type, str):
        raise TypeError(f"{field}: expected a TPU type (str) like 'v4-16', got {tpu_type!r}")
    name = normalize_tpu_type(tpu_type)
    spec = TPU_CATALOG.get(name)
    if spec is None:
        gen, _, suffix = name.partition("-")
        same_gen = [t for t in TPU_CATALOG if t.startswith(gen + "-")]
        # ASCII digits only, and few of them: int() reads '²' (or 5,000 digits) no better than log2 of 10**400
        if same_gen and suffix.isascii() and suffix.isdigit() and len(suffix) <= _MAX_SIZE_DIGITS:
            n = max(int(suffix), 1)  # nearest sizes of the same generation
            near = sorted(same_gen, key=lambda t: abs(math.log2(int(t.rsplit("-", 1)[1]) / n)))[:2]
        elif len(name) <= _MAX_TYPE_CHARS:
            near = difflib.get_close_matches(name, TPU_CATALOG.keys(), n=4, cutoff=0.5)
        else:
            near = []  # no catalog name is this long: nothing is near it
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        allowed = (
            f"valid {gen} types: {', '.join(same_gen[:12])}{' ...' if len(same_gen) > 12 else ''}"
            if same_gen
            else f"generations: {', '.join(TPU_GENERATIONS)} (e.g. v4-16, v5litepod-4)"
        )
        raise ValueError(f"{field}: unknown TPU type {show_text(tpu_type, _MAX_TYPE_CHARS)}{hint} ({allowed})")
    return spec

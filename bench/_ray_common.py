"""Shared pieces of the Ray benchmarks (not a benchmark itself): host bodies that leave a start marker,
the hand-written placement-group baseline, and waiting for the emulated cluster to be idle.

Markers are files ``<dir>/<tag>__<slice name>__<worker id>`` holding ``time.time()`` at the host's start;
every emulated host runs on this machine, so one wall clock serves all of them.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

TPU_TYPE = "v4-16"  # 2 hosts x 4 chips per slice
SLICE_NAME_LABEL = "ray.io/tpu-slice-name"


def write_marker(marker_dir: str, tag: str, attempt: str | None = None) -> float:
    """Record that this host started (called first thing on the host); ``attempt`` defaults to
    ``$FRAY_ATTEMPT`` (set by fray), else ``"0"``."""
    t = time.time()
    attempt = attempt if attempt is not None else os.environ.get("FRAY_ATTEMPT", "0")
    name = f"{tag}__{os.environ.get('TPU_NAME', '?')}__{os.environ.get('TPU_WORKER_ID', '?')}__{attempt}"
    with open(os.path.join(marker_dir, name), "w") as f:
        f.write(repr(t))
    return t


def markers(marker_dir: str, tag: str) -> list[tuple[str, str, str, float]]:
    """``(slice name, worker id, attempt, start time)`` of every host that started under ``tag``."""
    out = []
    for fn in os.listdir(marker_dir):
        parts = fn.split("__")
        if parts[0] != tag:
            continue
        with open(os.path.join(marker_dir, fn)) as f:
            text = f.read()
        if text:
            out.append((parts[1], parts[2], parts[3], float(text)))
    return out


def mark(marker_dir: str, tag: str) -> str:
    """A trivial host body: mark the start, return."""
    write_marker(marker_dir, tag)
    return os.environ.get("TPU_WORKER_ID", "?")


def wait_idle(total_slices: int, hosts_per_slice: int, chips_per_host: int, head_resource: str, timeout: float = 60.0) -> float:
    """Wait (untimed) until every TPU chip and slice head is free again; returns the seconds waited."""
    import ray

    t0 = time.monotonic()
    want_tpu = total_slices * hosts_per_slice * chips_per_host
    while time.monotonic() - t0 < timeout:
        avail = ray.available_resources()
        if avail.get("TPU", 0) >= want_tpu and avail.get(head_resource, 0) >= total_slices:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise TimeoutError(f"the emulated cluster did not become idle in {timeout:.0f} s: {ray.available_resources()}")


def baseline_placement_groups(slice_names: list[str], hosts: int, chips: int) -> list[Any]:
    """One placement group per slice: a ``{"TPU": chips}`` bundle per host, bound to that slice's nodes
    by label selector (the way ``ray.util.tpu`` and fray_ray's provider bind them)."""
    from ray.util.placement_group import placement_group

    return [
        placement_group(
            [{"TPU": float(chips)}] * hosts, strategy="SPREAD", bundle_label_selector=[{SLICE_NAME_LABEL: name}] * hosts
        )
        for name in slice_names
    ]


def host_task_options(pg: Any, bundle: int, chips: int) -> dict[str, Any]:
    """Ray task options of one host: the same resources fray_ray gives a TPU host task."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "num_cpus": 0,
        "resources": {"TPU": float(chips)},
        "max_retries": 0,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle),
    }


def med_p90(xs: list[float]) -> tuple[float, float]:
    """Median and 90th percentile (nearest rank)."""
    s = sorted(xs)
    return statistics.median(s), s[min(len(s) - 1, max(0, int(round(0.9 * len(s) + 0.5)) - 1))]

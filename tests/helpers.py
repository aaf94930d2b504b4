"""Helpers shared by the test modules (tests/ is on sys.path: pytest's rootdir-relative import mode)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition", interval: float = 0.05
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail after ``timeout`` seconds.

    For state owned by other processes (marker files, job records, Ray), where no event can be awaited.
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def check_hosts(result: list[dict[str, str]], n_slices: int, attempt: int = 0) -> None:
    """A TPU job's results (each host returned its env and pid): one entry per host in (slice, host) order,
    one process each, every host of one slice on the same slice, and the MEGASCALE env right for multislice.
    For the v4-16 (2 hosts per slice) the TPU tests use."""
    hosts_per_slice = 2
    assert len(result) == n_slices * hosts_per_slice  # one entry per host, in (slice, host) order
    assert [(r["FRAY_SLICE_ID"], r["TPU_WORKER_ID"]) for r in result] == [
        (str(s), str(h)) for s in range(n_slices) for h in range(hosts_per_slice)
    ]
    assert {r["FRAY_ATTEMPT"] for r in result} == {str(attempt)}
    assert len({r["pid"] for r in result}) == len(result)  # one process per host
    for s in range(n_slices):
        assert (
            len({r["TPU_NAME"] for r in result[hosts_per_slice * s : hosts_per_slice * (s + 1)]}) == 1
        )  # both hosts on the same slice
    assert len({r["TPU_NAME"] for r in result}) == n_slices
    if n_slices == 1:
        assert not any(k.startswith("MEGASCALE_") for r in result for k in r)
    else:
        assert len({r["MEGASCALE_COORDINATOR_ADDRESS"] for r in result}) == 1
        assert {r["MEGASCALE_NUM_SLICES"] for r in result} == {str(n_slices)}
        assert [r["MEGASCALE_SLICE_ID"] for r in result] == [
            str(s) for s in range(n_slices) for _ in range(hosts_per_slice)
        ]
        assert {r["MEGASCALE_PORT"] for r in result} == {"8081"}

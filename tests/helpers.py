"""Helpers shared by the test modules (tests/ is on sys.path: pytest's rootdir-relative import mode)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition", interval: float = 0.05) -> Any:
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

"""Known TPU-host faults, told by their signature in a failed host's output: device faults, not the user's.

A host that fails with one of these did not fail because of the job's code: the device was held by a stale
process, a stale libtpu lockfile was left behind, or libtpu crashed while opening the device. A backend that
sees one ends the host PREEMPTED, counts it towards that host's quarantine, removes the lockfile and names the
fault in the cause (see docs/concepts.md, "Bad hosts").

>>> device_fault("RuntimeError: TPU initialization failed: The TPU is already in use by process 1234")
'device busy (TPU is already in use)'
>>> device_fault("Segmentation fault in libtpu.so at TpuDevice::Open", signal=11)
'libtpu crashed at start (SIGSEGV)'
>>> device_fault("ValueError: loss is NaN") is None
True
"""

from __future__ import annotations

import re
import signal as _signal

__all__ = ["device_fault"]

# (pattern, name): searched in the host's error text and last output lines
_SIGNATURES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"TPU is already in use|TPU in use", re.I), "device busy (TPU is already in use)"),
    (
        re.compile(r"/dev/(vfio|accel)\S*.*(busy|in use)|(busy|in use).*/dev/(vfio|accel)", re.I),
        "device busy (/dev/vfio or /dev/accel held)",
    ),
    (re.compile(r"libtpu_lockfile", re.I), "stale libtpu lockfile"),
)
_CRASH_SIGNALS = {int(_signal.SIGSEGV): "SIGSEGV", int(_signal.SIGBUS): "SIGBUS"}


def device_fault(text: str | None, signal: int | None = None) -> str | None:
    """The name of the known device fault ``text`` (a failed host's error and last output) shows, else None.
    ``signal``: the signal that killed the host, if any (SIGSEGV/SIGBUS with libtpu in the output is a crash
    of libtpu at device start)."""
    if not text:
        return None
    for pattern, name in _SIGNATURES:
        if pattern.search(text):
            return name
    if signal in _CRASH_SIGNALS and "libtpu" in text:
        return f"libtpu crashed at start ({_CRASH_SIGNALS[signal]})"
    return None

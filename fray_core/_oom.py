"""Whether the kernel's OOM killer is the likely reason a host died of SIGKILL, from evidence an unprivileged
process can read (no dmesg): the OOM-kill counter of the host's memory cgroup (cgroup v2 ``memory.events``, v1
``memory.oom_control``; the kernel counts every OOM kill, a cgroup limit's or the machine's, on the victim's
cgroup), else, where no cgroup counter can be read, the machine's (``oom_kill`` in ``/proc/vmstat``).

A backend takes an :class:`OomWatch` before it starts a host (the host is forked into the cgroup of the process
that starts it) and, when the host ends killed by SIGKILL (or a shell's 137), asks :func:`oom_suffix` for the
words to add to the cause. The counter says an OOM kill happened in that cgroup while the host ran, not that it
was this host's: hence the question mark.

>>> oom_suffix(-9, None), oom_suffix(1, None)
('', '')
"""

from __future__ import annotations

import os
import signal

import attrs

__all__ = ["OomWatch", "oom_suffix"]

PROC = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"
OOM_SUFFIX = " (out of memory?)"


@attrs.frozen
class OomWatch:
    """The OOM-kill counter that covers one process (``source``: the file it is read from) as it stood when
    the watch was taken; :meth:`fired` says whether it has grown since.

    >>> OomWatch("/nonexistent/memory.events", 0).fired()
    False
    """

    source: str
    count: int

    @classmethod
    def of(cls, pid: int | None = None, proc: str = PROC, cgroup_root: str = CGROUP_ROOT) -> OomWatch | None:
        """A watch over ``pid``'s memory cgroup (default: this process's), else over the machine; ``None``
        when neither counter can be read (not Linux, or an old kernel)."""
        for path in _cgroup_counters(os.getpid() if pid is None else pid, proc, cgroup_root):
            count = _read_counter(path)
            if count is not None:
                return cls(path, count)
        path = os.path.join(proc, "vmstat")
        count = _read_counter(path)
        return None if count is None else cls(path, count)

    def fired(self) -> bool:
        """An OOM kill was counted since the watch was taken."""
        now = _read_counter(self.source)
        return now is not None and now > self.count


def oom_suffix(returncode: int | None, watch: OomWatch | None) -> str:
    """``" (out of memory?)"`` when a process that ended with ``returncode`` (a :mod:`subprocess` code:
    ``-9``, or a shell's ``137``) was killed by SIGKILL while ``watch``'s OOM-kill counter grew; else ``""``."""
    if returncode not in (-signal.SIGKILL, 128 + signal.SIGKILL) or watch is None:
        return ""
    return OOM_SUFFIX if watch.fired() else ""


def _cgroup_counters(pid: int, proc: str, cgroup_root: str) -> list[str]:
    """The files that may hold ``pid``'s memory cgroup's OOM-kill counter, most likely first."""
    try:
        with open(os.path.join(proc, str(pid), "cgroup"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2: the unified hierarchy (hybrid systems mount it at unified/)
            out += [
                os.path.join(cgroup_root, rel, "memory.events"),
                os.path.join(cgroup_root, "unified", rel, "memory.events"),
            ]
        elif "memory" in controllers.split(","):  # cgroup v1's memory controller
            out.append(os.path.join(cgroup_root, "memory", rel, "memory.oom_control"))
    return out


def _read_counter(path: str) -> int | None:
    """The ``oom_kill`` line of a ``memory.events`` / ``memory.oom_control`` / ``vmstat`` file."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return None

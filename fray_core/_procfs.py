"""Reading ``/proc/<pid>/stat`` (Linux), shared by the job store and the local backend's hosts.

Standard library only: the local backend's host guardian imports it at every host start.
"""

from __future__ import annotations

__all__ = ["stat_fields", "start_ticks"]


def stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (state, ppid, ...), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].decode("ascii", "replace").split()


def start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None if it does not exist or is a zombie.

    A pid and its start time name one process: a reused pid has a later start time.
    """
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])

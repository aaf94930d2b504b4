"""Private scratch directories that do not outlive their process, even one killed with ``kill -9``.

A scratch dir is named after the process that made it (pid and start time, see :mod:`fray_core._procfs`),
so the next process that makes one with the same prefix can remove the dirs whose maker is gone:
``weakref.finalize`` cleans up on a normal exit, this sweep after a ``kill -9``, an OOM kill or a lost VM.
Only dirs of this user whose name has exactly that form are touched, and symlinks never are.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile

from fray_core._procfs import start_ticks

__all__ = ["scratch_dir", "sweep_scratch"]


def _tag(pid: int) -> str:
    return f"{pid}.{start_ticks(pid) or 0}"


def scratch_dir(prefix: str) -> str:
    """A new private (0700) dir ``<tmp>/<prefix><pid>.<start>-XXXX``, after sweeping dead makers' dirs.

    >>> d = scratch_dir("fray-doctest-")
    >>> os.path.basename(d).startswith(f"fray-doctest-{os.getpid()}.")
    True
    >>> shutil.rmtree(d)
    """
    sweep_scratch(prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{_tag(os.getpid())}-")


def sweep_scratch(prefix: str, root: str | None = None) -> list[str]:
    """Remove this user's ``<prefix><pid>.<start>-*`` dirs under ``root`` whose maker has exited; return them."""
    removed: list[str] = []
    if start_ticks(os.getpid()) is None:
        return removed  # no /proc (not Linux): cannot tell a live maker from a dead one
    root = root or tempfile.gettempdir()
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.(\d+)-[^/]+\Z")
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        m = pattern.match(name)
        if m is None:
            continue
        pid, ticks = int(m.group(1)), int(m.group(2))
        if start_ticks(pid) == ticks:
            continue  # its maker is alive
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed

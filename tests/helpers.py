"""Helpers shared by the test modules (tests/ is on sys.path: pytest's rootdir-relative import mode).

They are the conformance kit's own (``fray_core.testing.conformance``), re-exported under their old import path.
"""

from __future__ import annotations

import os
from pathlib import Path

from fray_core.testing.conformance import check_hosts as check_hosts
from fray_core.testing.conformance import wait_for as wait_for


def write_whole(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that a reader never sees it half-written: into a hidden file beside it, then
    renamed over it. Job bodies write markers that a test reads as soon as they exist (an empty read of one
    written in place was a CI flake, twice)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # hidden: no test's glob of markers sees it
    tmp.write_text(text)
    os.replace(tmp, path)

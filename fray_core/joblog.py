"""The job log writer every backend's supervisor uses: tagged lines of every host of a job, in one file.

::

    log = LogSink("/tmp/fray-doc-joblog/job.log")
    log.write("s0/h1", "step 1 loss 0.5")      # the file gets "[s0/h1] step 1 loss 0.5"
    log.close()

Standard library only: host-side processes import it without paying for the runner or the job store.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import IO

__all__ = ["LogSink"]


class LogSink:
    """Appends tagged lines of every host of a job to one log file.

    A write that fails (a full disk, a file-size limit) does not stop anyone reading the hosts' output:
    the first error is kept in ``error`` and reported once to ``on_error`` callbacks, later lines are dropped.
    """

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self.error: str | None = None
        self._on_error: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        self._f: IO[str] = open(path, "a", encoding="utf-8", buffering=1)

    def on_error(self, callback: Callable[[str], None]) -> None:
        self._on_error.append(callback)

    def write(self, tag: str, line: str) -> None:
        with self._lock:
            if self._f.closed or self.error is not None:
                return
            try:
                self._f.write(f"[{tag}] {line.rstrip(chr(10))}\n")
                return
            except (OSError, ValueError) as e:
                self.error = f"cannot write job log: {type(e).__name__}: {e} (log file {self.path})"
        for cb in list(self._on_error):
            cb(self.error)

    def close(self) -> None:
        with self._lock:
            try:
                self._f.close()
            except OSError as e:  # the last buffered line could not be written
                if self.error is None:
                    self.error = f"cannot write job log: {type(e).__name__}: {e} (log file {self.path})"

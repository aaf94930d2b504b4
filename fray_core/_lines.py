r"""Splitting a process's output into log lines in bounded memory, whatever its line endings.

Output is read in chunks (:data:`READ_SIZE`), never a line at a time: a line longer than
:data:`MAX_LINE_BYTES` is logged in pieces of that size, and a progress bar (``\r`` without ``\n``, as
tqdm writes it) is logged as a terminal shows it, at most every :data:`PROGRESS_INTERVAL` seconds while it
is being rewritten. Both backends' hosts use it (``fray_local._proc``, ``fray_ray._host``).

>>> LineSplitter().feed(b"a\r\rb\nc")
['b']
"""

from __future__ import annotations

import time

__all__ = ["MAX_LINE_BYTES", "PROGRESS_INTERVAL", "READ_SIZE", "LineSplitter"]

#: a longer line is logged in pieces of this many bytes
MAX_LINE_BYTES = 64 * 1024
#: seconds between two logged states of a progress bar being rewritten with ``\r``
PROGRESS_INTERVAL = 5.0
#: bytes read from a pipe at a time
READ_SIZE = 64 * 1024


class LineSplitter:
    r"""Turns a host's output, fed in byte chunks, into the lines to log, holding at most about
    ``2 * MAX_LINE_BYTES`` whatever the input.

    ``\n`` ends a line (``\r\n`` too); ``\r`` returns to the start of the line, as on a terminal: of a
    line rewritten with ``\r`` (a progress bar) what is logged is what a terminal would show last, plus the
    bar as it stands every ``progress_interval`` seconds while it is being rewritten.

    >>> s = LineSplitter(progress_interval=60.0)
    >>> s.feed(b"start\n\r 10%", now=0.0), s.feed(b"\r 50%", now=1.0), s.feed(b"\r100%\r\nlast", now=2.0)
    (['start', ' 10%'], [], ['100%'])
    >>> s.close()
    ['last']
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES, progress_interval: float = PROGRESS_INTERVAL) -> None:
        self.max_line = max_line
        self.progress_interval = progress_interval
        self._cur = b""  # text after the last '\r' or '\n'
        self._prog: bytes | None = None  # the last non-empty '\r'-ended segment of the current line
        self._logged: bytes | None = None  # the progress state last logged for the current line
        self._logged_at = -float("inf")

    def feed(self, chunk: bytes, now: float | None = None) -> list[str]:
        """The lines that ``chunk`` completes (and a progress line when one is due)."""
        out: list[bytes] = []
        pieces = chunk.split(b"\n")
        for k, piece in enumerate(pieces):
            self._absorb(piece, out)
            if k < len(pieces) - 1:
                self._end_line(out)
        if self._prog is not None:  # a progress bar is being rewritten: log it as it stands, now and then
            now = time.monotonic() if now is None else now
            shown = self._cur or self._prog
            if now - self._logged_at > self.progress_interval and shown != self._logged:
                out.append(shown)
                self._logged, self._logged_at = shown, now
        return [self._decode(b) for b in out]

    def close(self) -> list[str]:
        """What is left at the end of the output (a last line without ``\n`` is kept)."""
        out: list[bytes] = []
        if self._cur or self._prog is not None:
            self._end_line(out)
        return [self._decode(b) for b in out]

    def _absorb(self, piece: bytes, out: list[bytes]) -> None:
        """Take text with no ``\n`` in it."""
        j = piece.rfind(b"\r")
        if j >= 0:
            body = piece[:j].rstrip(b"\r")  # tqdm starts every state with '\r': an empty segment is no state
            i = body.rfind(b"\r")
            seg = self._cur + body if i < 0 else body[i + 1 :]
            if seg:
                self._prog = seg[-self.max_line :]
            elif self._prog is None:
                self._prog = b""
            self._cur = piece[j + 1 :]
        else:
            self._cur += piece
        while len(self._cur) > self.max_line:  # a very long line is logged in pieces
            out.append(self._cur[: self.max_line])
            self._cur = self._cur[self.max_line :]

    def _end_line(self, out: list[bytes]) -> None:
        shown = self._cur or self._prog or b""
        if not (self._prog is not None and shown == self._logged):  # not logged already as progress
            out.append(shown)
        self._cur, self._prog, self._logged = b"", None, None

    @staticmethod
    def _decode(raw: bytes) -> str:
        return raw.decode("utf-8", "replace")

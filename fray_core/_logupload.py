"""Shipping a job's log to a remote job store by appending, never by re-uploading the whole of it.

The supervisor writes the job's log to a local file; a store on another machine (``gs://...``) gets the
bytes written since the last upload. Objects in a bucket cannot be appended to: a filesystem that can
compose objects (gcsfs's ``merge``, GCS's compose) gets the new bytes as a part and composes it onto the
log; one that opens files for appending (a local or mounted path, fsspec's memory) appends; any other
rewrites the log (the old behaviour, quadratic in the log's length, kept only as the last resort).

Example::

    offset = 0
    offset = append_upload(store.fs, "/tmp/job.log", store.log_path(job_id), offset)  # every few seconds
"""

from __future__ import annotations

from typing import Any

__all__ = ["append_upload"]


def append_upload(fs: Any, src: str, dst: str, offset: int) -> int:
    """Send the complete lines of the local file ``src`` past byte ``offset`` to ``dst`` on ``fs``;
    returns the offset after them (unchanged when there is nothing new)."""
    with open(src, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n")
    if end < 0:
        return offset
    data = data[: end + 1]
    if offset == 0 or not fs.exists(dst):
        with fs.open(dst, "wb") as out:
            out.write(data)
    elif callable(getattr(fs, "merge", None)):
        part = f"{dst}.part"
        with fs.open(part, "wb") as out:
            out.write(data)
        fs.merge(dst, [dst, part])
        fs.rm(part)
    else:
        try:
            with fs.open(dst, "ab") as out:
                out.write(data)
        except (NotImplementedError, ValueError):  # no append on this filesystem: rewrite it whole
            with open(src, "rb") as f, fs.open(dst, "wb") as out:
                out.write(f.read(offset + len(data)))
    return offset + len(data)

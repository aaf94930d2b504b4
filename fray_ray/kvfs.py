"""Job records kept in the Ray cluster itself: an fsspec filesystem over the GCS's key-value store.

A Ray cluster's default job store (``RayCluster()`` with no ``jobs_dir`` and no ``$FRAY_JOBS_DIR``) is
``ray-kv://HOST:PORT/NAMESPACE``: every machine that reaches the cluster's address reaches its records, as
Ray's own job submission keeps its jobs' info in the GCS. The URL names the GCS, so a record found anywhere
says where to read the rest of it, and a process reads the store with a plain GCS client (no ``ray.init``,
no worker): the CLI lists a cluster's jobs in milliseconds.

``JobStore`` uses it as it uses ``gs://``: records written whole, the job's log appended in parts
(``fray_core._logupload``). Limits, because the GCS holds every byte in its memory: a file of at most
:data:`MAX_FILE` bytes. A larger file written whole (a job's results) fails its write saying so (give
``jobs_dir='gs://...'`` for those); a log appended past it is cut there, with a line saying so, and takes
nothing more.

Layout in the KV namespace :data:`KV_NAMESPACE`: ``m:<path>`` a file's metadata (JSON: its generation and
its chunks' sizes), ``d:<path>:<generation>:<i>`` its bytes, in chunks of at most :data:`CHUNK` bytes. A
rewrite puts the new chunks under a new generation and then the metadata (one put: a reader sees the old
file or the new one, never a mix); an append rewrites only the last chunk and adds new ones, then the
metadata. A file of at most :data:`INLINE` bytes (a job's record, a short log) is its metadata's value
itself, ``=`` and its bytes: read in one GCS call and written in one (issue 29: a job's record is read once a
second by whoever waits on it, and every call a job adds queues behind the GCS's other work on a large
cluster). Directories are implicit (a path with files under it), as in an object store.

Example::

    store = JobStore("ray-kv://10.0.0.2:6379/fray")  # fray_core.records registers the protocol lazily
    store.list_infos()
"""

from __future__ import annotations

import collections
import errno
import io
import json
import threading
import uuid
from typing import Any

from fsspec import AbstractFileSystem

__all__ = ["CHUNK", "INLINE", "KV_NAMESPACE", "MAX_FILE", "PROTOCOL", "RayKVFileSystem", "kv_root"]

PROTOCOL = "ray-kv"
KV_NAMESPACE = "fray-store"
CHUNK = 1 << 20  # bytes per KV value: an append rewrites at most this much
MAX_FILE = 64 << 20  # bytes per file: the GCS keeps all of it in memory
INLINE = 64 << 10  # a file of at most this many bytes is kept in its metadata's value (see the module doc)
_INLINE_TAG = b"="  # what starts an inline file's value (a chunked file's metadata is JSON: "{")
TIMEOUT = 10.0  # seconds per GCS call: an unreachable cluster fails a store call, never hangs it


def kv_root(gcs_address: str, namespace: str) -> str:
    """The store URL of a cluster's records.

    >>> kv_root("10.0.0.2:6379", "fray")
    'ray-kv://10.0.0.2:6379/fray'
    """
    return f"{PROTOCOL}://{gcs_address}/{namespace}"


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def _gcs(address: str) -> Any:
    """A GCS client for ``address`` (one per process and address): the connected worker's when this
    process is connected to that cluster, else a plain one."""
    with _clients_lock:
        client = _clients.get(address)
        if client is None:
            from ray._raylet import GcsClient

            client = _clients[address] = GcsClient(address=address)
        return client


class RayKVFileSystem(AbstractFileSystem):
    """fsspec filesystem ``ray-kv://HOST:PORT/...`` over the GCS key-value store (see the module doc)."""

    protocol = PROTOCOL
    root_marker = ""
    #: files this process last wrote whole: what it knows of their generation without asking (see _old_meta)
    KNOWN_MAX = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._known: collections.OrderedDict[tuple[int, str], str | None] = collections.OrderedDict()
        self._known_lock = threading.Lock()

    def _old_meta(self, gcs: Any, rest: str) -> dict[str, Any] | None:
        """The metadata of the file a whole write replaces, for the old generation's bytes to go: what this
        process wrote last, when it wrote the file last, without a GCS call (a job's record is rewritten by
        its supervisor at each state: the read was half of each write's cost, issue 29). Another writer
        that wrote a chunked copy in between would leave that copy's chunks until the file's dir is
        removed; a record has one writer once its supervisor took the job."""
        with self._known_lock:
            key = (id(gcs), rest)
            if key in self._known:
                gen = self._known[key]
                return None if gen is None else {"gen": gen}
        return self._meta(gcs, rest)

    def _knows(self, gcs: Any, rest: str) -> bool:
        with self._known_lock:
            return (id(gcs), rest) in self._known

    def assume_inline(self, path: str) -> None:
        """Take ``path`` as a file another process wrote whole and small (inline, no chunks) and nobody
        rewrote since, as if this process had: its next rewrite is one GCS call (:meth:`_old_meta`). A job's
        supervisor says so of the record its client wrote and handed over with the job.

        >>> RayKVFileSystem().assume_inline("ray-kv://10.0.0.2:6379/fray/train-1/record.json")  # doctest: +SKIP
        """
        gcs, rest = self._split(path)
        self._wrote(gcs, rest, None)

    def _wrote(self, gcs: Any, rest: str, gen: str | None) -> None:
        with self._known_lock:
            key = (id(gcs), rest)
            self._known[key] = gen
            self._known.move_to_end(key)
            while len(self._known) > self.KNOWN_MAX:
                self._known.popitem(last=False)

    def _forget(self, gcs: Any, rest: str | None = None) -> None:
        """Forget what was written at ``rest`` (``None``: everything)."""
        with self._known_lock:
            if rest is None:
                self._known.clear()
            else:
                self._known.pop((id(gcs), rest), None)

    # ------------------------------------------------------------------------------------ keys

    def _split(self, path: str) -> tuple[Any, str]:
        """(the GCS client, the path within the store) of ``path`` (``HOST:PORT/rest``, protocol optional)."""
        path = self._strip_protocol(path).rstrip("/")
        address, _, rest = path.partition("/")
        if not address or ":" not in address:
            raise ValueError(f"{PROTOCOL}:// path {path!r}: expected {PROTOCOL}://HOST:PORT/NAMESPACE/...")
        return _gcs(address), rest

    @staticmethod
    def _call(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args, namespace=KV_NAMESPACE.encode(), timeout=TIMEOUT)
        except Exception as e:  # Ray's own errors (RpcError, GetTimeoutError) as the OSError callers expect
            raise OSError(errno.EIO, f"Ray's GCS key-value store: {type(e).__name__}: {e}") from e

    def _meta(self, gcs: Any, rest: str) -> dict[str, Any] | None:
        """The file's metadata (``None``: no such file); an inline file's has its bytes as ``inline``."""
        raw = self._call(gcs.internal_kv_get, f"m:{rest}".encode())
        if not raw:
            return None
        if raw[:1] == _INLINE_TAG:
            return {"gen": None, "sizes": [len(raw) - 1], "inline": raw[1:]}
        return json.loads(raw)

    # ---------------------------------------------------------------------------- fsspec API

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        gcs, rest = self._split(path)
        name = self._strip_protocol(path).rstrip("/")
        meta = self._meta(gcs, rest)
        if meta is not None:
            return {"name": name, "size": sum(meta["sizes"]), "type": "file"}
        if self._call(gcs.internal_kv_keys, f"m:{rest}/".encode() if rest else b"m:"):
            return {"name": name, "size": 0, "type": "directory"}
        raise FileNotFoundError(errno.ENOENT, "no such file in the cluster's store", name)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        gcs, rest = self._split(path)
        base = self._strip_protocol(path).rstrip("/")
        prefix = f"m:{rest}/" if rest else "m:"
        children: dict[str, str] = {}
        for key in self._call(gcs.internal_kv_keys, prefix.encode()):
            tail = key.decode(errors="replace")[len(prefix) :]
            head, sep, _ = tail.partition("/")
            if head:
                children[head] = "directory" if sep or children.get(head) == "directory" else "file"
        if not children:
            if self._meta(gcs, rest) is not None:  # ls of a file: the file
                return [self.info(path)] if detail else [base]
            raise FileNotFoundError(errno.ENOENT, "no such directory in the cluster's store", base)
        names = sorted(children)
        if not detail:
            return [f"{base}/{n}" for n in names]
        return [
            {"name": f"{base}/{n}", "type": t, "size": 0} if t == "directory" else self.info(f"{base}/{n}")
            for n, t in ((n, children[n]) for n in names)
        ]

    def exists(self, path: str, **kwargs: Any) -> bool:
        gcs, rest = self._split(path)
        if self._call(gcs.internal_kv_exists, f"m:{rest}".encode()):
            return True
        return bool(self._call(gcs.internal_kv_keys, f"m:{rest}/".encode()))

    def isfile(self, path: str) -> bool:
        gcs, rest = self._split(path)
        # one call, O(1) (fsspec's reads the file, and asks for a listing too when it is not one)
        return bool(self._call(gcs.internal_kv_exists, f"m:{rest}".encode()))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass  # directories are implicit

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        pass

    def rm_file(self, path: str) -> None:
        gcs, rest = self._split(path)
        meta = self._meta(gcs, rest)
        if meta is None:
            raise FileNotFoundError(errno.ENOENT, "no such file in the cluster's store", path)
        self._forget(gcs, rest)
        self._call(gcs.internal_kv_del, f"m:{rest}".encode(), False)
        self._call(gcs.internal_kv_del, f"d:{rest}:".encode(), True)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        for p in [path] if isinstance(path, str) else list(path):
            gcs, rest = self._split(p)
            if self._meta(gcs, rest) is not None:
                self.rm_file(p)
            elif recursive:
                self._forget(gcs)
                self._call(gcs.internal_kv_del, f"m:{rest}/".encode(), True)
                self._call(gcs.internal_kv_del, f"d:{rest}/".encode(), True)
            elif self.exists(p):
                raise IsADirectoryError(errno.EISDIR, "a directory: rm it with recursive=True", p)
            else:
                raise FileNotFoundError(errno.ENOENT, "no such file in the cluster's store", p)

    def _rm(self, path: str) -> None:
        self.rm(path)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        gcs, rest = self._split(path)
        if mode == "rb":
            meta = self._meta(gcs, rest)
            if meta is None:
                raise FileNotFoundError(errno.ENOENT, "no such file in the cluster's store", path)
            if "inline" in meta:
                return io.BytesIO(meta["inline"])
            if len(meta["sizes"]) <= 1:  # one chunk: read now, in one call (a rewrite meanwhile cannot tear it)
                return io.BytesIO(b"".join(self._chunks(gcs, rest, meta, 0, 0)) if meta["sizes"] else b"")
            return io.BufferedReader(_Reader(self, gcs, rest, meta), buffer_size=CHUNK)
        if mode in ("wb", "ab", "xb"):
            if mode == "xb" and self._meta(gcs, rest) is not None:
                raise FileExistsError(errno.EEXIST, "exists in the cluster's store", path)
            return _Writer(self, gcs, rest, append=mode == "ab")
        raise ValueError(f"{PROTOCOL}://: mode {mode!r} is not supported (rb, wb, ab, xb)")

    # ------------------------------------------------------------------------------ reads/writes

    def _chunks(self, gcs: Any, rest: str, meta: dict[str, Any], first: int, last: int) -> list[bytes]:
        keys = [f"d:{rest}:{meta['gen']}:{i}".encode() for i in range(first, last + 1)]
        got = self._call(gcs.internal_kv_multi_get, keys)
        out = []
        for i, key in zip(range(first, last + 1), keys):
            data = got.get(key)
            if data is None or len(data) < meta["sizes"][i]:  # rewritten or removed meanwhile
                raise OSError(errno.EIO, f"{PROTOCOL}://{rest} changed while being read: read it again")
            out.append(data[: meta["sizes"][i]])  # an append after our look may have made it longer
        return out

    def _commit(self, gcs: Any, rest: str, data: bytes, append: bool) -> None:
        meta = self._meta(gcs, rest) if append else None
        if meta is not None and "inline" in meta:  # an append to an inline file: the file is written whole
            data, cut = meta["inline"] + data, False
            if len(data) > MAX_FILE:  # a log: cut where the limit is, saying so (as below)
                data, cut = data[:MAX_FILE] + _cut_note(), True
            self._write_whole(gcs, rest, data, meta, cut)
            return
        if meta is not None and meta["sizes"]:
            have = sum(meta["sizes"])
            if meta.get("cut"):
                return  # a log cut at the limit takes nothing more (its writer goes on as if it did)
            if have + len(data) > MAX_FILE:  # a log: keep what fits and say where it was cut, once
                data = data[: max(0, MAX_FILE - have)] + _cut_note()
                meta["cut"] = True
            last = len(meta["sizes"]) - 1
            if meta["sizes"][last] < CHUNK:  # fill the last chunk up first
                (tail,) = self._chunks(gcs, rest, meta, last, last)
                data = tail + data
                meta["sizes"].pop()
            start = len(meta["sizes"])
            gen = meta["gen"]
        else:
            if len(data) > MAX_FILE:
                raise _too_big(rest, len(data))
            if not append and len(data) <= INLINE and not self._knows(gcs, rest):
                # a file this process did not write: most are new (a job's results; its record, from its
                # client): put it only if there is none, one call; else read what it replaces, as below
                if self._call(gcs.internal_kv_put, f"m:{rest}".encode(), _INLINE_TAG + data, False):
                    self._wrote(gcs, rest, None)
                    return
            self._write_whole(gcs, rest, data, meta if append else self._old_meta(gcs, rest), False)
            return
        self._put_chunks(gcs, rest, data, gen, start, meta["sizes"], bool(meta.get("cut")))

    def _write_whole(self, gcs: Any, rest: str, data: bytes, old: dict[str, Any] | None, cut: bool) -> None:
        """``data`` as the whole file (inline when small), then the bytes of the file it replaces go."""
        self._forget(gcs, rest)  # until the write is done: a failed one leaves the file unknown
        if len(data) <= INLINE and not cut:
            self._call(gcs.internal_kv_put, f"m:{rest}".encode(), _INLINE_TAG + data, True)
            gen = None
        else:
            gen = uuid.uuid4().hex[:12]
            self._put_chunks(gcs, rest, data, gen, 0, [], cut)
        self._wrote(gcs, rest, gen)
        if old is not None and old.get("gen"):  # the old generation's bytes, once nothing points at them
            self._call(gcs.internal_kv_del, f"d:{rest}:{old['gen']}:".encode(), True)

    def _put_chunks(self, gcs: Any, rest: str, data: bytes, gen: str, start: int, sizes: list[int], cut: bool) -> None:
        """``data`` as chunks ``start``.. of generation ``gen`` after ``sizes``, then the metadata naming them."""
        pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
        for i, piece in enumerate(pieces, start):
            self._call(gcs.internal_kv_put, f"d:{rest}:{gen}:{i}".encode(), piece, True)
        meta = {"gen": gen, "sizes": sizes + [len(p) for p in pieces], "cut": cut}
        self._call(gcs.internal_kv_put, f"m:{rest}".encode(), json.dumps(meta).encode(), True)


def _cut_note() -> bytes:
    return (
        f"\n[fray] the log is cut here: the cluster's own store keeps at most {MAX_FILE} bytes of a file (the GCS "
        "holds it in memory); give RayCluster(jobs_dir='gs://BUCKET/fray') for longer logs\n"
    ).encode()


def _too_big(rest: str, size: int) -> OSError:
    return OSError(
        errno.EFBIG,
        f"{PROTOCOL}://{rest}: {size} bytes; the cluster's own store keeps at most {MAX_FILE} bytes per file "
        "(the GCS holds it in memory): give RayCluster(jobs_dir='gs://BUCKET/fray') for larger results and logs",
    )


class _Reader(io.RawIOBase):
    """A file of the store as it was when opened, read a chunk at a time."""

    def __init__(self, fs: RayKVFileSystem, gcs: Any, rest: str, meta: dict[str, Any]) -> None:
        self._fs, self._gcs, self._rest, self._meta = fs, gcs, rest, meta
        self._size = sum(meta["sizes"])
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size:
            return 0
        start = 0
        for i, size in enumerate(self._meta["sizes"]):  # the chunk holding _pos
            if self._pos < start + size:
                (data,) = self._fs._chunks(self._gcs, self._rest, self._meta, i, i)
                piece = data[self._pos - start :][: len(buffer)]
                buffer[: len(piece)] = piece
                self._pos += len(piece)
                return len(piece)
            start += size
        return 0


class _Writer(io.RawIOBase):
    """Bytes kept here and committed at ``close`` (one metadata put makes them visible)."""

    def __init__(self, fs: RayKVFileSystem, gcs: Any, rest: str, append: bool) -> None:
        self._fs, self._gcs, self._rest, self._append = fs, gcs, rest, append
        self._buf = io.BytesIO()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._append and self._buf.tell() > MAX_FILE:  # the rest is cut at commit: keep no more of it
            return len(data)
        n = self._buf.write(data)
        if not self._append and self._buf.tell() > MAX_FILE:
            raise _too_big(self._rest, self._buf.tell())
        return n

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:  # the writer failed: nothing of it is committed
            self._buf = None  # type: ignore[assignment]
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        if self._buf is None:
            super().close()
            return
        try:
            self._fs._commit(self._gcs, self._rest, self._buf.getvalue(), self._append)
        finally:
            self._buf = io.BytesIO()
            super().close()

"""One view of the Ray cluster's state per process, shared by every job the process runs or watches.

Reading the cluster's state costs the GCS in proportion to the cluster, not to the caller: one ``ray.nodes()``
is ~5 ms of GCS CPU at 1,000 nodes and ~150 ms at 16,000 (bench/NOTES.md, issue 29). So no job reads it on
its own schedule: each kind of state (the live node table, the resources available per node, the nodes Ray
drains) is read at most once per :data:`REFRESH_S` per process, by the first caller that finds its copy
older than that, and every other caller of the process gets the same copy (a caller that comes during a
read waits for it rather than starting another). Nothing is read while no one asks. The reader for the
whole cluster is the scheduler actor (``fray_ray.scheduler``: for every queued and running job, with the
node table kept by :class:`NodeFeed`); a supervisor reads its own copy only when its job claims slices.

There is no thread to leak: a read happens in the caller's thread.

>>> view = ClusterView.shared()
>>> view is ClusterView.shared()
True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import ray

__all__ = ["MAX_INTERVAL_S", "READ_BACKOFF", "REFRESH_S", "ClusterView"]

REFRESH_S = 1.0  # seconds a copy of the cluster's state is served before it is read again

#: How often the scheduler repeats a read while nothing says the state changed: every ``READ_BACKOFF`` times
#: the seconds the last read took (a read keeps the GCS busy at most 1/400 of the time), at least
#: :data:`REFRESH_S`, at most the kind's ``MAX_INTERVAL_S``. The reads of the available resources and of the
#: draining nodes cost the GCS in proportion to the cluster (~80 ms and 0.65 ms of GCS work a call at 16,000
#: hosts on a quiet machine, up to 10x that on a loaded one: bench/NOTES.md, issue 29): read every second, they
#: kept the GCS busy and every job's own calls queued behind them. At 1,000 hosts a read takes a few ms:
#: every 1-4 s. What a job does (claim, release, end) and nodes coming or going make the scheduler read the
#: available resources within a second anyway.
READ_BACKOFF = 400.0
MAX_INTERVAL_S = {"available": 30.0, "draining": 5.0}


def _read_nodes() -> dict[str, dict[str, Any]]:
    return {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}


def _read_available() -> dict[str, dict[str, float]]:
    from ray._private.state import available_resources_per_node

    return available_resources_per_node()


def _read_draining() -> dict[str, int]:
    gcs = ray._private.worker.global_worker.gcs_client
    return {(k.hex() if hasattr(k, "hex") else str(k)): int(v) for k, v in gcs.get_draining_nodes(timeout=5).items()}


class _Cached:
    """One kind of state: the last copy, when it was read, and the lock one reader holds."""

    def __init__(self, read: Callable[[], Any], empty: Any) -> None:
        self.read = read
        self.snapshot: tuple[Any, int] = (empty, 0)  # the copy and the number of the read that gave it
        self.at = float("-inf")  # time.monotonic() of the read that gave ``value``
        self.took = 0.0  # seconds that read took (a slow GCS shows here first)
        self.began = (0, float("-inf"))  # the number of the last read and its time.monotonic() when it began
        self.lock = threading.Lock()
        self.reads = 0

    def get(self, max_age: float) -> Any:
        return self.numbered(max_age)[0]

    def numbered(self, max_age: float) -> tuple[Any, int]:
        """The copy and which read gave it (one snapshot: never a copy paired with another read's number)."""
        snap = self.snapshot
        if time.monotonic() - self.at < max_age:
            return snap
        with self.lock:
            if time.monotonic() - self.at < max_age:  # another caller read it while we waited
                return self.snapshot
            t0 = time.monotonic()
            value = self.read()
            self.took, self.reads = time.monotonic() - t0, self.reads + 1
            self.snapshot, self.at, self.began = (value, self.reads), time.monotonic(), (self.reads, t0)
            return self.snapshot


class ClusterView:
    """The process's shared copy of the cluster's state (see the module doc). ``max_age`` of a call: the
    oldest copy it accepts (default :data:`REFRESH_S`; less is never served: one read per second per
    process is the point).

    >>> v = ClusterView.shared()
    >>> isinstance(v.age("nodes"), float)
    True
    """

    _instance: ClassVar[ClusterView | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._state = {
            "nodes": _Cached(_read_nodes, {}),
            "available": _Cached(_read_available, {}),
            "draining": _Cached(_read_draining, {}),
        }

    @classmethod
    def shared(cls) -> ClusterView:
        """The process's view (made on first use)."""
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _get(self, kind: str, max_age: float | None) -> Any:
        return self._state[kind].get(max(REFRESH_S, max_age if max_age is not None else REFRESH_S))

    def nodes(self, max_age: float | None = None) -> dict[str, dict[str, Any]]:
        """The live nodes (``ray.nodes()`` entries by node id). Do not modify the result: it is shared."""
        return self._get("nodes", max_age)

    def numbered(self, kind: str, max_age: float | None = None) -> tuple[Any, int]:
        """``kind``'s copy and the number of the read that gave it (a copy's identity: what was computed
        from read ``n`` need not be computed again)."""
        return self._state[kind].numbered(max(REFRESH_S, max_age if max_age is not None else REFRESH_S))

    def available(self, max_age: float | None = None) -> dict[str, dict[str, float]]:
        """Each live node's available resources (``available_resources_per_node()``). Shared: do not modify."""
        return self._get("available", max_age)

    def invalidate(self, kind: str) -> None:
        """The next caller reads ``kind`` afresh: this process changed it and knows the copy is stale (a job
        that released its slices and claims again; rare, so not a way around the one-read-a-second rule)."""
        self._state[kind].at = float("-inf")

    def interval(self, kind: str) -> float:
        """Seconds between reads of ``kind`` while nothing says it changed (see :data:`READ_BACKOFF`)."""
        took = self._state[kind].took
        return min(MAX_INTERVAL_S.get(kind, REFRESH_S), max(REFRESH_S, READ_BACKOFF * took))

    def age(self, kind: str) -> float:
        """Seconds since ``kind`` (``nodes``, ``available``, ``draining``) was last read (inf: never)."""
        return time.monotonic() - self._state[kind].at

    def began(self, kind: str, read: int) -> float:
        """When (``time.monotonic()``) read number ``read`` of ``kind`` began: what it can know of comes
        before; ``-inf`` when that is not the last read (a newer one came since)."""
        number, t0 = self._state[kind].began
        return t0 if number == read else float("-inf")

    def read_seconds(self, kind: str) -> float:
        """How long the last read of ``kind`` took: a GCS that falls behind shows here."""
        return self._state[kind].took

    def reads(self, kind: str) -> int:
        """How many times ``kind`` was read from the GCS by this process (what the sharing saves shows here)."""
        return self._state[kind].reads


def node_entry(info: Any) -> dict[str, Any]:
    """A ``GcsNodeInfo`` message as ``ray.nodes()`` shows the node (the fields Fray reads)."""
    from ray.core.generated import gcs_pb2

    return {
        "NodeID": info.node_id.hex(),
        "Alive": info.state == gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE,
        "NodeManagerAddress": info.node_manager_address,
        "Resources": dict(info.resources_total),
        "Labels": dict(info.labels),
    }


class NodeFeed:
    """The live node table kept by Ray's node-change channel (``GCS_NODE_INFO_CHANNEL``, as Ray's dashboard
    reads it): one full read after subscribing, then only what changed. A full read of the node table is
    O(N) for the GCS (~250 ms of its CPU at 16,000 hosts, issue 29); a node joining or leaving is one small
    message. Used by the scheduler actor (an asyncio event loop): :meth:`start` once, :meth:`numbered` for
    the table. The table is read again in full every ``resync`` seconds, and whenever following the channel
    failed (a GCS restart: messages may have been missed), so a missed message costs at most that long.

    >>> NodeFeed("127.0.0.1:6379").healthy
    False
    """

    def __init__(self, gcs_address: str, resync: float = 300.0) -> None:
        self.gcs_address = gcs_address
        self.resync = resync
        self.table: dict[str, dict[str, Any]] = {}  # replaced, never changed in place (readers keep a copy)
        self.version = 0
        self.full_reads = 0  # how many times the whole table was read (the rest came as changes)
        self.healthy = False
        self.error = ""
        self._task: Any = None

    async def start(self) -> None:
        """Subscribe, read the table in full, and follow the channel in a task of the running loop."""
        import asyncio

        from ray._private.gcs_pubsub import GcsAioNodeInfoSubscriber

        subscriber = GcsAioNodeInfoSubscriber(address=self.gcs_address)
        await subscriber.subscribe()  # first: a change between the full read and the subscription is not missed
        await self._full_read()
        self.healthy = True
        self._task = asyncio.get_running_loop().create_task(self._follow(subscriber))

    async def _full_read(self) -> None:
        import asyncio

        table = await asyncio.get_running_loop().run_in_executor(None, _read_nodes)
        self.table, self.version, self.full_reads = table, self.version + 1, self.full_reads + 1

    async def _follow(self, subscriber: Any) -> None:
        last_full = time.monotonic()
        try:
            while True:
                updates = await subscriber.poll(batch_size=1000, timeout=self.resync)
                if time.monotonic() - last_full >= self.resync:
                    await self._full_read()
                    last_full = time.monotonic()
                    continue
                if not updates:
                    continue
                table = dict(self.table)
                for _, info in updates:
                    entry = node_entry(info)
                    if entry["Alive"]:
                        # a message may carry only what changed: keep what the table knew of the node
                        old = table.get(entry["NodeID"], {})
                        table[entry["NodeID"]] = {
                            **old,
                            **{k: v for k, v in entry.items() if v or k not in old},
                        }
                    else:
                        table.pop(entry["NodeID"], None)
                self.table, self.version = table, self.version + 1
        except Exception as e:  # noqa: BLE001 - the caller falls back to full reads, saying why
            self.healthy, self.error = False, f"{type(e).__name__}: {e}"
        finally:
            try:
                await subscriber.close()
            except Exception:
                pass

    def numbered(self) -> tuple[dict[str, dict[str, Any]], int]:
        """The table and its version (a new number, and a new dict, with every change)."""
        return self.table, -self.version  # negative: never equal to a ClusterView read number

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

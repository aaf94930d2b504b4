"""Preemption notices pushed from a supervisor process to its hosts, with no call to the GCS while none comes.

A host learns of its slice's drain (a preemption notice with a deadline) from its job's supervisor, which sees
the cluster's draining nodes. Each host read a KV key once a second before: one GCS call a second per host,
16,000 a second for one job of 16,000 hosts (issue 29). Now the supervisor process keeps one :class:`NoticeBoard`
and a chain of Ray objects: epoch ``k`` is the result of one blocking call on the supervisor actor
(``JobSupervisor.notice_board(k)``), which returns when the next notice is posted (or after ``ROLL_S``) with
``(active notices, [ref of epoch k+1])``. Every host task gets the current epoch's ref; its process waits on
it with ``ray.wait``, which the owner (the supervisor process) answers directly: no GCS call and no polling
while no notice comes. A host whose board is gone (its supervisor process died, the job adopted by another)
goes back to reading the KV key, which the supervisor still writes.

Example (no Ray needed to post; the chain needs the actor)::

    board = NoticeBoard()
    board.post("train-1/0", 1_900_000_000.0)     # wakes the epoch's waiter
    board.wait(0, timeout=0)                     # ({"train-1/0": 1900000000.0}, 1)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BOARD", "ROLL_S", "NoticeBoard", "board_key"]

ROLL_S = 600.0  # an epoch's call ends after this even with no notice (no call without a deadline)
KEEP_S = 300.0  # a notice is dropped this long after its deadline (its hosts are gone by then)


def board_key(job_id: str, attempt: int | str) -> str:
    """The key of a job attempt's notice on the board.

    >>> board_key("train-1", 0)
    'train-1/0'
    """
    return f"{job_id}/{attempt}"


class NoticeBoard:
    """The notices of one supervisor process, in epochs (see module doc)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._epoch = 0
        self._notices: dict[str, float] = {}  # board_key -> deadline (epoch seconds)
        self._submit: Callable[[int], Any] | None = None  # epoch -> the ref of the actor call that waits for it
        self._ref: Any = None  # the current epoch's ref
        self._posted_refs: dict[str, Any] = {}  # board_key -> the ref of the epoch that carries its notice

    def attach(self, submit: Callable[[int], Any]) -> None:
        """Called by the supervisor actor: how to start the call that waits for an epoch."""
        with self._cv:
            self._submit = submit

    def ref(self, job_id: str | None = None) -> Any:
        """The current epoch's ref for a new host (``None`` outside a supervisor actor: hosts read the KV); for
        a host of ``job_id`` while a notice of that job is current, the ref of the epoch that carries it (a host
        started after the notice would otherwise wait for the next one)."""
        with self._cv:
            if job_id is not None:
                for key, ref in self._posted_refs.items():
                    if key.startswith(job_id + "/") and key in self._notices:
                        return ref
            if self._ref is None and self._submit is not None:
                try:
                    self._ref = self._submit(self._epoch)
                except Exception:  # noqa: BLE001 - the actor is exiting: its hosts read the KV key
                    self._submit = None
            return self._ref

    def post(self, key: str, deadline: float) -> None:
        """A notice for the hosts of ``key`` (:func:`board_key`): the epoch's waiter returns with it."""
        now = time.time()
        with self._cv:
            self._notices = {k: d for k, d in self._notices.items() if d + KEEP_S > now}
            self._notices[key] = deadline
            self._posted_refs = {k: r for k, r in self._posted_refs.items() if k in self._notices}
            if self._ref is not None:  # the epoch this post ends: its value carries the notice
                self._posted_refs[key] = self._ref
            self._epoch += 1
            self._cv.notify_all()

    def close(self) -> None:
        """The supervisor exits: the epoch's call returns at once and starts no next one (Ray's graceful exit
        of a threaded actor waits for its running calls)."""
        with self._cv:
            self._submit = None
            self._ref = None
            self._posted_refs = {}
            self._epoch += 1
            self._cv.notify_all()

    def wait(self, epoch: int, timeout: float = ROLL_S) -> tuple[dict[str, float], int]:
        """Block until an epoch after ``epoch`` began or ``timeout`` passed; then begin the next one (a call
        that rolled over on time moves the chain on too) and return the notices and the new epoch."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._epoch > epoch, timeout):
                self._epoch += 1
            return dict(self._notices), self._epoch

    def next_epoch(self, epoch: int) -> Any:
        """Start the call that waits for ``epoch`` and make it the current one (the actor's method, at the end
        of each epoch's call)."""
        with self._cv:
            submit = self._submit
        if submit is None:
            return None
        ref = submit(epoch)
        with self._cv:
            if self._epoch <= epoch:  # no later epoch began meanwhile
                self._ref = ref
        return ref


BOARD = NoticeBoard()  # this process's: used only in a supervisor actor's process

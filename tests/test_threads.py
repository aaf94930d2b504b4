"""``fray_core._threads.ThreadPool``: the threads a supervisor process keeps for its jobs and record writes."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fray_core._threads import ThreadPool


def test_work_runs_at_once_even_while_other_work_blocks() -> None:
    pool = ThreadPool("t", keep=30)
    release = threading.Event()
    blocked = threading.Event()

    def block() -> None:
        blocked.set()
        release.wait(30)

    try:
        pool.submit(block)
        assert blocked.wait(10)
        ran = threading.Event()
        pool.submit(ran.set)  # a store that hangs for one job must not hold up another's write
        assert ran.wait(10)
    finally:
        release.set()


def test_an_idle_thread_takes_the_next_work_instead_of_a_new_thread_being_started() -> None:
    pool = ThreadPool("t", keep=30)
    seen: list[int] = []
    done = threading.Event()
    for _ in range(20):
        done.clear()

        def work() -> None:
            seen.append(threading.get_ident())
            done.set()

        pool.submit(work, name="t-work")
        assert done.wait(10)
        # the thread is idle once it counted itself so: wait for that rather than sleep
        assert _wait(lambda: pool._idle == 1)
    assert len(set(seen)) == 1


def test_idle_threads_exit_after_keep_seconds_and_errors_do_not_kill_the_pool() -> None:
    pool = ThreadPool("t-expiring", keep=0.05)
    ran = threading.Event()

    def fail() -> None:
        raise RuntimeError("boom (expected in this test)")

    pool.submit(fail)
    assert _wait(lambda: pool._idle == 0 and not any(t.name == "t-expiring" for t in threading.enumerate()))
    pool.submit(ran.set)
    assert ran.wait(10)


def _wait(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    ev = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if cond():
            return True
        ev.wait(0.01)
    return cond()


def test_a_forked_child_runs_its_work_though_the_parents_idle_threads_did_not_come_with_it() -> None:
    import os

    pool = ThreadPool("t-fork", keep=30)
    done = threading.Event()
    pool.submit(done.set)
    assert done.wait(10) and _wait(lambda: pool._idle == 1)  # an idle thread waits in the parent
    pid = os.fork()
    if pid == 0:  # the child: no thread came with the fork; work must still run
        ran = threading.Event()
        pool.submit(ran.set)
        os._exit(0 if ran.wait(10) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

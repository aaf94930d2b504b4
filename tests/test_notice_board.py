"""The supervisor process's notice board (``fray_ray._notices``): the logic of its epochs, without Ray (the
chain of Ray objects is covered on the emulated cluster by tests/test_ray_attribution.py)."""

from __future__ import annotations

import threading
import time

from fray_ray._notices import KEEP_S, NoticeBoard, board_key


def test_a_posted_notice_ends_the_waiting_epoch_with_every_current_notice() -> None:
    board = NoticeBoard()
    got: list[tuple[dict[str, float], int]] = []
    waiter = threading.Thread(target=lambda: got.append(board.wait(0, timeout=30)))
    waiter.start()
    board.post(board_key("a", 0), 100.0 + time.time())
    waiter.join(10)
    assert not waiter.is_alive()
    notices, epoch = got[0]
    assert list(notices) == ["a/0"] and epoch == 1
    board.post(board_key("b", 1), 200.0 + time.time())
    notices, epoch = board.wait(1, timeout=0)  # an epoch that already ended returns at once
    assert sorted(notices) == ["a/0", "b/1"] and epoch == 2


def test_an_epoch_with_no_notice_rolls_over_after_its_timeout() -> None:
    board = NoticeBoard()
    notices, epoch = board.wait(0, timeout=0.01)
    assert notices == {} and epoch == 1  # the next call waits for epoch 1: the chain moves on


def test_old_notices_are_dropped_and_close_ends_the_wait_and_the_chain() -> None:
    board = NoticeBoard()
    calls: list[int] = []
    board.attach(lambda epoch: calls.append(epoch) or f"ref-{epoch}")
    assert board.ref() == "ref-0" and board.ref() == "ref-0"  # one call per epoch
    board.post("old/0", time.time() - KEEP_S - 1)
    board.post("new/0", time.time() + 30)
    assert list(board.wait(0, timeout=0)[0]) == ["new/0"]  # "old/0" passed its deadline long ago
    assert board.next_epoch(2) == "ref-2" and board.ref() == "ref-2"
    got: list[tuple[dict[str, float], int]] = []
    waiter = threading.Thread(target=lambda: got.append(board.wait(2, timeout=30)))
    waiter.start()
    board.close()
    waiter.join(10)
    assert not waiter.is_alive() and got[0][1] == 3
    assert board.next_epoch(3) is None and board.ref() is None  # no next call: the actor is exiting
    assert calls == [0, 2]

"""The sending thread keeps the order it was given, survives a failed send and drains on close."""

from __future__ import annotations

import functools
import threading

from tritonbox_triton.response_sender import BackgroundSender


def test_sends_run_in_order_off_the_callers_thread() -> None:
    sender = BackgroundSender()
    seen: list[tuple[int, str]] = []

    def record(index: int) -> None:
        seen.append((index, threading.current_thread().name))

    for index in range(200):
        sender.submit(functools.partial(record, index))
    sender.close()
    assert [index for index, _ in seen] == list(range(200))
    assert {name for _, name in seen} == {"response-sender"}


def test_a_failed_send_does_not_stop_the_next() -> None:
    sender = BackgroundSender()
    seen: list[int] = []

    def fail() -> None:
        raise RuntimeError("the client is gone")

    sender.submit(lambda: seen.append(1))
    sender.submit(fail)
    sender.submit(lambda: seen.append(2))
    sender.close()
    assert seen == [1, 2]


def test_close_without_sends_is_quiet_and_a_closed_sender_starts_again() -> None:
    sender = BackgroundSender()
    sender.close()
    seen: list[int] = []
    sender.submit(lambda: seen.append(1))
    sender.close()
    assert seen == [1]

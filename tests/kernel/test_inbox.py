"""The in-process client's inbox (``coral.kernel.client.LocalInbox``): bounded, first in first out, one
reader that waits without spinning, and a close that lets the reader drain what is queued."""

from __future__ import annotations

import anyio
import pytest

from coral.kernel.client import LocalInbox
from coral.kernel.wire import Envelope


def _env(i: int) -> Envelope:
    return Envelope("send", "a", "t", i)


def test_it_keeps_the_order_and_refuses_beyond_its_size() -> None:
    box = LocalInbox(2)
    box.send_nowait(_env(1))
    box.send_nowait(_env(2))
    with pytest.raises(anyio.WouldBlock):
        box.send_nowait(_env(3))
    assert len(box) == 2
    assert [box.receive_nowait().msg, box.receive_nowait().msg] == [1, 2]
    with pytest.raises(anyio.WouldBlock):
        box.receive_nowait()


def test_a_closed_inbox_is_drained_then_ends_and_takes_nothing_more() -> None:
    box = LocalInbox(4)
    box.send_nowait(_env(1))
    box.close()
    with pytest.raises(anyio.ClosedResourceError):
        box.send_nowait(_env(2))
    assert box.receive_nowait().msg == 1
    with pytest.raises(anyio.EndOfStream):
        box.receive_nowait()


async def test_a_waiting_reader_gets_each_message_as_it_comes_and_the_end() -> None:
    box = LocalInbox(4)
    got: list[object] = []

    async def reader() -> None:
        while True:
            try:
                got.append((await box.receive()).msg)
            except anyio.EndOfStream:
                got.append("end")
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        for i in range(3):
            box.send_nowait(_env(i))
            await anyio.wait_all_tasks_blocked()
            assert got == list(range(i + 1))
        box.close()
    assert got == [0, 1, 2, "end"]


async def test_a_reader_cancelled_while_waiting_leaves_the_inbox_usable() -> None:
    box = LocalInbox(4)
    with anyio.move_on_after(0.01):
        await box.receive()
    box.send_nowait(_env(7))
    assert (await box.receive()).msg == 7

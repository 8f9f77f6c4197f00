"""Tasks waiting on an inbox (`Waitable`), on their own: `wake()` wakes every one, each
deadline ends its own wait, and nothing is left behind once they are done."""

from __future__ import annotations

import time

import anyio

from teamrt.mail.waiting import Waitable


async def test_wake_ends_every_wait_and_each_deadline_its_own() -> None:
    board = Waitable()
    results: dict[str, bool] = {}

    async def wait(name: str, seconds: float) -> None:
        results[name] = await board._park(time.monotonic() + seconds)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, "short", 0.01)
            tg.start_soon(wait, "long", 3600)
            tg.start_soon(wait, "forever", float("inf"))
            while "short" not in results:  # noqa: ASYNC110 -- polls state no event announces
                await anyio.sleep(0.005)
            assert board.waited_on
            board.wake()
    assert results == {"short": False, "long": True, "forever": True}
    assert not board.waited_on and not board._deadlines


async def test_a_deadline_already_past_does_not_wait() -> None:
    board = Waitable()
    assert not await board._park(time.monotonic() - 1)
    assert not board.waited_on


async def test_stopping_the_timer_forgets_its_deadlines() -> None:
    board = Waitable()
    async with anyio.create_task_group() as tg:
        tg.start_soon(board._park, time.monotonic() + 3600)
        await anyio.sleep(0.005)
        assert board._timer is not None
        board._stop_timer()
        assert board._timer is None and not board._heap
        board.wake()

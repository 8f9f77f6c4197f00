"""Waiting out a store outage: the one retry rule for every store call teamrt makes.

A network store that cannot be reached (`StoreUnavailable`) or did not answer (`OutcomeUnknown`)
is usually restarting, paused or cut off for a few seconds. `ride_out` retries such a call with
backoff (50 ms doubling to 1 s) for the outage tolerance, then lets the last error through; the
team turns that into a `StoreOutage` stop, never a crash. Other errors are final at once.

Only calls that are safe to repeat go through here: appends (the receiver drops a second copy
by id), reads, cursor commits (the same cursor again), lease renewals, and ledger updates (a
charge whose answer was lost may count twice: a brake errs on the side of stopping).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from teamrt.errors import OutcomeUnknown, StoreOutage, StoreUnavailable

__all__ = ["DEFAULT_STORE_OUTAGE", "ride_out"]

log = logging.getLogger("teamrt.mail")
T = TypeVar("T")

#: How long (s) a store outage is waited out before the work that needs the store stops.
DEFAULT_STORE_OUTAGE = 30.0
_FIRST_DELAY = 0.05
_MAX_DELAY = 1.0


async def ride_out(call: Callable[[], Awaitable[T]], what: str, tolerance: float) -> T:
    """`call()`, retried while the store is unreachable, for up to `tolerance` seconds.

    `what` names the work in the log ("send to w", "commit w's cursor"). After the
    tolerance, the store's last `StoreUnavailable` or `OutcomeUnknown` is raised as it came
    (a `StoreOutage` from a nested call is never retried again)."""
    give_up = time.monotonic() + tolerance
    delay = _FIRST_DELAY
    while True:
        try:
            return await call()
        except StoreOutage:
            raise
        except (StoreUnavailable, OutcomeUnknown) as exc:
            if time.monotonic() + delay > give_up:
                raise
            log.warning("%s: %s; waiting out the outage, trying again in %.2fs", what, exc, delay)
            await anyio.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY)


def outage_of(exc: BaseException, tolerance: float) -> StoreOutage | None:
    """The `StoreOutage` that `exc` stands for (a store error `ride_out` let through), or
    None if `exc` is not about the store being out of reach."""
    if isinstance(exc, StoreOutage):
        return exc
    if isinstance(exc, (StoreUnavailable, OutcomeUnknown)):
        outage = StoreOutage(
            f"the store was out of reach for longer than the outage tolerance "
            f"(store_outage={tolerance:g}s): {exc}"
        )
        outage.__cause__ = exc
        return outage
    return None

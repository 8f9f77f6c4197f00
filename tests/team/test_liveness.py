"""When a request's member counts as gone (`TeammateGone`): not at one check that finds no live
holder (right after a server pause its lease may have expired before it could renew it), but
when the checks have found none for `GONE_AFTER` seconds."""

from __future__ import annotations

from teamrt.mail.mailboxes import GONE_AFTER, _Liveness


def test_one_check_without_a_live_holder_is_not_gone() -> None:
    liveness = _Liveness()
    assert not liveness.gone(False, 10.0)
    assert not liveness.gone(False, 10.0 + GONE_AFTER / 2)


def test_checks_without_a_live_holder_for_gone_after_seconds_are_gone() -> None:
    liveness = _Liveness()
    assert not liveness.gone(False, 10.0)
    assert liveness.gone(False, 10.0 + GONE_AFTER)


def test_a_holder_seen_again_starts_the_count_over() -> None:
    liveness = _Liveness()
    liveness.gone(False, 10.0)
    assert not liveness.gone(True, 11.0)  # it took its lease back
    assert not liveness.gone(False, 10.0 + GONE_AFTER)
    assert not liveness.gone(None, 20.0)  # the store cannot tell (out of reach): not gone
    assert not liveness.gone(False, 21.0)
    assert liveness.gone(False, 21.0 + GONE_AFTER)

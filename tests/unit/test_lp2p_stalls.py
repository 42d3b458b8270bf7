"""The bound on what a forwarder that stalls announce fetches can hold (``protocol.transport.lp2p.stalls``)."""

from __future__ import annotations

import pytest

from protocol.transport.lp2p.stalls import MAX_TRACKED, ForwarderBackoff


def test_a_failed_fetch_holds_its_forwarder_off_for_a_backoff_that_doubles_up_to_the_cap():
    b = ForwarderBackoff(base_s=10, max_s=40, max_in_flight=2)
    now = 0.0
    holds = []
    for _ in range(4):
        assert b.refusal("p", now) is None
        b.start("p")
        b.finish("p", now, served=False)
        start = now
        assert b.refusal("p", now) == "announce_forwarder_held_off" and b.refusal("q", now) is None
        while b.held_off("p", now):
            now += 1
        holds.append(now - start)
    assert holds == [10, 20, 40, 40]


def test_a_served_fetch_halves_the_backoff_and_clears_it_below_the_base():
    b = ForwarderBackoff(base_s=10, max_s=80, max_in_flight=1)
    for now in (0, 100, 200):  # three failures, each after the hold ran out: 10, 20, 40
        b.start("p")
        b.finish("p", now, served=False)
    b.start("p")
    b.finish("p", 300, served=True)  # 40 -> 20
    b.start("p")
    b.finish("p", 400, served=False)  # 20 -> 40
    assert b.held_off("p", 439) and not b.held_off("p", 440)
    for now in (500, 501, 502):  # 40 -> 20 -> 10 -> forgotten
        b.start("p")
        b.finish("p", now, served=True)
    b.start("p")
    b.finish("p", 600, served=False)
    assert b.held_off("p", 609) and not b.held_off("p", 610), "a forgiven forwarder starts again from the base"


def test_at_most_max_in_flight_fetches_per_forwarder():
    b = ForwarderBackoff(base_s=10, max_s=40, max_in_flight=2)
    b.start("p")
    b.start("p")
    assert b.refusal("p", 0) == "announce_forwarder_busy" and b.refusal("q", 0) is None
    b.finish("p", 0, served=True)
    assert b.refusal("p", 0) is None


def test_only_expired_holds_are_forgotten_when_the_table_is_full():
    b = ForwarderBackoff(base_s=10, max_s=40, max_in_flight=1)
    for i in range(MAX_TRACKED):
        b.start(i)
        b.finish(i, 0, served=False)  # held off until 10
    b.start("late")
    b.finish("late", 100, served=False)  # the others' holds have run out: forgotten, this one kept
    assert b.held_off("late", 105) and not b.held_off(0, 5 + 100)
    b.start(0)
    b.finish(0, 200, served=False)
    assert b.held_off(0, 209) and not b.held_off(0, 210), "forgotten: its next failure starts from the base again"


@pytest.mark.parametrize(("base", "cap", "flight"), [(0, 10, 1), (20, 10, 1), (10, 20, 0)])
def test_bad_settings_are_refused(base, cap, flight):
    with pytest.raises(ValueError, match="base_s"):
        ForwarderBackoff(base, cap, flight)

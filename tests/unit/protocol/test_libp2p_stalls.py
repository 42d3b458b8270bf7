"""The bound on what a forwarder that stalls announce fetches can hold (``protocol.transport.libp2p.stalls``)."""

from __future__ import annotations

import pytest

from protocol.transport.libp2p.stalls import MAX_TRACKED, ForwarderBackoff


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


def test_a_served_record_takes_a_quarter_of_the_base_off_and_is_forgotten_at_zero():
    b = ForwarderBackoff(base_s=8, max_s=80, max_in_flight=1)
    for now in (0, 100, 200):  # three failures, each after the hold ran out: 8, 16, 32
        b.start("p")
        b.finish("p", now, served=False)
    for now in (300, 301, 302, 303):  # 32 -> 24
        b.start("p")
        b.finish("p", now, served=True)
    b.start("p")
    b.finish("p", 400, served=False)  # 24 -> 48
    assert b.held_off("p", 447) and not b.held_off("p", 448)
    for now in range(500, 524):  # 24 records served: 48 -> 0, forgotten
        b.start("p")
        b.finish("p", now, served=True)
    b.start("p")
    b.finish("p", 600, served=False)
    assert b.held_off("p", 607) and not b.held_off("p", 608), "a forgiven forwarder starts again from the base"


def test_serving_never_shortens_a_running_hold_so_failing_and_serving_in_turn_climbs_to_the_cap():
    """A staller keeps two fetches running, lets one time out and answers the other: the hold-off stands, and its
    backoff still grows (a served record is worth a quarter of the base, a failure doubles)."""
    b = ForwarderBackoff(base_s=10, max_s=60, max_in_flight=2)
    now, busy = 0.0, 0.0
    while now < 1000:
        if b.refusal("p", now) is None:
            b.start("p")
            b.start("p")
            now += 8  # both fetches run 8 s (0.8 x the request timeout), holding 2 slots
            busy += 2 * 8
            b.finish("p", now, served=False)
            b.finish("p", now, served=True)
            assert b.held_off("p", now), "the record served did not lift the hold-off the failure set"
        now += 1
    assert busy / now < 0.4, f"{busy / now:.2f} slots held on average"


def test_a_cancelled_fetch_frees_its_place_and_says_nothing_about_the_forwarder():
    b = ForwarderBackoff(base_s=10, max_s=40, max_in_flight=1)
    b.start("p")
    assert b.refusal("p", 0) == "announce_forwarder_busy"
    b.finish("p", 0, served=None)
    assert b.refusal("p", 0) is None and not b.held_off("p", 0)


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

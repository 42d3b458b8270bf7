"""B1's per-run summary: per-reader delivery times and the mean times of one poll and one publish, from the workers'
results."""

import math

import pytest

from benchmarks.systems import gossip_summary as b1_summary
from benchmarks.systems import launch


def _worker(published, seen, fetch_s, polls):
    return {
        "published": published,
        "seen": seen,
        "sizes": [1000] * len(published),
        "timing": {"encode": 0.1, "check": 0.1, "publish": 1.0, "fetch": fetch_s, "guard": 0.0, "polls": polls},
        "rss_bytes": 100 * 2**20,
        "pss_bytes": 60 * 2**20,
    }


def test_poll_time_and_reader_delays():
    a = _worker({"ra": 10.0}, {"rb": 13.0}, fetch_s=3.0, polls=4)
    b = _worker({"rb": 11.0}, {"ra": 12.0}, fetch_s=1.0, polls=4)
    s = b1_summary.summarize("hivemind", 2, [a, b], transport="hivemind", guard_in_total=False, require_all_peers=True)
    assert s["poll_mean_s"] == pytest.approx(0.5)  # 4 s of reads over 8 polls
    assert s["publish_mean_s"] == pytest.approx(1.0)  # 2 s of stores over 2 records
    assert s["pair_p50_s"] == pytest.approx(2.0) and s["pair_p95_s"] == pytest.approx(2.0)
    assert s["incomplete"] == 0 and s["rss_mb_median"] == pytest.approx(100)
    assert s["pairs_delivered"] == pytest.approx(1.0)
    assert s["pss_mb_median"] == pytest.approx(60)
    assert "| 100 | 100 | 60 | 0.50 | 1.00 | 100.0% |" in b1_summary.render("hivemind", "m", "d", [s])


def test_pairs_delivered_counts_what_each_reader_got_of_an_incomplete_record():
    a = _worker({"ra": 10.0}, {}, fetch_s=1.0, polls=1)
    b = _worker({"rb": 11.0}, {"ra": 12.0}, fetch_s=1.0, polls=1)
    c = _worker({}, {"rb": 12.5}, fetch_s=1.0, polls=1)
    s = b1_summary.summarize(
        "hivemind", 3, [a, b, c], transport="hivemind", guard_in_total=False, require_all_peers=True
    )
    # ra reached b but not c, rb reached c but not a: both records incomplete, 2 of 4 pairs delivered
    assert s["incomplete"] == 2 and s["pairs_delivered"] == pytest.approx(0.5)


def test_a_peer_that_died_counts_as_a_reader_that_got_nothing():
    a = _worker({"ra": 10.0}, {"rb": 12.0}, fetch_s=1.0, polls=1)
    b = _worker({"rb": 11.0}, {"ra": 12.0}, fetch_s=1.0, polls=1)
    s = b1_summary.summarize("hivemind", 3, [a, b], transport="hivemind", guard_in_total=False, require_all_peers=True)
    # the third peer left no result file: 2 of the 4 pairs (2 records x 2 other readers) arrived
    assert s["incomplete"] == 2 and s["pairs_delivered"] == pytest.approx(0.5)


def test_no_polls_counted_is_not_a_number():
    a = _worker({"ra": 10.0}, {}, fetch_s=0.0, polls=0)
    s = b1_summary.summarize("raw", 1, [a], transport="hivemind", guard_in_total=False, require_all_peers=False)
    assert math.isnan(s["poll_mean_s"])


def test_pss_of_a_process_tree_is_positive_and_below_its_rss():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import time

        time.sleep(0.5)
        rss, pss = launch.rss_tree_bytes(child.pid), launch.pss_tree_bytes(child.pid)
        assert 0 < pss < rss  # the child shares the interpreter's library pages with this process
    finally:
        child.kill()
        child.wait()


def test_forked_peers_carry_a_share_of_the_zygotes_pss():
    a = _worker({"ra": 10.0}, {"rb": 13.0}, fetch_s=1.0, polls=1)
    b = _worker({"rb": 11.0}, {"ra": 12.0}, fetch_s=1.0, polls=1)
    for r in (a, b):
        r["zygote_pss_bytes"] = 40 * 2**20  # shared by the two peers
    s = b1_summary.summarize("hivemind", 2, [a, b], transport="hivemind", guard_in_total=False, require_all_peers=True)
    assert s["pss_mb_median"] == pytest.approx(80)  # 60 of its own + half of the zygote's 40

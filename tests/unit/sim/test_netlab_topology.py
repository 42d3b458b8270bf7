"""The lab's one-line topology descriptions (``sim.netlab.topology``) and the dial-back probe's address parsing."""

from __future__ import annotations

import pytest

from sim.netlab.ns import NetlabError
from sim.netlab.topology import LinkSpec, parse, parse_link


def test_parse_full_description():
    topo = parse("public=2 homes=3,3,2 nat=symmetric link=25ms/5ms/1% wan=10ms/0ms/0%/2mbit")
    assert topo.public == 2 and topo.homes == (3, 3, 2) and topo.nat == "symmetric"
    assert topo.link == LinkSpec(25.0, 5.0, 1.0, 0)
    assert topo.wan == LinkSpec(10.0, 0.0, 0.0, 2000)
    assert topo.hosts()[:3] == ["pub0", "pub1", "home0-0"] and topo.hosts()[-1] == "home2-1"
    assert len(topo.hosts()) == 10
    assert parse(str(topo)) == topo  # the description round-trips


def test_defaults_and_short_links():
    topo = parse("public=3")
    assert topo.homes == () and not topo.link.delayed and topo.nat == "cone"
    assert parse_link("100ms") == LinkSpec(100.0)
    assert parse_link("0ms/0ms/5%").loss_pct == 5.0 and not parse_link("0ms/0ms/5%").delayed


@pytest.mark.parametrize(
    "text, message",
    [
        ("public", "key=value"),
        ("routers=3", "unknown topology key"),
        ("public=1 nat=full", "cone or symmetric"),
        ("public=1 link=fast", "DELAYms"),
        ("public=1 link=1ms/1ms/150%", "bad loss"),
        ("public=0", "at least one host"),
    ],
)
def test_bad_descriptions_say_what_is_expected(text, message):
    with pytest.raises(NetlabError, match=message):
        parse(text)


def test_preconditions_fail_with_one_line_naming_each_problem(monkeypatch):
    from sim.netlab import ns

    monkeypatch.setattr(ns.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(ns.shutil, "which", lambda tool: None if tool == "nft" else f"/usr/sbin/{tool}")
    with pytest.raises(NetlabError) as e:
        ns.check_preconditions()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("network lab unavailable: ")
    assert "must run as root" in msg and "apt-get install -y nftables" in msg and "iproute2" not in msg

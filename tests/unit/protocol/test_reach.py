"""The dial-back probe's pure parts: which address the answerer dials, and how answers become a verdict."""

from __future__ import annotations

import asyncio

from protocol.transport.hivemind import reach


def test_the_answerer_dials_only_the_connections_own_address():
    assert reach._ip_of("/ip4/10.200.0.101/tcp/40123") == "10.200.0.101"
    assert reach._ip_of("/ip6/::1/tcp/4001") == "::1"
    # a relayed connection has no address of the asker's own: nothing is dialled
    relayed = "/ip4/10.200.0.10/tcp/31337/p2p/12D3KooWDrm8uku42Ce1eAfGukZ7DMWhUBxj1GYvmkeoLFqVKfbY/p2p-circuit"
    assert reach._ip_of(relayed) is None
    assert reach._ip_of("garbage") is None


def test_probe_verdicts(monkeypatch):
    answers = {
        "silent": None,
        "no_a": reach.Answer(open=False, network="10.1.0.0/16"),
        "no_b": reach.Answer(open=False, network="10.2.0.0/16"),
        "yes": reach.Answer(open=True, network="10.3.0.0/16"),
    }

    async def fake_ask(p2p, peer, ports):
        return answers[peer]

    monkeypatch.setattr(reach, "ask", fake_ask)

    def run(peers):
        return asyncio.run(reach.probe(None, peers, [1]))

    assert run(["silent", "yes"]).verdict == reach.REACHABLE
    assert run(["silent", "no_a", "no_b"]).verdict == reach.UNREACHABLE
    assert run(["no_a", "yes"]).verdict == reach.REACHABLE  # one yes outweighs a no
    assert run(["silent"]).verdict == reach.UNKNOWN
    assert run([]).verdict == reach.UNKNOWN


def test_only_noes_from_two_networks_demote():
    """SPEC 9: a serving node stops serving on "none open" from peers in two distinct networks (IPv4 /16, IPv6 /32)
    and no "open"; one peer, or any number of peers in one network, is not enough."""
    no, yes = (lambda net: reach.Answer(False, net)), (lambda net: reach.Answer(True, net))
    one_liar = reach.Probe((no("203.0.0.0/16"),))
    sybils = reach.Probe((no("203.0.0.0/16"), no("203.0.0.0/16"), no("203.0.0.0/16")))
    unknown_network = reach.Probe((no("203.0.0.0/16"), no(None)))
    two_networks = reach.Probe((no("203.0.0.0/16"), no("198.51.0.0/16")))
    outvoted = reach.Probe((no("203.0.0.0/16"), no("198.51.0.0/16"), yes("192.0.0.0/16")))
    for found in (one_liar, sybils, unknown_network):
        assert found.verdict == reach.UNREACHABLE and not found.demotes, found
    assert two_networks.demotes
    assert outvoted.verdict == reach.REACHABLE and not outvoted.demotes


def test_networks_are_ipv4_16_and_ipv6_32():
    assert reach.network_of("203.0.113.7") == reach.network_of("203.0.9.9") == "203.0.0.0/16"
    assert reach.network_of("203.1.113.7") != reach.network_of("203.0.113.7")
    assert reach.network_of("2001:db8:1::1") == reach.network_of("2001:db8:ffff::2") == "2001:db8::/32"
    assert reach.network_of("::ffff:203.0.113.7") == "203.0.0.0/16"  # IPv4-mapped: as IPv4
    # loopback is no exception: one host's peers at 127.1.0.1 and 127.2.0.1 are two networks (tests use it)
    assert reach.network_of("127.1.0.1") != reach.network_of("127.2.0.1")
    assert reach.network_of("127.0.0.1") == reach.network_of("127.0.0.2")
    assert reach.network_of(None) is None and reach.network_of("nonsense") is None


def test_a_probe_asks_one_peer_per_network_in_turn():
    crowd = [(f"sybil{i}", f"203.0.{i}.1") for i in range(20)]
    honest = [("h1", "198.51.100.1"), ("h2", "192.0.2.1")]
    picked = reach.spread([*crowd, *honest, ("server", None)], n=reach.MAX_ASKED)
    assert len(picked) == reach.MAX_ASKED
    assert {"h1", "h2", "server"} <= set(picked)  # 20 peers of one network do not crowd the others out
    assert reach.spread([("a", "10.0.0.1"), ("a", "10.0.0.1")]) == ["a"]


def test_dial_sees_an_open_and_a_closed_port():
    async def main():
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        opened = await reach._dial("127.0.0.1", port)
        server.close()
        await server.wait_closed()
        closed = await reach._dial("127.0.0.1", port)
        return opened, closed

    assert asyncio.run(main()) == (True, False)

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
    answers = {"a": None, "b": False, "c": True, "d": False}

    async def fake_ask(p2p, peer, ports):
        return answers[peer]

    monkeypatch.setattr(reach, "ask", fake_ask)
    run = asyncio.run
    assert run(reach.probe(None, ["a", "c"], [1])) == reach.REACHABLE
    assert run(reach.probe(None, ["a", "b", "d", "c"], [1])) == reach.UNREACHABLE  # two noes are enough
    assert run(reach.probe(None, ["b", "c"], [1])) == reach.REACHABLE  # one yes outweighs a no
    assert run(reach.probe(None, ["a"], [1])) == reach.UNKNOWN
    assert run(reach.probe(None, [], [1])) == reach.UNKNOWN


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

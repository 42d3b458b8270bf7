"""The dial-back probe's pure parts: which address the answerer dials, and how answers become a verdict."""

from __future__ import annotations

import asyncio
import socket

import msgpack

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


class _Info:
    """What p2pd tells a handler about the asker's stream: its peer id and the address its connection comes from."""

    def __init__(self, peer: str = "asker", addr: str = "/ip4/127.0.0.1/tcp/40000"):
        self.peer_id, self.addr = peer, addr


class _Writer:
    def __init__(self) -> None:
        self.data, self.closed = b"", False

    def write(self, b: bytes) -> None:
        self.data += b

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


async def _answer(service: reach.DialBackService, *chunks: bytes, peer: str = "asker") -> object:
    """Run one probe through ``service`` with the request arriving in ``chunks`` (one event-loop turn apart)."""
    reader, writer = asyncio.StreamReader(), _Writer()
    reader.feed_data(chunks[0])
    task = asyncio.create_task(service._handle(_Info(peer), reader, writer))
    for chunk in chunks[1:]:
        await asyncio.sleep(0.01)
        reader.feed_data(chunk)
    reader.feed_eof()
    await task
    return msgpack.unpackb(writer.data) if writer.data else None


async def _counting_server() -> tuple[asyncio.Server, int, list[int]]:
    accepted: list[int] = []

    def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(1)
        w.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], accepted


def test_a_repeated_port_is_dialled_once_and_listed_once():
    """SPEC 9: the answerer dials each distinct port once; a request repeating one port four times opens one
    connection and is answered with the port once."""

    async def main():
        server, port, accepted = await _counting_server()
        async with server:
            answer = await _answer(reach.DialBackService(), msgpack.packb([port, port, port, port]))
            await asyncio.sleep(0.05)  # let the server's accept callbacks run
        return answer, port, len(accepted)

    answer, port, n = asyncio.run(main())
    assert answer == {"ip": "127.0.0.1", "open": [port]}
    assert n == 1


def test_only_the_first_four_entries_are_read_and_a_request_in_pieces_is_answered():
    """SPEC 9: entries after the 4th are ignored (no error); the request is one msgpack array, read however the
    stream splits it (the asker's write may arrive in several pieces)."""

    async def main():
        server, port, _ = await _counting_server()
        async with server:
            closed = []
            for _ in range(4):
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                closed.append(s.getsockname()[1])
                s.close()
            service = reach.DialBackService()
            over = await _answer(service, msgpack.packb([*closed, port]), peer="a")
            request = msgpack.packb([port, "junk", -1, 70000])
            pieces = await _answer(service, request[:1], request[1:2], request[2:], peer="b")
            too_long = await _answer(service, msgpack.packb(list(range(1, 200))), peer="c")
        return over, pieces, too_long, port

    over, pieces, too_long, port = asyncio.run(main())
    assert over == {"ip": "127.0.0.1", "open": []}  # the open port was the 5th entry: not dialled
    assert pieces == {"ip": "127.0.0.1", "open": [port]}  # non-port entries are skipped
    assert too_long is None  # a request over 256 bytes gets no answer


def test_four_at_a_time_bounds_concurrency_not_rate(monkeypatch):
    """SPEC 9: a probe that finds 4 probes being dialled is refused; once they finish the next asker is answered at
    once (no rate limit beyond one probe per asking peer per 20 s, which a refusal does not start)."""

    async def main():
        release = asyncio.Event()

        async def slow_dial(ip: str, port: int) -> bool:
            await release.wait()
            return False

        monkeypatch.setattr(reach, "_dial", slow_dial)
        service = reach.DialBackService()
        busy = [asyncio.create_task(_answer(service, msgpack.packb([1]), peer=f"p{i}")) for i in range(4)]
        await asyncio.sleep(0.05)
        fifth = await _answer(service, msgpack.packb([1]), peer="p4")
        release.set()
        answers = await asyncio.gather(*busy)
        again = await _answer(service, msgpack.packb([1]), peer="p4")  # refused before: not in its cooldown
        repeat = await _answer(service, msgpack.packb([1]), peer="p0")  # answered a moment ago: cooldown
        return fifth, answers, again, repeat

    fifth, answers, again, repeat = asyncio.run(main())
    assert fifth == {"refused": True} and repeat == {"refused": True}
    assert answers == [{"ip": "127.0.0.1", "open": []}] * 4
    assert again == {"ip": "127.0.0.1", "open": []}

"""A delaying link between two namespaces: two TAP devices, one in each, and this process copying Ethernet frames
between them after a fixed delay plus uniform jitter (first in, first out, like a real link's queue).

This kernel has no ``netem``; a userspace wire gives latency and jitter to any traffic (TCP, ARP) without it.
Loss is added by the lab with nftables on the interfaces, bandwidth with ``tc tbf``. The TAP devices live as long
as this process holds them: killing it takes the link down for good.

Usage (by the lab, as root)::

    python -m sim.netlab.wire NS_A IF_A NS_B IF_B --delay-ms 25 --jitter-ms 5 [--mtu 9000]

It prints ``ready`` once both devices exist, then runs until SIGTERM. Knows nothing about addresses or swarms.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


def open_tap(ns: str, name: str) -> int:
    """Create TAP device ``name`` inside namespace ``ns``; its fd (the device lives as long as the fd)."""
    from sim.netlab.ns import enter

    enter(ns)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def serve(fd_a: int, fd_b: int, delay_s: float, jitter_s: float, seed: int = 0) -> None:
    """Copy frames a->b and b->a, each held ``delay_s + U(0, jitter_s)`` but never overtaking an earlier frame."""
    rng = random.Random(seed)
    # destination fd -> (due, frame)
    queues: dict[int, collections.deque[tuple[float, bytes]]] = {fd_a: collections.deque(), fd_b: collections.deque()}
    last_due = {fd_a: 0.0, fd_b: 0.0}
    other = {fd_a: fd_b, fd_b: fd_a}
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    while not stop:
        now = time.monotonic()
        due = [q[0][0] for q in queues.values() if q]
        timeout = max(0.0, min(due) - now) if due else 0.5
        try:
            readable, _, _ = select.select([fd_a, fd_b], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in readable:
            for _ in range(64):  # drain what is waiting, bounded so the other direction is served too
                try:
                    frame = os.read(fd, 65536)
                except (BlockingIOError, OSError):
                    break
                dst = other[fd]
                t = max(now + delay_s + (rng.random() * jitter_s if jitter_s else 0.0), last_due[dst])
                last_due[dst] = t
                queues[dst].append((t, frame))
        for dst, q in queues.items():
            while q and q[0][0] <= now:
                _, frame = q.popleft()
                with contextlib.suppress(OSError):  # the device is down (the lab cut the link): the frame is lost
                    os.write(dst, frame)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ns_a")
    ap.add_argument("if_a")
    ap.add_argument("ns_b")
    ap.add_argument("if_b")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay of the link")
    ap.add_argument("--jitter-ms", type=float, default=0.0, help="extra uniform delay in [0, jitter]")
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args(argv)
    fd_a = open_tap(opts.ns_a, opts.if_a)
    fd_b = open_tap(opts.ns_b, opts.if_b)
    print("ready", flush=True)
    serve(fd_a, fd_b, opts.delay_ms / 1000.0, opts.jitter_ms / 1000.0, opts.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())

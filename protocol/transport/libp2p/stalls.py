"""Which forwarders an announced record may be fetched from now: a bound on what a stalling forwarder can hold.

Each announce fetch runs inside one of py-libp2p's few validator slots (SPEC 7.3). A forwarder that announces
records and then neither serves nor refuses them would hold one slot per announcement for the whole fetch timeout,
so a hostile peer could keep every slot busy with a modest message rate. A timeout is not proof of hostility (an
honest forwarder may be slow under load), so it costs no score; instead:

* at most ``max_in_flight`` fetches from one forwarder run at a time;
* a forwarder whose fetch failed is not asked again for a backoff that starts at ``base_s`` and doubles with every
  further failure, up to ``max_s``. Each record it serves takes a quarter of ``base_s`` off its backoff but never
  shortens a hold-off already running, so a forwarder that fails and serves in turn still climbs to ``max_s``: to
  keep its backoff from growing it must serve 4 records the receiver lacks for every fetch it stalls.
* a fetch that ends without a verdict on the forwarder (cancelled from outside) only frees its place.

Announcements a forwarder may not be asked about now are dropped unjudged: the same message from another
forwarder is still validated, and anti-entropy sync heals the rest. So a forwarder that serves nothing holds at
most ``max_in_flight`` slots for one fetch timeout per ``max_s``, however fast it announces. The bound is per
forwarder: k stalling neighbours hold up to k times as much.

Time is passed in (the caller's clock); imports neither libp2p nor trio.
"""

from __future__ import annotations

from collections.abc import Hashable

#: Entries kept before the ones whose backoff has run out are forgotten.
MAX_TRACKED = 256
#: What one served record takes off a forwarder's backoff, in units of the base backoff.
SERVE_CREDIT = 0.25


class ForwarderBackoff:
    def __init__(self, base_s: float, max_s: float, max_in_flight: int) -> None:
        if not 0 < base_s <= max_s or max_in_flight < 1:
            raise ValueError("need 0 < base_s <= max_s and max_in_flight >= 1")
        self.base_s = base_s
        self.max_s = max_s
        self.max_in_flight = max_in_flight
        self._held_off: dict[Hashable, tuple[float, float]] = {}  # peer -> (held off until, current backoff)
        self._in_flight: dict[Hashable, int] = {}

    def held_off(self, peer: Hashable, now: float) -> bool:
        """Whether ``peer``'s last failure still keeps it from being asked at ``now``."""
        return now < self._held_off.get(peer, (0.0, 0.0))[0]

    def refusal(self, peer: Hashable, now: float) -> str | None:
        """None if a fetch from ``peer`` may start at ``now``; otherwise the drop reason."""
        if self.held_off(peer, now):
            return "announce_forwarder_held_off"
        if self._in_flight.get(peer, 0) >= self.max_in_flight:
            return "announce_forwarder_busy"
        return None

    def start(self, peer: Hashable) -> None:
        self._in_flight[peer] = self._in_flight.get(peer, 0) + 1

    def finish(self, peer: Hashable, now: float, *, served: bool | None) -> None:
        """A fetch from ``peer`` that :meth:`start` counted ended: it ``served`` the record, failed to in time
        (False), or was cancelled by something else (None: no verdict on the forwarder)."""
        left = self._in_flight.get(peer, 0) - 1
        if left > 0:
            self._in_flight[peer] = left
        else:
            self._in_flight.pop(peer, None)
        if served is None:
            return
        held_until, backoff = self._held_off.get(peer, (0.0, 0.0))
        if served:
            backoff = max(backoff - self.base_s * SERVE_CREDIT, 0.0)
            if backoff == 0.0 and held_until <= now:
                self._held_off.pop(peer, None)
                return
        else:
            backoff = min(max(backoff * 2, self.base_s), self.max_s)
            held_until = max(held_until, now + backoff)
        self._held_off[peer] = (held_until, backoff)
        if len(self._held_off) > MAX_TRACKED:
            self._held_off = {p: h for p, h in self._held_off.items() if h[0] > now}

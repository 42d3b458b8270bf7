"""A lab network described in one short line, e.g. ``public=2 homes=3,3,2 nat=symmetric link=25ms/5ms/1%``.

* ``public=N``      -- N hosts on the public segment (``pub0`` ..), reachable by everyone;
* ``homes=A,B,..``  -- one home network per number, behind its own NAT router, with that many hosts
  (``home0-0``, ``home0-1``, .. behind router ``r0``);
* ``nat=cone|symmetric`` -- how routers translate: ``cone`` is nftables' plain ``masquerade`` (the source port is
  kept where it can be, unsolicited inbound traffic dropped: a port-restricted cone), ``symmetric`` adds
  ``fully-random`` (a new external port for every connection). Neither forwards inbound connections; a full-cone NAT
  is not built (nftables has no endpoint-independent inbound mapping without static rules);
* ``link=DELAY/JITTER/LOSS[/RATE]`` -- every host's own uplink (to the public segment, or to its home router):
  one-way delay and jitter (``ms``), loss per direction (``%``), optional egress rate (``kbit`` or ``mbit``).
  Two hosts' round trip is twice the sum of their one-way delays (two public hosts at ``25ms``: 100 ms);
* ``wan=...``       -- the same for each router's uplink.

Knows nothing about how the lab is built (``lab``) or what runs in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from sim.netlab.ns import NetlabError


@dataclass(frozen=True)
class LinkSpec:
    """Conditions of one uplink: one-way delay and jitter, loss per direction, egress rate (0: unlimited)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    rate_kbit: int = 0

    @property
    def delayed(self) -> bool:
        return self.delay_ms > 0 or self.jitter_ms > 0

    def __str__(self) -> str:
        rate = f"/{self.rate_kbit}kbit" if self.rate_kbit else ""
        return f"{self.delay_ms:g}ms/{self.jitter_ms:g}ms/{self.loss_pct:g}%{rate}"


@dataclass(frozen=True)
class Topology:
    """Public hosts, home networks behind NAT routers, and the conditions of every uplink."""

    public: int = 1
    homes: tuple[int, ...] = ()
    nat: Literal["cone", "symmetric"] = "cone"
    link: LinkSpec = field(default_factory=LinkSpec)
    wan: LinkSpec = field(default_factory=LinkSpec)

    def hosts(self) -> list[str]:
        """Every host's name: ``pub0``.. then ``home<r>-<j>``."""
        return [f"pub{i}" for i in range(self.public)] + [
            f"home{r}-{j}" for r, n in enumerate(self.homes) for j in range(n)
        ]

    def __str__(self) -> str:
        parts = [f"public={self.public}"]
        if self.homes:
            parts += [f"homes={','.join(map(str, self.homes))}", f"nat={self.nat}"]
        if self.link != LinkSpec():
            parts.append(f"link={self.link}")
        if self.wan != LinkSpec():
            parts.append(f"wan={self.wan}")
        return " ".join(parts)


_LINK = re.compile(
    r"(?P<d>[\d.]+)ms(?:/(?P<j>[\d.]+)ms)?(?:/(?P<l>[\d.]+)%)?(?:/(?P<r>\d+)(?P<u>kbit|mbit))?", re.IGNORECASE
)


def parse_link(text: str) -> LinkSpec:
    m = _LINK.fullmatch(text.strip())
    if not m:
        raise NetlabError(f"bad link {text!r}: expected DELAYms[/JITTERms][/LOSS%][/RATEkbit|mbit], e.g. 25ms/5ms/1%")
    rate = int(m["r"] or 0) * (1000 if (m["u"] or "").lower() == "mbit" else 1)
    loss = float(m["l"] or 0)
    if not 0 <= loss <= 100:
        raise NetlabError(f"bad loss {loss}% in {text!r}")
    return LinkSpec(float(m["d"]), float(m["j"] or 0), loss, rate)


def parse(text: str) -> Topology:
    """The topology a short description names (module docstring); unknown words raise with the expected form."""
    kw: dict = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if not sep:
            raise NetlabError(f"bad topology word {word!r}: expected key=value")
        if key == "public":
            kw["public"] = int(value)
        elif key == "homes":
            kw["homes"] = tuple(int(v) for v in value.split(",") if v)
        elif key == "nat":
            if value not in ("cone", "symmetric"):
                raise NetlabError(f"bad nat {value!r}: cone or symmetric")
            kw["nat"] = value
        elif key in ("link", "wan"):
            kw[key] = parse_link(value)
        else:
            raise NetlabError(f"unknown topology key {key!r} (public, homes, nat, link, wan)")
    topo = Topology(**kw)
    if topo.public + sum(topo.homes) == 0:
        raise NetlabError("a topology needs at least one host")
    if len(topo.homes) > 200 or topo.public > 200 or any(n > 200 for n in topo.homes):
        raise NetlabError("at most 200 routers, public hosts, or hosts per home")
    return topo

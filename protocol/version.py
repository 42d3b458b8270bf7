"""The protocol version (major.minor), the compatibility rule, and the one-line report of an incompatible peer.

Rule (``protocol/SPEC.md`` 15): two nodes interoperate exactly when their major versions are equal. A minor
version only adds what an older reader of the same major may ignore (a new key in a record's or index entry's
body, a new record kind, a new sync op that an older server refuses); anything else bumps the major. Everything a
peer signs carries the version: records (``schema_version`` = the major, ``minor``), index entries and libp2p
peer advertisements (``version`` = ``"MAJOR.MINOR"``). A node that meets a peer of another major drops what that
peer sends, counts it by reason (``incompatible_version``) and says so once per remote version, in one line that
names both versions.

The version a node advertises can be overridden with the environment variable ``RL_SWARM_PROTOCOL_VERSION``
(``MAJOR.MINOR``), read once per process (:func:`override_local_version` changes it in-process). It exists for
tests that run two real processes of different versions; a real node never sets it.

Knows nothing about records, transports or peers beyond the version they claim.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading

logger = logging.getLogger(__name__)

#: This code's protocol version. 1.0 was the first signed wire format (``schema_version`` 1); 1.1 added signed
#: peer advertisements (the ``peers`` op) on the libp2p sync protocol; 2.0 put the version into records (``minor``)
#: and index entries (``version``), which 1.x readers refuse; 2.1 added the optional work stamp of index entries
#: (``work``, SPEC 7.4), which 2.0 readers ignore; 2.2 is split v2 (SPEC 13: family-independent value-level keys
#: for arithmetic, train/dev/test sides), which changes no bytes on the wire but which peers' groups a node refuses.
PROTOCOL_VERSION: tuple[int, int] = (2, 2)
#: Test-only override of the advertised version (``MAJOR.MINOR``).
ENV_OVERRIDE = "RL_SWARM_PROTOCOL_VERSION"
#: Rejection reason of records and advertisements of another major version.
INCOMPATIBLE = "incompatible_version"

#: Distinct remote versions reported at most (a hostile peer could otherwise claim a new one per message).
MAX_REPORTED = 16

#: 1 to 4 ASCII digits each (``\d`` would also take other scripts' digits), nothing around them.
_VERSION_RE = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})")
_reported: set[tuple[int, int]] = set()
_reported_lock = threading.Lock()


@functools.lru_cache(maxsize=64)  # every index entry a reader decodes names one of a few versions
def parse_version(text: str) -> tuple[int, int]:
    """``"1.2"`` -> ``(1, 2)``; ``ValueError`` for anything else (SPEC 15: 1-4 ASCII digits, a dot, 1-4 ASCII digits,
    leading zeros allowed, no spaces)."""
    m = _VERSION_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"protocol version {text!r} is not MAJOR.MINOR (e.g. 1.1)")
    return int(m.group(1)), int(m.group(2))


def local_version() -> tuple[int, int]:
    """The version this node speaks: :data:`PROTOCOL_VERSION`, unless the test override is set (read from the
    environment once per process, or set with :func:`override_local_version`)."""
    global _local
    if _local is None:
        override = os.environ.get(ENV_OVERRIDE)
        _local = parse_version(override.strip()) if override else PROTOCOL_VERSION
    return _local


def override_local_version(text: str | None) -> None:
    """Speak ``text`` (``MAJOR.MINOR``) from now on in this process; None reads the environment again (tests)."""
    global _local
    _local = parse_version(text) if text is not None else None


#: The version this process speaks, once known (read for every record and index entry a node decodes).
_local: tuple[int, int] | None = None


def format_version(version: tuple[int, int]) -> str:
    """``(1, 2)`` -> ``"1.2"``; a negative minor (not stated by the peer, e.g. a 1.x record) -> ``"1.x"``."""
    return f"{version[0]}.{version[1] if version[1] >= 0 else 'x'}"


def compatible(theirs: tuple[int, int], ours: tuple[int, int] | None = None) -> bool:
    """Same major version (minor versions of one major interoperate)."""
    return theirs[0] == (ours if ours is not None else local_version())[0]


def report_incompatible(theirs: tuple[int, int], who: str = "a peer", ours: tuple[int, int] | None = None) -> bool:
    """Log, once per remote version in this process, one warning line naming both versions.

    Returns True the first time (the line was written). Callers count every occurrence themselves.
    """
    with _reported_lock:
        if theirs in _reported or len(_reported) >= MAX_REPORTED:
            return False
        _reported.add(theirs)
    ours = ours if ours is not None else local_version()
    logger.warning(
        "incompatible protocol version: %s speaks %s, this node speaks %s (major versions differ; its records and "
        "advertisements are ignored; upgrade whichever node is older)",
        who,
        format_version(theirs),
        format_version(ours),
    )
    return True

"""The hivemind transport builds hivemind's ``PeerID`` text lazily (``protocol/transport/hivemind/transport.py``): the
same values and behaviour as hivemind's own eager encoding, without the cost for ids that are never printed."""

from __future__ import annotations

import base58
import pytest

pytest.importorskip("hivemind")


def test_peer_ids_give_the_same_text_hashes_and_comparisons_as_hiveminds_own():
    from hivemind.p2p import PeerID

    import protocol.transport.hivemind.transport  # noqa: F401  (applies the change)

    raw = [bytes.fromhex("1220") + bytes([i]) * 32 for i in range(3)]
    ids = [PeerID(b) for b in raw]
    assert "_b58_str" not in vars(ids[0]), "not encoded until asked"
    for b, p in zip(raw, ids, strict=True):
        text = base58.b58encode(b).decode()
        assert p.to_base58() == str(p) == p.pretty() == text and vars(p)["_b58_str"] == text
        assert p == PeerID.from_base58(text) and p == text and p == b and hash(p) == hash(b)
    assert sorted(ids, reverse=True)[0] == max(ids, key=lambda p: p.to_base58())
    assert repr(ids[1]) == f"<libp2p.peer.id.ID ({base58.b58encode(raw[1]).decode()})>"


def test_applying_it_twice_changes_nothing():
    from hivemind.p2p import PeerID

    from protocol.transport.hivemind.loop import lazy_peer_id_text

    before = (PeerID.__init__, PeerID.__dict__["_b58_str"])
    lazy_peer_id_text()
    assert (PeerID.__init__, PeerID.__dict__["_b58_str"]) == before

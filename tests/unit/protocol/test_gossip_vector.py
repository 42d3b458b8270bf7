"""The byte-level trace of SPEC 7.6: the section-8 record as one GossipSub message on the swarm's topic, signed as both
py-libp2p and go-libp2p (p2pd) sign and check it. Pure: protobuf fields written by hand, Ed25519 from ``cryptography``
(``tests/libp2p_isolated/contract_lp2p.py`` checks the same bytes against py-libp2p's own message and validator)."""

import hashlib
import re
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.transport.gossip import (
    TAG_ANNOUNCE,
    TAG_RECORD,
    ad_signer_ok,
    answer,
    gossip_topic,
    make_ad,
    parse_frame,
    parse_have,
    parse_request,
    record_frame,
    varint,
)
from protocol.transport.libp2p.store import RecordStore
from protocol.transport.netkey import NetworkKey

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from tests.unit.protocol.test_records import ALICE, vector_record  # noqa: E402

SPEC = ROOT / "protocol" / "SPEC.md"
SEQNO = (1_700_000_000_000_000_000).to_bytes(8, "big")


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return bytes([number << 3 | 2]) + varint(len(value)) + value


def crossing() -> dict[str, bytes]:
    """Every stage of the vector record crossing the topic (SPEC 7.6)."""
    record = vector_record()
    key = NetworkKey.of(ALICE)
    data = record_frame(record, digest=hashlib.sha256(record).digest(), window=113_333_333)
    topic = gossip_topic("rl-swarm", "spec").encode()
    unsigned = _field(1, key.peer_id_bytes) + _field(2, data) + _field(3, SEQNO) + _field(4, topic)
    signing_input = b"libp2p-pubsub:" + unsigned
    sig = Ed25519PrivateKey.from_private_bytes(key.seed).sign(signing_input)
    return {
        "record": record,
        "data": data,
        "unsigned": unsigned,
        "signing_input": signing_input,
        "signature": sig,
        "message": unsigned + _field(5, sig) + _field(6, key.public_protobuf()),
        "message_go": unsigned + _field(5, sig),
    }


def spec_values() -> dict[str, str]:
    text = SPEC.read_text()
    block = re.search(r"<!-- gossip-trace -->\n```\n(.*?)```", text, re.S)
    assert block, "SPEC.md lost its gossip-trace block"
    out: dict[str, str] = {}
    for line in block.group(1).splitlines():
        name, value = (s.strip() for s in line.split("=", 1))
        out[name] = out.get(name, "") + value
    return out


def test_the_spec_trace_is_what_the_code_sends():
    c = crossing()
    v = spec_values()
    assert v["topic"] == "rl-swarm/spec/records/1"
    assert v["message_data_length"] == str(len(c["data"])) and c["data"] == bytes([TAG_RECORD]) + c["record"]
    assert v["message_data_sha256"] == hashlib.sha256(c["data"]).hexdigest()
    assert v["message_head"] == c["message"][: 2 + 38 + 3 + 1 + 4].hex()
    assert v["message_tail"] == c["message"][len(_field(1, b"x" * 38) + _field(2, c["data"])) :].hex()
    assert v["signing_input_sha256"] == hashlib.sha256(c["signing_input"]).hexdigest()
    assert v["signature"] == c["signature"].hex()
    assert v["message_length"] == str(len(c["message"]))
    assert v["message_sha256"] == hashlib.sha256(c["message"]).hexdigest()
    # the receiver checks the signature with the key inside the sender's peer id (the Ed25519 identity multihash)
    Ed25519PublicKey.from_public_bytes(NetworkKey.of(ALICE).peer_id_bytes[6:]).verify(
        c["signature"], c["signing_input"]
    )
    assert parse_frame(c["data"]) == (TAG_RECORD, c["record"])


def test_a_large_record_is_announced_and_the_announcement_parses():
    record = b"r" * 2000
    digest = hashlib.sha256(record).digest()
    data = record_frame(record, digest=digest, window=7, inline_max=1000)
    assert data[0] == TAG_ANNOUNCE and parse_frame(data) == (TAG_ANNOUNCE, (digest, 2000))
    for bad, reason in [(b"", "malformed"), (b"\x03x", "malformed"), (b"\x02\x91\x01", "malformed_announce")]:
        with pytest.raises(ValueError, match=reason):
            parse_frame(bad)


def test_sync_answers_from_a_store_as_the_libp2p_server_does():
    store = RecordStore(4, 16)
    store.add(5, hashlib.sha256(b"a").digest(), b"a")
    have = answer(parse_request(b"\x82\xa2op\xa4have\xa7windows\x91\x05"), store, lambda ad: [])
    assert have is not None and parse_have(have[0]) == [hashlib.sha256(b"a").digest()]
    got = answer({"op": "get", "digests": [hashlib.sha256(b"a").digest(), b"\x00" * 32]}, store, lambda ad: [])
    assert got == [b"a", b""]
    assert answer({"op": "nope"}, store, lambda ad: []) is None


def test_an_advertisement_made_here_verifies_and_a_tampered_one_does_not():
    key = NetworkKey.of(ALICE)
    ad = make_ad(key.seed, key.peer_id_bytes, swarm="spec", addrs=[f"/ip4/1.2.3.4/tcp/1/p2p/{key.peer_id}"],
                 version=(2, 2), now=1_700_000_000)  # fmt: skip
    assert ad_signer_ok(ad, "spec") == key.peer_id_bytes
    assert ad_signer_ok(ad, "other") is None
    assert ad_signer_ok(ad[:-1] + bytes([ad[-1] ^ 1]), "spec") is None

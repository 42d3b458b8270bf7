"""The node's libp2p key is its identity key (SPEC.md section 1): protobuf forms, peer id, p2pd's key file."""

import os
import stat
from pathlib import Path

import base58
import pytest
from hivemind.proto import crypto_pb2

from protocol.identity import Identity, peer_id_from_public
from protocol.transport.netkey import NetworkKey

ROOT = Path(__file__).resolve().parents[3]
ALICE = Identity.from_private_bytes(bytes(range(32)))
#: SPEC.md section 1: the libp2p peer id of the section's example key (py-libp2p's ``ID.from_pubkey`` agrees, see
#: tests/libp2p_isolated/contract_lp2p.py).
ALICE_LIBP2P_ID = "12D3KooWA4Xop1JaT3MHxwYMkCepYsv4iPVopMXwCz5iHYdBfeSB"


def libp2p_peer_id(public: bytes) -> str:
    """A libp2p peer id computed with hivemind's protobuf classes and the base58 package, not with our encoder."""
    pb = crypto_pb2.PublicKey(key_type=crypto_pb2.Ed25519, data=public).SerializeToString()
    return base58.b58encode(bytes([0x00, len(pb)]) + pb).decode()


def test_the_network_key_is_the_identity_key_pair():
    key = NetworkKey.of(ALICE)
    assert key.seed == bytes(range(32)) and key.public == ALICE.public_bytes
    assert key.peer_id == ALICE_LIBP2P_ID == libp2p_peer_id(ALICE.public_bytes)
    assert Identity.from_private_bytes(ALICE.private_bytes()).peer_id == ALICE.peer_id
    assert "seed" not in repr(key) and bytes(range(32)).hex() not in repr(key)


def test_the_libp2p_id_carries_the_public_key_and_so_the_protocol_peer_id():
    """SPEC.md section 1: the protocol peer id of a libp2p id is sha256 of its last 32 bytes, cut to 16 (not the
    other way round: the protocol id is a hash)."""
    for ident in (ALICE, Identity.generate(), Identity.generate()):
        raw = base58.b58decode(NetworkKey.of(ident).peer_id)
        assert raw[:6] == bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20]) and len(raw) == 38
        assert peer_id_from_public(raw[6:]) == ident.peer_id


def test_p2pd_key_file_from_an_identity_has_mode_0600_and_yields_its_peer_id(tmp_path):
    old = os.umask(0)  # the file must be 0600 whatever the umask
    try:
        path = NetworkKey.of(ALICE).write_p2pd_key(tmp_path / "p2pd.key")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    parsed = crypto_pb2.PrivateKey.FromString(path.read_bytes())
    assert parsed.key_type == crypto_pb2.Ed25519
    assert parsed.data == ALICE.private_bytes() + ALICE.public_bytes
    assert libp2p_peer_id(parsed.data[32:]) == ALICE_LIBP2P_ID
    with pytest.raises(FileExistsError):  # never overwrites a key file
        NetworkKey.of(Identity.generate()).write_p2pd_key(path)
    assert crypto_pb2.PrivateKey.FromString(path.read_bytes()).data[:32] == bytes(range(32))


def test_without_an_identity_every_key_is_new():
    a, b = NetworkKey.generate(), NetworkKey.generate()
    assert a.peer_id != b.peer_id and a.peer_id.startswith("12D3KooW")
    assert Identity.from_private_bytes(a.seed).public_bytes == a.public


def test_the_spec_states_the_libp2p_id_of_its_example_key():
    text = (ROOT / "protocol" / "SPEC.md").read_text()
    assert ALICE_LIBP2P_ID in text and ALICE.peer_id in text

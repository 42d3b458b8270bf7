"""The node's libp2p network key: its Ed25519 identity (``protocol.identity``) in the forms libp2p needs.

One key pair signs a node's records and is its libp2p host key, so its ``/p2p/`` id is stable across restarts (a
bootstrap node keeps its multiaddr) and names the same key as its records. The two signature uses cannot be
confused: every signature we make covers a ``rl-swarm/...`` domain prefix (``protocol/SPEC.md`` section 1), and
libp2p's own (Noise's ``noise-libp2p-static-key:``, pubsub's ``libp2p-pubsub:``, signed envelopes with a
length-prefixed domain) cover other prefixes.

* :class:`NetworkKey` -- the 32-byte seed and public key; libp2p's protobuf ``PrivateKey``/``PublicKey`` bytes
  (``Type`` Ed25519 = 1), its peer id (base58btc of the identity multihash of the protobuf public key, the
  ``12D3KooW...`` form) and p2pd's key file (0600).

Knows nothing about hivemind or py-libp2p (it imports neither): each transport builds its own key object from
the bytes here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import base58
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.identity import PUBLIC_KEY_LEN, Identity

#: libp2p's ``crypto.pb.KeyType`` of Ed25519 keys.
KEY_TYPE_ED25519 = 1
#: The multihash code of the identity "hash" (the bytes themselves), used for keys of at most 42 bytes.
IDENTITY_MULTIHASH = 0x00


def _protobuf_key(data: bytes) -> bytes:
    # message { KeyType Type = 1; bytes Data = 2; }: field 1 varint (0x08), field 2 length-delimited (0x12)
    return bytes([0x08, KEY_TYPE_ED25519, 0x12, len(data)]) + data


@dataclass(frozen=True)
class NetworkKey:
    """An Ed25519 libp2p key; from a node's identity (:meth:`of`) or fresh (:meth:`generate`, for callers without
    an identity, e.g. an observer or a doctor's probe)."""

    seed: bytes = field(repr=False)
    """The 32-byte Ed25519 private key (RFC 8032 seed); never sent anywhere."""
    public: bytes
    """The 32 raw public-key bytes."""

    def __post_init__(self) -> None:
        if len(self.seed) != 32 or len(self.public) != PUBLIC_KEY_LEN:
            raise ValueError("an Ed25519 network key is a 32-byte seed and a 32-byte public key")

    @classmethod
    def of(cls, identity: Identity) -> NetworkKey:
        """The network key of a node identity: the same key pair."""
        return cls(identity.private_bytes(), identity.public_bytes)

    @classmethod
    def generate(cls) -> NetworkKey:
        """A fresh random key (a new peer id at every start: only for callers that have no identity)."""
        key = Ed25519PrivateKey.generate()
        raw = serialization.Encoding.Raw
        seed = key.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
        return cls(seed, key.public_key().public_bytes(raw, serialization.PublicFormat.Raw))

    def private_protobuf(self) -> bytes:
        """libp2p's ``PrivateKey{Type: Ed25519, Data: seed || public}`` (68 bytes): the p2pd key file contents."""
        return _protobuf_key(self.seed + self.public)

    def public_protobuf(self) -> bytes:
        """libp2p's ``PublicKey{Type: Ed25519, Data: public}`` (36 bytes)."""
        return _protobuf_key(self.public)

    @property
    def peer_id_bytes(self) -> bytes:
        """The libp2p peer id: the identity multihash ``0x00 || len || PublicKey protobuf`` (38 bytes)."""
        pb = self.public_protobuf()
        return bytes([IDENTITY_MULTIHASH, len(pb)]) + pb

    @property
    def peer_id(self) -> str:
        """The libp2p peer id in base58btc (``12D3KooW...``), the ``/p2p/`` part of this node's multiaddrs."""
        return str(base58.b58encode(self.peer_id_bytes).decode())

    def write_p2pd_key(self, path: str | Path) -> Path:
        """Write p2pd's key file (:meth:`private_protobuf`), created with mode 0600; refuses to overwrite a file."""
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # umask can only remove bits; make the mode exact anyway
            f.write(self.private_protobuf())
        return path

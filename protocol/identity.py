"""Node identity: an Ed25519 key pair kept in a 0600 key file, and the peer id derived from its public key.

Key file format: an unencrypted PKCS#8 PEM block (``-----BEGIN PRIVATE KEY-----``), the format
``openssl genpkey -algorithm ed25519`` writes, so the key can be inspected with standard tools. The file
must not be readable or writable by group or others (mode 0600 or stricter) or loading refuses it.

Peer id: the first 16 bytes of SHA-256 over the 32 raw public-key bytes, as 32 lowercase hex characters
(see :func:`peer_id_from_public` and ``protocol/SPEC.md``). It is stable for the lifetime of the key.

Knows nothing about records, swarms or transports: it signs and verifies bytes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.errors import IdentityError

logger = logging.getLogger(__name__)

PUBLIC_KEY_LEN = 32
SIGNATURE_LEN = 64
PEER_ID_LEN = 32  # hex characters (16 bytes of SHA-256)
_MAX_KEY_FILE_BYTES = 16 * 1024  # a PEM Ed25519 key is ~120 bytes; anything huge is not a key file


def peer_id_from_public(public_bytes: bytes) -> str:
    """Peer id of a raw 32-byte Ed25519 public key: ``sha256(public_bytes)[:16].hex()`` (32 lowercase hex chars)."""
    if len(public_bytes) != PUBLIC_KEY_LEN:
        raise ValueError(f"an Ed25519 public key has {PUBLIC_KEY_LEN} bytes, got {len(public_bytes)}")
    return hashlib.sha256(bytes(public_bytes)).digest()[: PEER_ID_LEN // 2].hex()


def verify(public_bytes: bytes, data: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``data`` by ``public_bytes``; never raises."""
    try:
        if len(public_bytes) != PUBLIC_KEY_LEN or len(signature) != SIGNATURE_LEN:
            return False
        Ed25519PublicKey.from_public_bytes(bytes(public_bytes)).verify(bytes(signature), bytes(data))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


class Identity:
    """An Ed25519 private key with its peer id; create with :meth:`generate`, :meth:`load` or :meth:`load_or_create`."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self._public = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self._peer_id = peer_id_from_public(self._public)

    @classmethod
    def generate(cls) -> Identity:
        """A fresh random key pair."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, seed: bytes) -> Identity:
        """The identity of a raw 32-byte Ed25519 private key (seed); deterministic, for tests and test vectors."""
        if len(seed) != 32:
            raise IdentityError(f"an Ed25519 private key has 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    @property
    def peer_id(self) -> str:
        """32 lowercase hex characters derived from the public key (see :func:`peer_id_from_public`)."""
        return self._peer_id

    @property
    def public_bytes(self) -> bytes:
        """The 32 raw public-key bytes (what records carry)."""
        return self._public

    def private_bytes(self) -> bytes:
        """The 32-byte raw private key (RFC 8032 seed): what the node's libp2p key is built from
        (``protocol.transport.netkey``); it never leaves the node."""
        return self._key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def sign(self, data: bytes) -> bytes:
        """Ed25519 signature (64 bytes) of ``data``."""
        return self._key.sign(bytes(data))

    def private_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM (the key-file contents)."""
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def __repr__(self) -> str:
        return f"Identity(peer_id={self._peer_id!r})"

    # -- files -------------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the key file atomically with mode 0600 (parent directories are created; an existing file is replaced).

        The temporary file is created with mode 0600 by ``os.open`` itself, so the key is never on disk with
        looser permissions, then renamed over ``path``.
        """
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.fchmod(fd, 0o600)  # umask can only remove bits; make the mode exact anyway
                os.write(fd, self.private_pem())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            raise IdentityError(f"cannot write key file {path}: {e.strerror or e}") from None
        logger.debug("saved identity %s to %s", self._peer_id, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Identity:
        """Read a key file; :class:`IdentityError` if it is missing, not 0600, or not an Ed25519 PEM key."""
        path = Path(path)
        if not path.exists():
            raise IdentityError(f"key file {path} does not exist (create one with `swarm-node keygen --out {path}`)")
        if not path.is_file():
            raise IdentityError(f"key file {path} is not a regular file")
        try:
            st = path.stat()
            if os.name == "posix" and st.st_mode & 0o077:
                mode = stat.S_IMODE(st.st_mode)
                raise IdentityError(
                    f"key file {path} has permissions {mode:04o}; it must not be accessible by group or others "
                    f"(run `chmod 600 {path}`)"
                )
            if st.st_size > _MAX_KEY_FILE_BYTES:
                raise IdentityError(f"key file {path} is {st.st_size} bytes; not an Ed25519 PEM key")
            data = path.read_bytes()
        except OSError as e:
            raise IdentityError(f"cannot read key file {path}: {e.strerror or e}") from None
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            reason = "it is encrypted" if "password" in str(e).lower() else "not a PEM private key"
            raise IdentityError(f"key file {path} has bad contents ({reason})") from None
        except Exception as e:  # cryptography raises assorted errors on corrupt input
            raise IdentityError(f"key file {path} has bad contents ({e.__class__.__name__})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"key file {path} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    @classmethod
    def load_or_create(cls, path: str | Path) -> Identity:
        """Load ``path`` if it exists, otherwise generate a key and save it there (first join)."""
        path = Path(path)
        if path.exists():
            return cls.load(path)
        ident = cls.generate()
        ident.save(path)
        logger.info("created new identity %s at %s", ident.peer_id, path)
        return ident

"""Identity: Ed25519 key files (0600, atomic), peer ids, sign/verify."""

import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from protocol.errors import IdentityError
from protocol.identity import Identity, peer_id_from_public, verify


def test_sign_and_verify():
    ident = Identity.generate()
    sig = ident.sign(b"hello")
    assert len(sig) == 64 and len(ident.public_bytes) == 32
    assert verify(ident.public_bytes, b"hello", sig)
    assert not verify(ident.public_bytes, b"hellO", sig)
    assert not verify(Identity.generate().public_bytes, b"hello", sig)
    assert not verify(ident.public_bytes, b"hello", sig[:-1] + bytes([sig[-1] ^ 1]))


@pytest.mark.parametrize(
    "pub,sig", [(b"", b"x" * 64), (b"x" * 31, b"x" * 64), (b"x" * 32, b""), (b"\xff" * 32, b"\0" * 64)]
)
def test_verify_never_raises_on_garbage(pub, sig):
    assert verify(pub, b"data", sig) is False


def test_peer_id_is_derived_from_public_key():
    ident = Identity.from_private_bytes(bytes(range(32)))
    again = Identity.from_private_bytes(bytes(range(32)))
    assert ident.peer_id == again.peer_id == peer_id_from_public(ident.public_bytes)
    assert len(ident.peer_id) == 32 and all(c in "0123456789abcdef" for c in ident.peer_id)
    assert Identity.generate().peer_id != ident.peer_id
    with pytest.raises(ValueError):
        peer_id_from_public(b"short")


def test_save_load_round_trip_with_0600(tmp_path):
    ident = Identity.generate()
    path = tmp_path / "deep" / "dir" / "node.key"
    ident.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    loaded = Identity.load(path)
    assert loaded.peer_id == ident.peer_id
    assert verify(loaded.public_bytes, b"m", ident.sign(b"m"))
    assert [p.name for p in path.parent.iterdir()] == ["node.key"]  # no temp file left behind


def test_save_replaces_atomically_and_keeps_0600(tmp_path):
    path = tmp_path / "node.key"
    Identity.generate().save(path)
    second = Identity.generate()
    second.save(path)
    assert Identity.load(path).peer_id == second.peer_id
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_save_under_permissive_umask_is_still_0600(tmp_path):
    old = os.umask(0)
    try:
        Identity.generate().save(tmp_path / "k")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600


def test_load_missing_file(tmp_path):
    with pytest.raises(IdentityError, match="does not exist"):
        Identity.load(tmp_path / "nope.key")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_load_refuses_loose_permissions(tmp_path, mode):
    path = tmp_path / "node.key"
    Identity.generate().save(path)
    path.chmod(mode)
    with pytest.raises(IdentityError, match="chmod 600"):
        Identity.load(path)


def test_load_accepts_0400(tmp_path):
    path = tmp_path / "node.key"
    ident = Identity.generate()
    ident.save(path)
    path.chmod(0o400)
    assert Identity.load(path).peer_id == ident.peer_id


@pytest.mark.parametrize(
    "content", [b"", b"not a key", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"]
)
def test_load_bad_contents(tmp_path, content):
    path = tmp_path / "node.key"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(IdentityError, match="bad contents"):
        Identity.load(path)


def test_load_refuses_other_key_types(tmp_path):
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = tmp_path / "node.key"
    path.write_bytes(pem)
    path.chmod(0o600)
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        Identity.load(path)


def test_load_directory(tmp_path):
    with pytest.raises(IdentityError, match="not a regular file"):
        Identity.load(tmp_path)


def test_load_or_create(tmp_path):
    path = tmp_path / "keys" / "node.key"
    first = Identity.load_or_create(path)
    assert path.exists()
    assert Identity.load_or_create(path).peer_id == first.peer_id


def test_from_private_bytes_checks_length():
    with pytest.raises(IdentityError):
        Identity.from_private_bytes(b"short")

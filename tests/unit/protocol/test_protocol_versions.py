"""Protocol versions in records and index entries (SPEC.md 15): another major is refused as
``incompatible_version`` and reported once in one line naming both versions; a newer minor of the same major is
read, its unknown body keys ignored; an older minor is read as is."""

import logging

import pytest

from protocol import version
from protocol.codec import RecordDecodeError, strict_unpackb
from protocol.identity import Identity
from protocol.layout import (
    IndexWriter,
    ShardParams,
    ShardReader,
    canonical_packb,
    decode_index_entry,
    encode_index_entry,
)
from protocol.records import decode_record, sign_body
from protocol.version import ENV_OVERRIDE, INCOMPATIBLE, PROTOCOL_VERSION, format_version
from tests.unit.protocol.test_records import vector_record

ALICE = Identity.from_private_bytes(bytes(range(32)))
WINDOW = 113_333_333
DIGEST = "93fcf06f03fa6ed4efbaa52b70e7ef2d"
OURS = format_version(PROTOCOL_VERSION)


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch):
    """Each test starts with no version reported yet and no override."""
    monkeypatch.delenv(ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(version, "_reported", set())
    version.override_local_version(None)
    yield
    version.override_local_version(None)


def body_of(data: bytes) -> dict:
    return strict_unpackb(strict_unpackb(data)["body"])


def reason(fn, data: bytes) -> str:
    with pytest.raises(RecordDecodeError) as e:
        fn(data)
    return e.value.reason


def version_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "incompatible protocol version" in r.getMessage()]


def test_records_and_index_entries_carry_this_codes_version():
    env = decode_record(vector_record())
    assert (env.schema_version, env.minor) == PROTOCOL_VERSION
    body = strict_unpackb(strict_unpackb(encode_index_entry(ALICE, "spec", WINDOW, [DIGEST]))["body"])
    assert body["version"] == OURS


def test_a_record_of_another_major_is_refused_and_reported_once(caplog, monkeypatch):
    version.override_local_version(f"{PROTOCOL_VERSION[0] + 1}.3")
    theirs = vector_record()
    version.override_local_version(None)
    assert body_of(theirs)["schema_version"] == PROTOCOL_VERSION[0] + 1
    with caplog.at_level(logging.WARNING, logger="protocol.version"):
        for _ in range(3):
            assert reason(decode_record, theirs) == INCOMPATIBLE
    lines = version_lines(caplog)
    assert len(lines) == 1, lines
    assert f"speaks {PROTOCOL_VERSION[0] + 1}.3, this node speaks {OURS}" in lines[0]
    # SPEC 15: the claimed sender's first 16 characters, not the whole peer id
    assert f"peer {ALICE.peer_id[:16]} speaks" in lines[0] and ALICE.peer_id not in lines[0]


def test_a_1x_record_without_a_minor_is_named_1x(caplog):
    body = body_of(vector_record())
    body["schema_version"] = 1
    del body["minor"]
    with caplog.at_level(logging.WARNING, logger="protocol.version"):
        assert reason(decode_record, sign_body(ALICE, body)) == INCOMPATIBLE
    assert "speaks 1.x, this node speaks" in version_lines(caplog)[0]


def test_a_newer_minor_is_read_and_its_unknown_body_keys_ignored(caplog, monkeypatch):
    older = vector_record()
    body = body_of(older)
    body["minor"] = PROTOCOL_VERSION[1] + 1
    body["added_later"] = [1, 2]
    newer = sign_body(ALICE, body)
    with caplog.at_level(logging.WARNING):
        env = decode_record(newer)
    assert env.minor == PROTOCOL_VERSION[1] + 1 and env.window == WINDOW
    assert not version_lines(caplog)
    # A reader of that minor knows every key of it: an unknown key is a schema violation there.
    version.override_local_version(f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1] + 1}")
    assert reason(decode_record, newer) == "schema"
    # and it reads an older minor's record unchanged
    assert decode_record(older).minor == PROTOCOL_VERSION[1]


MALFORMED = [
    ("schema_version", "2", "unsupported_version"),
    ("schema_version", -1, "unsupported_version"),
    ("minor", "0", "schema"),
    ("minor", None, "schema"),
]


@pytest.mark.parametrize(("field", "value", "expected"), MALFORMED)
def test_malformed_versions_are_refused_without_a_report(caplog, field, value, expected):
    body = body_of(vector_record())
    body[field] = value
    with caplog.at_level(logging.WARNING):
        assert reason(decode_record, sign_body(ALICE, body)) == expected
    assert not version_lines(caplog)


def _index(body: dict) -> bytes:
    raw = canonical_packb(body)
    return canonical_packb({"body": raw, "sig": ALICE.sign(b"rl-swarm/index/v1\x00" + raw)})


def test_index_entries_of_another_major_are_refused_and_counted_by_a_reader(caplog, monkeypatch):
    version.override_local_version(f"{PROTOCOL_VERSION[0] + 1}.0")
    theirs = encode_index_entry(ALICE, "spec", WINDOW, [DIGEST])
    version.override_local_version(None)
    with caplog.at_level(logging.WARNING, logger="protocol.version"):
        assert reason(decode_index_entry, theirs) == INCOMPATIBLE
        reader = ShardReader("spec", ShardParams())
        taken = [reader._take(theirs, WINDOW), reader._take(theirs, WINDOW)]
    assert taken == [None, None] and reader.dropped == {INCOMPATIBLE: 2}
    assert len(version_lines(caplog)) == 1
    # a 1.x entry (no version key) is another major too
    body = strict_unpackb(strict_unpackb(theirs)["body"])
    del body["version"]
    assert reason(decode_index_entry, _index(body)) == INCOMPATIBLE


def test_index_entries_of_a_newer_minor_are_read():
    body = strict_unpackb(strict_unpackb(encode_index_entry(ALICE, "spec", WINDOW, [DIGEST]))["body"])
    body["version"] = f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1] + 2}"
    body["added_later"] = "x"
    entry = decode_index_entry(_index(body))
    assert entry.digests == (DIGEST,) and entry.sender == ALICE.peer_id
    body["version"] = "two"
    assert reason(decode_index_entry, _index(body)) == "unsupported_version"


def test_the_writer_signs_entries_with_the_version_it_speaks(monkeypatch):
    version.override_local_version(f"{PROTOCOL_VERSION[0]}.7")
    entry = IndexWriter(ALICE, "spec").add(vector_record(), WINDOW)
    assert entry is not None
    assert strict_unpackb(strict_unpackb(entry)["body"])["version"] == f"{PROTOCOL_VERSION[0]}.7"


def test_a_node_of_a_later_major_reads_its_own_stamped_entries():
    """The work stamp is optional from 2.1 on, in every later major too: a node speaking 3.0 (the test override of
    the versions test with real processes) stamps its entries and its own transport and peers of 3.0 read them
    (the minor-only rule made every 3.0 publish a ``schema`` error, so that test never saw a 3.0 entry)."""
    version.override_local_version(f"{PROTOCOL_VERSION[0] + 1}.0")
    entry = IndexWriter(ALICE, "spec").add(vector_record(), WINDOW)
    assert entry is not None and "work" in body_of(entry)
    assert decode_index_entry(entry).sender == ALICE.peer_id
    version.override_local_version("2.0")  # and 2.0 still has exactly 2.0's keys
    stamped = body_of(entry) | {"version": "2.0"}
    assert reason(decode_index_entry, _index(stamped)) == "schema"


def test_reports_are_bounded_whatever_versions_a_peer_claims(caplog):
    with caplog.at_level(logging.WARNING, logger="protocol.version"):
        for major in range(100, 100 + 3 * version.MAX_REPORTED):
            version.report_incompatible((major, 0))
    assert len(version_lines(caplog)) == version.MAX_REPORTED

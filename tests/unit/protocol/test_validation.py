"""RecordValidator: check order, every rejection counted by reason, bounded memory, never raises (hypothesis)."""

import contextlib

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codec import canonical_packb
from protocol.errors import DecodeError, SignatureError
from protocol.identity import Identity
from protocol.records import decode_record, encode_record, signing_input, wrap_record
from protocol.transport.config import ProtocolConfig
from protocol.types import Completion, Group, RolloutBatch, TaskRef
from protocol.validation import REJECT_REASONS, RecordValidator

WS = 15
NOW = 1_700_000_000.0
NOW_W = int(NOW // WS)
ALICE = Identity.from_private_bytes(b"\x01" * 32)
BOB = Identity.from_private_bytes(b"\x02" * 32)
BATCH = RolloutBatch(
    "m", 1, "t", (Group(TaskRef("chain_sum", {"n": 2}, 0, 1), (Completion("4", 1, reward_hint=1.0),)),)
)


class Clock:
    def __init__(self, t=NOW):
        self.t = t

    def __call__(self):
        return self.t


def make_validator(clock=None, **kw) -> RecordValidator:
    args = dict(
        swarm_id="s",
        window_seconds=WS,
        max_bytes=1 << 16,
        max_future_windows=1,
        max_past_windows=4,
        quota_per_window=3,
        clock=clock or Clock(),
    )
    args.update(kw)
    return RecordValidator(**args)


def rec(ident=ALICE, seq=1, window=NOW_W, swarm="s", payload=BATCH) -> bytes:
    return encode_record(ident, kind="rollouts", swarm=swarm, seq=seq, window=window, created=NOW, payload=payload)


def test_accepts_a_valid_record():
    v = make_validator()
    env = v.check(rec())
    assert env is not None and env.payload == BATCH and env.sender == ALICE.peer_id
    assert v.metrics()["accepted"] == 1 and v.metrics()["rejected_total"] == 0
    assert set(v.rejected) == set(REJECT_REASONS)


@pytest.mark.parametrize(
    "data,reason",
    [
        (b"\x00" * 70_000, "oversize"),
        (b"\xc1garbage", "malformed"),
        (rec(swarm="other"), "wrong_swarm"),
        (rec(window=NOW_W + 2), "future"),
        (rec(window=NOW_W - 5), "stale"),
    ],
)
def test_rejections_by_reason(data, reason):
    v = make_validator()
    assert v.check(data) is None
    assert v.rejected[reason] == 1 and v.metrics()["rejected_total"] == 1


def test_window_edges_are_accepted():
    v = make_validator()
    assert v.check(rec(seq=1, window=NOW_W + 1)) is not None
    assert v.check(rec(seq=2, window=NOW_W - 4)) is not None


def test_bad_signature_and_sender_mismatch_are_counted():
    from protocol.codec import strict_unpackb

    v = make_validator()
    body = strict_unpackb(strict_unpackb(rec())["body"])
    raw = canonical_packb(body)
    assert v.check(wrap_record(raw, BOB.sign(signing_input(raw)))) is None
    body["sender"] = BOB.peer_id
    raw = canonical_packb(body)
    assert v.check(wrap_record(raw, ALICE.sign(signing_input(raw)))) is None
    assert v.rejected["bad_signature"] == 1 and v.rejected["sender_mismatch"] == 1


def test_size_cap_is_checked_before_decoding(monkeypatch):
    import protocol.validation as validation

    def boom(*a, **k):
        raise AssertionError("decode_record must not run on oversize input")

    monkeypatch.setattr(validation, "decode_record", boom)
    v = make_validator(max_bytes=100)
    assert v.check(b"x" * 101) is None and v.rejected["oversize"] == 1


def test_replay_is_rejected_but_out_of_order_seq_is_fine():
    v = make_validator()
    assert v.check(rec(seq=5)) is not None
    assert v.check(rec(seq=5)) is None
    assert v.check(rec(seq=3)) is not None  # DHT reads are unordered: older seq is not a replay
    assert v.rejected["replay"] == 1


def test_quota_per_sender_per_window():
    v = make_validator(quota_per_window=3)
    got = [v.check(rec(seq=s)) for s in range(5)]
    assert [g is not None for g in got] == [True, True, True, False, False]
    assert v.rejected["quota"] == 2
    assert v.check(rec(ident=BOB, seq=1)) is not None  # per sender
    assert v.check(rec(seq=10, window=NOW_W - 1)) is not None  # per window


def test_replayed_record_is_not_charged_to_the_quota():
    v = make_validator(quota_per_window=2)
    v.check(rec(seq=1))
    for _ in range(5):
        v.check(rec(seq=1))
    assert v.check(rec(seq=2)) is not None
    assert v.rejected["replay"] == 5 and v.rejected["quota"] == 0


def test_memory_is_pruned_as_windows_pass():
    clock = Clock()
    v = make_validator(clock=clock, quota_per_window=100)
    for s in range(10):
        v.check(rec(seq=s))
    assert v.metrics()["tracked"] == 10
    clock.t += WS * 6  # the records' window is now behind the horizon
    assert v.check(rec(ident=BOB, seq=1, window=int(clock.t // WS))) is not None
    assert v.metrics()["tracked"] == 1
    assert v.check(rec(seq=3)) is None and v.rejected["stale"] == 1  # old record now stale, not replay


def test_replay_memory_is_capped():
    v = make_validator(quota_per_window=10_000, replay_capacity=50)
    for s in range(200):
        assert v.check(rec(seq=s, window=NOW_W - (s % 3))) is not None
        assert v.metrics()["tracked"] <= 50


@pytest.mark.parametrize("bad", [None, "text", 123, [b"x"], object()])
def test_non_bytes_input_never_raises(bad):
    v = make_validator()
    assert v.check(bad) is None
    assert v.rejected["malformed"] == 1


def test_is_storable_is_stateless():
    v = make_validator()
    data = rec()
    assert v.is_storable(data) and v.is_storable(data)  # repeats are fine at store time
    assert not v.is_storable(b"junk") and not v.is_storable(rec(swarm="x"))
    assert v.metrics()["accepted"] == 0 and v.metrics()["rejected_total"] == 0


def _counting_decodes(monkeypatch) -> list[int]:
    import protocol.validation as validation

    calls: list[int] = []

    def counted(data, max_bytes):
        calls.append(1)
        return decode_record(data, max_bytes)

    monkeypatch.setattr(validation, "decode_record", counted)
    return calls


def test_the_edge_check_and_the_receive_check_share_one_decode(monkeypatch):
    """A transport's edge check (``verdict``) and the channel's ``check`` of the same record decode and verify it
    once; a refusal is remembered with its reason too."""
    calls = _counting_decodes(monkeypatch)
    v = make_validator()
    data = rec()
    env = v.verdict(data)
    assert env.sender == ALICE.peer_id and len(calls) == 1
    assert v.check(data) == env and len(calls) == 1
    forged = bytearray(rec(seq=2))
    forged[-1] ^= 1
    assert v.verdict(bytes(forged)) == "bad_signature" and v.verdict(bytes(forged)) == "bad_signature"
    assert v.check(bytes(forged)) is None and v.rejected["bad_signature"] == 1 and len(calls) == 2
    assert v.verdict(rec(swarm="x")) == "wrong_swarm"


def test_a_remembered_verdict_still_has_its_window_checked(monkeypatch):
    clock = Clock()
    v = make_validator(clock=clock)
    data = rec()
    assert v.verdict(data) != "stale"
    clock.t += 6 * WS  # the record's window is now past max_past_windows
    assert v.verdict(data) == "stale" and v.check(data) is None and v.rejected["stale"] == 1


def test_remembered_verdicts_leave_with_their_window():
    """The shared decode's memory is the acceptance horizon, not the run: a record's verdict is forgotten once its
    window falls behind ``max_past_windows`` (it could only be refused as stale), and a stale record is never kept."""
    clock = Clock()
    v = make_validator(clock=clock)
    for seq in range(1, 4):
        assert v.check(rec(seq=seq)) is not None
    assert len(v._verdicts) == 3 and set(v._verdict_windows) == {NOW_W}
    clock.t += 5 * WS  # NOW_W is now behind the horizon
    assert v.check(rec(seq=9, window=NOW_W + 5)) is not None
    assert len(v._verdicts) == 1 and set(v._verdict_windows) == {NOW_W + 5}
    assert v.verdict(rec(seq=10)) == "stale" and len(v._verdicts) == 1
    assert v._verdict_bytes == len(rec(seq=9, window=NOW_W + 5))


def test_remembered_verdicts_are_capped_by_count(monkeypatch):
    import protocol.validation as validation

    monkeypatch.setattr(validation, "VERDICT_CACHE_ENTRIES", 8)
    v = make_validator(quota_per_window=100)
    sent = [rec(seq=seq) for seq in range(1, 21)]
    for data in sent:
        assert v.check(data) is not None
    assert len(v._verdicts) == 8 and len(v._verdict_windows[NOW_W]) == 8
    assert v._verdict_bytes == sum(len(d) for d in sent[-8:])


def test_from_config():
    cfg = ProtocolConfig()
    v = RecordValidator.from_config("s", cfg, clock=Clock())
    assert v.window_seconds == cfg.window_seconds and v.max_bytes == cfg.max_record_bytes
    assert v.check(rec()) is not None


# -- property tests ------------------------------------------------------------------------------------

VALID = rec()

_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
_values = st.recursive(
    _scalars | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_raise_out_of_check(data):
    v = make_validator()
    assert v.check(data) is None
    assert v.metrics()["rejected_total"] == 1


@st.composite
def mutated(draw):
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[i : i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[i:]
    return bytes(data)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(mutated())
def test_mutated_records_never_raise_and_are_rejected(data):
    v = make_validator()
    env = v.check(data)
    assert env is None or data == VALID
    with contextlib.suppress(DecodeError, SignatureError):  # anything else fails the test
        decode_record(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_values, st.binary(min_size=64, max_size=64))
def test_arbitrary_msgpack_bodies_only_raise_decode_or_signature_errors(body, sig):
    for raw in (msgpack.packb(body, use_bin_type=True), msgpack.packb(body, use_bin_type=False)):
        data = msgpack.packb({"body": raw, "sig": sig}, use_bin_type=True)
        with pytest.raises((DecodeError, SignatureError)):
            decode_record(data)
        assert make_validator().check(data) is None


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.sampled_from(["model", "policy_version", "tokenizer", "groups", "x"]), _values, max_size=5))
def test_signed_records_with_arbitrary_payloads_are_rejected_cleanly(payload):
    from protocol.codec import strict_unpackb

    body = strict_unpackb(strict_unpackb(VALID)["body"])
    body["payload"] = payload
    try:
        raw = canonical_packb(body)
    except (TypeError, ValueError):
        return  # NaN and friends cannot even be signed canonically
    data = wrap_record(raw, ALICE.sign(signing_input(raw)))
    v = make_validator()
    env = v.check(data)
    if env is None:
        assert v.rejected["schema"] == 1
    else:  # hypothesis built a valid (empty) batch
        assert isinstance(env.payload, RolloutBatch) and env.payload.groups == ()

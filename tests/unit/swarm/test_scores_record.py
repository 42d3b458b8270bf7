"""The MNPO ``scores`` record kind: encode/decode, strict schema and bounds, and the validator on arbitrary bytes."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import EncodeError, RecordDecodeError, canonical_packb, strict_unpackb
from protocol.identity import Identity
from protocol.kinds import get_kind
from protocol.records import decode_record, encode_record, sign_body
from protocol.types import TaskRef
from protocol.validation import RecordValidator
from swarm.scores import HASH_LEN, KIND, MAX_SCORES, ScoreBatch, response_hash

ALICE = Identity.from_private_bytes(bytes(range(32)))
NOW = 1_700_000_000.0
TASK = TaskRef("chain_sum", {"min_terms": 2}, 0, 7)


def batch(n=3, **kw) -> ScoreBatch:
    fields = dict(
        window=5,
        model="builtin:tiny",
        tokenizer="abcd",
        policy_version=2,
        hashes=tuple(response_hash(TASK, f"<answer>{i}</answer>") for i in range(n)),
        logprob_means=tuple(-0.5 - i for i in range(n)),
    )
    fields.update(kw)
    return ScoreBatch(**fields)


def encode(payload, **kw) -> bytes:
    args = dict(kind=KIND, swarm="s", seq=1, window=int(NOW // 15), created=NOW, payload=payload)
    args.update(kw)
    return encode_record(ALICE, **args)


def validator() -> RecordValidator:
    return RecordValidator("s", 15, 1 << 20, 1, 4, 16, clock=lambda: NOW)


def test_kind_is_registered_and_round_trips():
    assert get_kind(KIND) is not None
    b = batch()
    env = decode_record(encode(b))
    assert env.kind == KIND and env.payload == b
    assert env.payload.as_dict()[b.hashes[1]] == -1.5
    assert validator().check(encode(b)) is not None


def test_response_hash_is_content_addressed():
    h = response_hash(TASK, "x")
    assert len(h) == HASH_LEN and h == response_hash(TASK, "x")
    assert h != response_hash(TASK, "y") and h != response_hash(TaskRef("chain_sum", {"min_terms": 2}, 0, 8), "x")


def test_empty_batch_is_valid():
    assert decode_record(encode(batch(0))).payload.hashes == ()


def _resigned(mutate) -> bytes:
    body = strict_unpackb(strict_unpackb(encode(batch()))["body"])
    mutate(body["payload"])
    return sign_body(ALICE, body)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.__setitem__("hashes", p["hashes"][:-1]),  # not a multiple of 16
        lambda p: p.__setitem__("hashes", p["hashes"][:16] * 3),  # duplicates
        lambda p: p.__setitem__("logprob_means", p["logprob_means"][:-1]),  # length mismatch
        lambda p: p["logprob_means"].__setitem__(0, 0.5),  # positive logprob
        lambda p: p["logprob_means"].__setitem__(0, -1e9),  # below the floor
        lambda p: p["logprob_means"].__setitem__(0, 1),  # int, not float
        lambda p: p.__setitem__("window", -1),
        lambda p: p.__setitem__("policy_version", "2"),
        lambda p: p.__setitem__("model", "m" * 300),
        lambda p: p.__setitem__("extra", 1),
        lambda p: p.pop("tokenizer"),
        lambda p: p.__setitem__("hashes", [b"x" * 16]),
    ],
)
def test_schema_violations_are_rejected(mutate):
    data = _resigned(mutate)
    with pytest.raises(RecordDecodeError) as e:
        decode_record(data)
    assert e.value.reason == "schema"
    v = validator()
    assert v.check(data) is None and v.rejected["schema"] == 1


def test_too_many_scores_are_refused_by_the_encoder_and_the_decoder():
    n = MAX_SCORES + 1
    big = ScoreBatch(5, "m", "t", 0, tuple(i.to_bytes(16, "big") for i in range(n)), (-1.0,) * n)
    with pytest.raises(EncodeError):
        encode(big)
    body = strict_unpackb(strict_unpackb(encode(batch()))["body"])
    body["payload"]["hashes"] = b"".join(big.hashes)
    body["payload"]["logprob_means"] = [-1.0] * n
    assert validator().check(sign_body(ALICE, body)) is None


def test_encoder_refuses_nan_and_non_batches():
    with pytest.raises(EncodeError):
        encode(batch(logprob_means=(math.nan, -1.0, -2.0)))
    with pytest.raises(EncodeError):
        encode({"hashes": b""})


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_validator_never_raises_on_arbitrary_bytes(data):
    v = validator()
    assert v.check(data) is None
    assert sum(v.rejected.values()) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["window", "model", "tokenizer", "policy_version", "hashes", "logprob_means", "x"]),
        st.one_of(
            st.integers(-5, 5),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=5),
            st.binary(max_size=40),
            st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=4),
            st.none(),
        ),
    )
)
def test_validator_never_raises_on_signed_arbitrary_payloads(payload):
    body = strict_unpackb(strict_unpackb(encode(batch()))["body"])
    body["payload"] = payload
    try:
        data = sign_body(ALICE, body)
    except (TypeError, ValueError):
        return
    v = validator()
    env = v.check(data)
    assert env is None or isinstance(env.payload, ScoreBatch)
    assert canonical_packb(payload) is not None

"""Records: canonical MessagePack, signing with domain separation, the kind registry, decode reasons, seq, windows."""

import math
import re
import struct
from pathlib import Path

import msgpack
import pytest

from protocol.codec import EncodeError, RecordDecodeError, RecordSignatureError, canonical_packb, strict_unpackb
from protocol.errors import DecodeError, SignatureError
from protocol.identity import Identity
from protocol.kinds import RecordKind, get_kind, register_kind, registered_kinds
from protocol.records import (
    SIGNING_DOMAIN,
    SequenceCounter,
    decode_record,
    encode_record,
    sign_body,
    signing_input,
    window_of,
    wrap_record,
)
from protocol.schema import expect_float, expect_list, expect_map, expect_str
from protocol.types import Completion, Group, RolloutBatch, TaskRef
from protocol.version import PROTOCOL_VERSION

SPEC = Path(__file__).resolve().parents[3] / "protocol" / "SPEC.md"
ALICE = Identity.from_private_bytes(bytes(range(32)))


def make_batch(n_groups=2, n_comp=3, logprobs=True) -> RolloutBatch:
    groups = []
    for g in range(n_groups):
        task = TaskRef("chain_sum", {"min_terms": 2, "ratio": 0.5, "name": "x", "flag": True, "none": None}, 7, g)
        comps = tuple(
            Completion(
                text=f"answer {g}.{i} ünïcødé",
                n_tokens=5 + i,
                finish_reason=("stop", "length", "abort")[i % 3],
                policy_version=3,
                logprob_mean=-0.25 if logprobs else None,
                token_logprobs=(-0.1, -0.2, -0.3) if logprobs else None,
                reward_hint=float(i % 2),
            )
            for i in range(n_comp)
        )
        groups.append(Group(task, comps))
    return RolloutBatch(model="builtin:tiny", policy_version=3, tokenizer="tok-abc", groups=tuple(groups))


def encode(payload=None, ident=ALICE, **kw) -> bytes:
    args = {"kind": "rollouts", "swarm": "s1", "seq": 1, "window": 100, "created": 1500.0, "payload": payload}
    args.update(kw)
    if args["payload"] is None:
        args["payload"] = make_batch()
    return encode_record(ident, **args)


def body_of(data: bytes) -> dict:
    return strict_unpackb(strict_unpackb(data)["body"])


def resign(body: dict, ident=ALICE, *, packer=canonical_packb) -> bytes:
    raw = packer(body)
    return wrap_record(raw, ident.sign(signing_input(raw)))


def reason_of(data: bytes) -> str:
    with pytest.raises((DecodeError, SignatureError)) as e:
        decode_record(data)
    return e.value.reason


# -- round trip and canonical form ---------------------------------------------------------------------


def test_round_trip():
    batch = make_batch()
    env = decode_record(encode(batch))
    assert env.payload == batch
    assert (env.kind, env.swarm, env.sender, env.seq, env.window, env.created) == (
        "rollouts",
        "s1",
        ALICE.peer_id,
        1,
        100,
        1500.0,
    )
    assert env.public_key == ALICE.public_bytes and (env.schema_version, env.minor) == PROTOCOL_VERSION
    assert env.size == len(encode(batch))


def test_round_trip_without_optional_fields_and_empty_groups():
    batch = make_batch(logprobs=False)
    assert decode_record(encode(batch)).payload == batch
    empty = RolloutBatch("m", 0, "t", ())
    assert decode_record(encode(empty)).payload == empty


def test_encoding_is_deterministic_and_signature_is_deterministic():
    assert encode() == encode()  # Ed25519 signatures are deterministic too


def test_map_keys_are_sorted_recursively():
    def pairs_sorted(pairs):
        keys = [k for k, _ in pairs]
        assert keys == sorted(keys)
        return dict(pairs)

    data = encode()
    msgpack.unpackb(data, object_pairs_hook=pairs_sorted)
    msgpack.unpackb(strict_unpackb(data)["body"], object_pairs_hook=pairs_sorted)


def test_floats_are_always_float64():
    assert canonical_packb(0.5) == b"\xcb" + struct.pack(">d", 0.5)
    assert canonical_packb({"a": 1.0}) == b"\x81\xa1a\xcb" + struct.pack(">d", 1.0)
    batch = RolloutBatch("m", 0, "t", (Group(TaskRef("f"), (Completion("x", 1, reward_hint=1),)),))  # int hint
    env = decode_record(encode(batch))
    assert type(env.payload.groups[0].completions[0].reward_hint) is float


def test_canonical_packb_rejects_things_outside_the_data_model():
    for bad in (math.nan, math.inf, {1: 2}, {b"k": 1}, object(), msgpack.ExtType(1, b"x"), 2**64):
        with pytest.raises((TypeError, ValueError)):
            canonical_packb(bad)
    deep = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(ValueError, match="nesting"):
        canonical_packb(deep)


def test_signature_covers_domain_and_body():
    data = encode()
    outer = strict_unpackb(data)
    from protocol.identity import verify

    assert verify(ALICE.public_bytes, SIGNING_DOMAIN + outer["body"], outer["sig"])
    assert not verify(ALICE.public_bytes, outer["body"], outer["sig"])  # no domain: no signature


# -- rejection reasons ---------------------------------------------------------------------------------


def test_oversize_is_checked_before_decoding():
    with pytest.raises(RecordDecodeError) as e:
        decode_record(b"\xc1" * 2000, max_bytes=1000)
    assert e.value.reason == "oversize"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"\x92\x01",  # truncated array
        msgpack.packb([1, 2]),
        msgpack.packb({"body": b"x", "sig": b"y" * 64, "extra": 1}),
        msgpack.packb({"body": "not-bin", "sig": b"y" * 64}),
        msgpack.packb({"body": b"x", "sig": b"short"}),
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4 billion elements
        b"\xdb\x7f\xff\xff\xff",  # str32 claiming 2 GiB
        msgpack.packb(msgpack.ExtType(5, b"abc")),
        msgpack.packb({1: 2}),
        b"\x91" * 5000,  # nesting bomb
    ],
)
def test_malformed(data):
    assert reason_of(data) == "malformed"


def test_trailing_bytes_are_malformed():
    assert reason_of(encode() + b"\x00") == "malformed"


def test_ext_type_inside_body_is_malformed():
    body = body_of(encode())
    body["created"] = msgpack.ExtType(1, b"\x00" * 8)
    raw = msgpack.packb(dict(sorted(body.items())), use_bin_type=True)
    assert reason_of(wrap_record(raw, ALICE.sign(signing_input(raw)))) == "malformed"


def test_unsorted_keys_are_non_canonical_even_when_signed():
    body = body_of(encode())
    raw = msgpack.packb(dict(reversed(sorted(body.items()))), use_bin_type=True)
    assert reason_of(wrap_record(raw, ALICE.sign(signing_input(raw)))) == "non_canonical"


def test_float32_is_non_canonical():
    body = body_of(encode())
    raw = msgpack.packb(dict(sorted(body.items())), use_bin_type=True, use_single_float=True)
    assert reason_of(wrap_record(raw, ALICE.sign(signing_input(raw)))) == "non_canonical"


def test_non_canonical_outer_map():
    outer = strict_unpackb(encode())
    data = msgpack.packb({"sig": outer["sig"], "body": outer["body"]}, use_bin_type=True)
    assert reason_of(data) == "non_canonical"


def test_unsupported_version():
    body = body_of(encode())
    body["schema_version"] = "2"
    assert reason_of(resign(body)) == "unsupported_version"


def test_unknown_kind():
    body = body_of(encode())
    body["kind"] = "mystery"
    assert reason_of(resign(body)) == "unknown_kind"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.pop("seq"),
        lambda b: b.update(extra=1),
        lambda b: b.update(seq=-1),
        lambda b: b.update(seq=True),
        lambda b: b.update(seq=1.0),
        lambda b: b.update(window="5"),
        lambda b: b.update(created=5),  # int where float64 is required
        lambda b: b.update(swarm=""),
        lambda b: b.update(swarm="x" * 65),
        lambda b: b.update(sender="X" * 32),
        lambda b: b.update(public_key=b"\x00" * 31),
        lambda b: b.update(payload=[1]),
        lambda b: b["payload"].update(model=1),
        lambda b: b["payload"].pop("tokenizer"),
        lambda b: b["payload"]["groups"][0].update(completions=[]),
        lambda b: b["payload"]["groups"][0]["completions"][0].update(finish_reason="bored"),
        lambda b: b["payload"]["groups"][0]["completions"][0].update(n_tokens=-1),
        lambda b: b["payload"]["groups"][0]["completions"][0].update(token_logprobs=[1]),
        lambda b: b["payload"]["groups"][0]["completions"][0].update(reward_hint="1.0"),
        lambda b: b["payload"]["groups"][0]["task"].update(index=-1),
        lambda b: b["payload"]["groups"][0]["task"]["config"].update(bad=[1, 2]),
        lambda b: b["payload"]["groups"][0]["task"].update(family=""),
    ],
)
def test_schema_violations(mutate):
    body = body_of(encode())
    mutate(body)
    assert reason_of(resign(body)) == "schema"


def test_sender_must_be_the_peer_id_of_the_public_key():
    body = body_of(encode())
    body["sender"] = Identity.generate().peer_id
    with pytest.raises(RecordSignatureError) as e:
        decode_record(resign(body))
    assert e.value.reason == "sender_mismatch"


def test_bad_signature_when_signed_by_another_key():
    body = body_of(encode())
    data = resign(body, ident=Identity.generate())
    assert reason_of(data) == "bad_signature"


def test_tampered_payload_fails_signature():
    body = body_of(encode())
    outer = strict_unpackb(encode())
    body["payload"]["groups"][0]["completions"][0]["reward_hint"] = 1.0
    body["payload"]["groups"][0]["completions"][1]["reward_hint"] = 1.0
    raw = canonical_packb(body)
    assert reason_of(wrap_record(raw, outer["sig"])) == "bad_signature"


def test_sign_body_builds_valid_records():
    assert decode_record(sign_body(ALICE, body_of(encode()))).payload == make_batch()


# -- encode-side checks --------------------------------------------------------------------------------


def test_encode_refuses_what_peers_would_reject():
    with pytest.raises(EncodeError, match="unknown record kind"):
        encode(kind="nope")
    with pytest.raises(EncodeError):
        encode(payload="not a batch")
    with pytest.raises(EncodeError):
        encode(seq=-5)
    bad = RolloutBatch("m", 0, "t", (Group(TaskRef("f"), (Completion("x", 1, finish_reason="??"),)),))
    with pytest.raises(EncodeError, match="finish_reason"):
        encode(bad)
    nan = RolloutBatch("m", 0, "t", (Group(TaskRef("f"), (Completion("x", 1, reward_hint=math.nan),)),))
    with pytest.raises(EncodeError):
        encode(nan)


def test_encode_enforces_max_bytes():
    big = make_batch(n_groups=20, n_comp=20)
    with pytest.raises(EncodeError, match="max_bytes"):
        encode(big, max_bytes=4096)


# -- registry ------------------------------------------------------------------------------------------


def test_register_another_kind():
    def enc(scores: dict) -> dict:
        return {"scores": [float(x) for x in scores["scores"]], "note": str(scores["note"])}

    def dec(m):
        expect_map(m, "payload", ("note", "scores"))
        return {
            "scores": [expect_float(x, "score") for x in expect_list(m["scores"], "scores", max_len=100)],
            "note": expect_str(m["note"], "note", max_len=10),
        }

    kind = register_kind(RecordKind("test_scores", enc, dec, dict))
    try:
        assert "test_scores" in registered_kinds() and get_kind("test_scores") is kind
        env = decode_record(encode({"scores": [1, 2.5], "note": "hi"}, kind="test_scores"))
        assert env.payload == {"scores": [1.0, 2.5], "note": "hi"}
        with pytest.raises(ValueError, match="already registered"):
            register_kind(RecordKind("test_scores", enc, lambda m: m))
        body = body_of(encode({"scores": [1], "note": "hi"}, kind="test_scores"))
        body["payload"]["note"] = "x" * 11
        assert reason_of(resign(body)) == "schema"
    finally:
        from protocol import kinds

        kinds._KINDS.pop("test_scores", None)


def test_kind_names_are_checked():
    with pytest.raises(ValueError):
        register_kind(RecordKind("Bad Name", lambda p: {}, lambda m: m))


# -- seq and windows -----------------------------------------------------------------------------------


def test_sequence_counter_is_strictly_increasing_even_if_the_clock_stalls_or_goes_back():
    t = [1000.0]
    seq = SequenceCounter(clock=lambda: t[0])
    values = [seq.next() for _ in range(5)]
    t[0] = 999.0
    values += [seq.next() for _ in range(3)]
    assert values == sorted(set(values)) and values[0] == 1_000_000


def test_sequence_counter_survives_a_restart_without_state():
    t = [1000.0]
    first = SequenceCounter(clock=lambda: t[0])
    last = max(first.next() for _ in range(50))
    t[0] = 1000.2  # restart 200 ms later
    assert SequenceCounter(clock=lambda: t[0]).next() > last


def test_window_of():
    assert window_of(0, 15) == 0 and window_of(14.999, 15) == 0 and window_of(15, 15) == 1
    assert window_of(1_700_000_007.5, 15) == 113_333_333


# -- the test vector in SPEC.md ------------------------------------------------------------------------


def spec_vector() -> bytes:
    m = re.search(r"<!-- test-vector -->\s*```\s*([0-9a-f\s]+?)```", SPEC.read_text())
    assert m, "SPEC.md lost its test vector"
    return bytes.fromhex("".join(m.group(1).split()))


def vector_record() -> bytes:
    batch = RolloutBatch(
        model="builtin:tiny",
        policy_version=3,
        tokenizer="tok-1",
        groups=(
            Group(
                TaskRef("chain_sum", {"max_terms": 2}, seed=0, index=42),
                (
                    Completion("4", 2, "stop", 3, -0.5, None, 1.0),
                    Completion("5", 2, "length", 3, None, None, 0.0),
                ),
            ),
        ),
    )
    return encode_record(
        ALICE,
        kind="rollouts",
        swarm="spec",
        seq=1_700_000_000_000,
        window=113_333_333,
        created=1_700_000_000.0,
        payload=batch,
    )


def test_spec_test_vector_matches_the_implementation():
    data = spec_vector()
    assert data == vector_record()
    env = decode_record(data)
    assert env.sender == ALICE.peer_id and env.swarm == "spec" and env.window == 113_333_333


# -- the completion decoder's fast path ---------------------------------------------------------------------


def test_completion_fast_path_builds_what_the_checked_path_builds():
    import random as _random

    from protocol.kinds import _checked_completion, completion_from_wire, completion_to_wire

    rng = _random.Random(7)
    for _ in range(300):
        c = Completion(
            text="".join(rng.choice("ab<>/ \u00e9\u4e2d") for _ in range(rng.randrange(0, 40))),
            n_tokens=rng.randrange(0, 1000),
            finish_reason=rng.choice(["stop", "length", "abort"]),
            policy_version=rng.randrange(0, 2**40),
            logprob_mean=rng.choice([None, -rng.random() * 5]),
            reward_hint=rng.choice([None, 0.0, 1.0, rng.random()]),
        )
        wire = completion_to_wire(c)
        assert completion_from_wire(wire) == _checked_completion(wire, "c") == c


@pytest.mark.parametrize(
    "field, value",
    [
        ("text", 3),
        ("n_tokens", -1),
        ("n_tokens", True),
        ("finish_reason", "done"),
        ("policy_version", 1.0),
        ("logprob_mean", float("nan")),
        ("reward_hint", 1),
    ],
)
def test_completion_fast_path_refuses_what_the_checked_path_refuses(field, value):
    from protocol.kinds import completion_from_wire, completion_to_wire

    wire = completion_to_wire(Completion(text="x", n_tokens=1))
    wire[field] = value
    with pytest.raises(RecordDecodeError) as e:
        completion_from_wire(wire)
    assert e.value.reason == "schema" and field in str(e.value)


def test_depth_limit_holds_maps_and_arrays_only_and_encoder_and_decoder_agree():
    """SPEC 2 rule 6: a map or array may sit at depth 16 (the top level is 0); a scalar inside it (depth 17) is
    fine; a map or array at depth 17 is not. The encoder refuses exactly what the decoder refuses."""
    from protocol.codec import require_canonical

    def nested(n: int, inner: object) -> object:
        for _ in range(n):
            inner = [inner]
        return inner

    for inner in (0, "s", None, 1.5):
        ok = nested(17, inner)  # arrays at depths 0..16, the scalar at 17
        data = canonical_packb(ok)
        require_canonical(strict_unpackb(data), data, "value")
    for inner in ([], {}):
        too_deep = nested(17, inner)  # the innermost container at depth 17
        with pytest.raises(ValueError):
            canonical_packb(too_deep)
        raw = msgpack.packb(too_deep)
        with pytest.raises(RecordDecodeError) as e:
            require_canonical(strict_unpackb(raw), raw, "value")
        assert e.value.reason == "malformed"

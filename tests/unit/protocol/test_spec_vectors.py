"""Every value a client derives (SPEC.md section 12) matches the code: digest, keys, DHT ids, shards, index entry."""

import hashlib
import re
import sys
from pathlib import Path

import msgpack
import pytest

from protocol.codec import RecordDecodeError, RecordSignatureError, canonical_packb, strict_unpackb
from protocol.identity import Identity
from protocol.layout import (
    INDEX_DOMAIN,
    UNSTAMPED_RANK,
    decode_index_entry,
    encode_index_entry,
    mint_work,
    peer_key,
    record_digest_hex,
    record_key,
    shard_admit,
    shard_hash,
    shard_key,
    shard_of,
    work_bits,
    work_hash,
    work_rank,
)
from protocol.records import decode_record, sign_body, signing_input, wrap_record
from protocol.types import TaskRef

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from tests.unit.protocol.test_records import vector_record  # noqa: E402

SPEC = ROOT / "protocol" / "SPEC.md"
ALICE = Identity.from_private_bytes(bytes(range(32)))
WINDOW = 113_333_333


def dht_id(key: str) -> str:
    """SPEC.md 9: SHA-1 of the MessagePack str encoding of the key."""
    return hashlib.sha1(msgpack.packb(key, use_bin_type=True)).hexdigest()


def _reason(decode, data: bytes) -> str:
    """What a decoder makes of ``data``: ``accepted`` or the rejection reason (SPEC 6)."""
    try:
        decode(data)
    except (RecordDecodeError, RecordSignatureError) as e:
        return e.reason
    return "accepted"


def _nested(n: int) -> object:
    """``n`` arrays nested in each other around the int 0."""
    value: object = 0
    for _ in range(n):
        value = [value]
    return value


def _sign_unchecked(body_map: dict) -> bytes:
    """A record of ``body_map`` packed with sorted keys but without the encoder's data-model checks (which refuse
    what receivers refuse)."""
    body = msgpack.packb(dict(sorted(body_map.items())), use_bin_type=True)
    return wrap_record(body, ALICE.sign(signing_input(body)))


def record_reasons() -> dict[str, str]:
    """SPEC 2, 3, 6: the reasons for the vector record's body changed as each vector's name says, re-signed."""
    outer = strict_unpackb(vector_record())
    body = strict_unpackb(outer["body"])
    not_a_map = canonical_packb([1])
    return {
        # "x" sits at depth 1 of the body, so 16 nested arrays reach depth 16 (allowed: the unknown key is "schema")
        "reason_depth_16_array": _reason(decode_record, sign_body(ALICE, {**body, "x": _nested(16)})),
        "reason_depth_17_array": _reason(decode_record, _sign_unchecked({**body, "x": _nested(17)})),
        "reason_body_without_schema_version": _reason(
            decode_record, sign_body(ALICE, {k: v for k, v in body.items() if k != "schema_version"})
        ),
        "reason_body_not_a_map": _reason(decode_record, wrap_record(not_a_map, ALICE.sign(signing_input(not_a_map)))),
    }


def _entry(**changes: object) -> bytes:
    """The vector index entry with body keys changed (None removes one), re-signed."""
    digest = record_digest_hex(vector_record())
    body = strict_unpackb(strict_unpackb(encode_index_entry(ALICE, "spec", WINDOW, [digest]))["body"])
    for k, v in changes.items():
        if v is None:
            body.pop(k, None)
        else:
            body[k] = v
    data = canonical_packb(body)
    return canonical_packb({"body": data, "sig": ALICE.sign(INDEX_DOMAIN + data)})


def _entry_with_nil_work() -> bytes:
    """The vector index entry with ``work: nil`` (``_entry`` takes None as "remove the key")."""
    body = strict_unpackb(strict_unpackb(_entry())["body"])
    data = canonical_packb({**body, "work": None})
    return canonical_packb({"body": data, "sig": ALICE.sign(INDEX_DOMAIN + data)})


def index_reasons() -> dict[str, str]:
    """SPEC 7.4, 15: index entry sender and version rules."""
    versions = ["2.0", "02.00", "2.9999", "2.1", "2.10000", "2", "2.0.0", "\u0662.\u0660", "3.0", "1.x", "1.1"]
    return {
        "index_sender_uppercase": _reason(decode_index_entry, _entry(sender=ALICE.peer_id.upper())),
        "index_versions": ",".join(f"{v}:{_reason(decode_index_entry, _entry(version=v))}" for v in versions),
        "index_without_version": _reason(decode_index_entry, _entry(version=None)),
    }


def work_vectors() -> dict[str, str]:
    """SPEC 7.4: the work stamp of the vector sender's entry, and the retention rule of a full shard key."""
    digest = record_digest_hex(vector_record())
    nonce = mint_work("spec", WINDOW, ALICE.peer_id, 12)
    a, b, c = "a" * 32, "b" * 32, "c" * 32
    stamped, better = 1 << 240, 1 << 230  # 16 and 26 leading zero bits

    def admit(held: dict[str, int], sender: str, rank: int) -> str:
        ok, evict = shard_admit(held, sender, rank, capacity=2)
        return ("accepted" if evict is None else f"evicts {evict[:4]}") if ok else "refused"

    return {
        "work_hash_nonce_0": work_hash("spec", WINDOW, ALICE.peer_id, 0).hex(),
        "work_nonce_12_bits": str(nonce),
        "work_bits_of_that_nonce": str(work_bits(work_rank("spec", WINDOW, ALICE.peer_id, nonce))),
        "index_entry_stamped": encode_index_entry(ALICE, "spec", WINDOW, [digest], work=nonce).hex(),
        "index_work_in_a_2_0_entry": _reason(decode_index_entry, _entry(version="2.0", work=nonce)),
        "index_work_negative": _reason(decode_index_entry, _entry(work=-1)),
        "index_work_nil": _reason(decode_index_entry, _entry_with_nil_work()),
        "index_work_bad_in_a_2_9_entry": _reason(decode_index_entry, _entry(version="2.9", work="x")),
        "shard_admit_room": admit({a: UNSTAMPED_RANK}, b, UNSTAMPED_RANK),
        "shard_admit_update_in_place": admit({a: UNSTAMPED_RANK, b: UNSTAMPED_RANK}, a, UNSTAMPED_RANK),
        "shard_admit_full_unstamped": admit({a: UNSTAMPED_RANK, b: stamped}, c, UNSTAMPED_RANK),
        "shard_admit_full_stamped": admit({a: UNSTAMPED_RANK, b: stamped}, c, stamped + 1),
        "shard_admit_full_of_stamped_worse": admit({a: better, b: stamped}, c, stamped + 1),
        "shard_admit_full_of_stamped_better": admit({a: better, b: stamped}, c, stamped - 1),
        "shard_admit_full_of_unstamped_tie": admit({a: UNSTAMPED_RANK, b: UNSTAMPED_RANK}, c, UNSTAMPED_RANK),
        "shard_admit_full_of_unstamped_free_work": admit(
            {a: UNSTAMPED_RANK, b: UNSTAMPED_RANK}, c, work_rank("spec", WINDOW, c, 0, 12)
        ),
    }


def store_reasons() -> dict[str, str]:
    """SPEC 9: what the hivemind store-time guard makes of values under keys (no clock hook: windows unchecked)."""
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import get_dht_time

    from protocol.transport.hivemind.guard import NO_SUBKEY, DHTRecordGuard, key_id

    data = vector_record()
    rkey = key_id(record_key("spec", WINDOW, ALICE.peer_id, record_digest_hex(data)))
    skey = key_id(shard_key("spec", WINDOW, 3, shard_of(WINDOW, ALICE.peer_id, 3, 4)))
    subkey = msgpack.packb(ALICE.peer_id, use_bin_type=True)
    soon, far = get_dht_time() + 60, get_dht_time() + 3600
    value = msgpack.packb(data, use_bin_type=True)

    def verdict(key: bytes, sub: bytes, expiration: float, max_bytes: int) -> str:
        guard = DHTRecordGuard("spec", max_bytes=max_bytes, max_ttl_s=600)
        return guard.check(DHTRecord(key, sub, value, expiration)) or "accepted"

    n = len(data)
    return {
        "store_record_max_bytes": verdict(rkey, NO_SUBKEY, soon, n),
        "store_record_max_plus_1": verdict(rkey, NO_SUBKEY, soon, n - 1),
        "store_record_max_plus_1_expiring_too_far": verdict(rkey, NO_SUBKEY, far, n - 1),
        "store_record_under_peer_key": verdict(key_id(peer_key("spec", WINDOW, ALICE.peer_id)), NO_SUBKEY, soon, n),
        "store_record_under_shard_key": verdict(skey, subkey, soon, n),
    }


def derived() -> dict[str, str]:
    data = vector_record()
    digest = record_digest_hex(data)
    rkey = record_key("spec", WINDOW, ALICE.peer_id, digest)
    pkey = peer_key("spec", WINDOW, ALICE.peer_id)
    skey = shard_key("spec", WINDOW, 3, shard_of(WINDOW, ALICE.peer_id, 3, 4))
    out = {
        "record_sha256": hashlib.sha256(data).hexdigest(),
        "digest": digest,
        "record_key": rkey,
        "record_key_dht_id": dht_id(rkey),
        "peer_key": pkey,
        "peer_key_dht_id": dht_id(pkey),
        "shard_hash": f"{shard_hash(WINDOW, ALICE.peer_id):016x}",
        "shards_levels_0_to_6": ",".join(str(shard_of(WINDOW, ALICE.peer_id, lv, 4)) for lv in range(7)),
        "shard_key_level_3": skey,
        "shard_key_level_3_dht_id": dht_id(skey),
        "shard_subkey_bytes": msgpack.packb(ALICE.peer_id, use_bin_type=True).hex(),
        "index_entry": encode_index_entry(ALICE, "spec", WINDOW, [digest]).hex(),
        "taskref_key": TaskRef("chain_sum", {"max_terms": 2, "b": "x y", "a": 1.5}, seed=0, index=42).key(),
        "taskref_key_escapes": TaskRef(
            "chain_sum",
            {"max_terms": 2, "big": 1e16, "small": 1e-05, "half": 0.5, "neg": -3, "off": None, "on": True, "é": 'ü\n"'},
            seed=7,
            index=0,
        ).key(),
        "taskref_key_edges": TaskRef(
            "chain_sum", {"del": "\x7f", "zero": 0.0, "negzero": -0.0, "edge": 1e-4, "under": 9e-05}, seed=0, index=0
        ).key(),
        **record_reasons(),
        **index_reasons(),
        **work_vectors(),
        **store_reasons(),
    }
    return out


def spec_vectors() -> dict[str, str]:
    m = re.search(r"<!-- derived-vectors -->\s*```\s*(.+?)```", SPEC.read_text(), re.S)
    assert m, "SPEC.md lost its derived test vectors"
    out = {}
    for line in m.group(1).strip().splitlines():
        name, _, value = line.partition(" = ")
        out[name.strip()] = out.get(name.strip(), "") + value.strip()
    return out


@pytest.mark.parametrize("name", sorted(derived()))
def test_spec_vector(name):
    assert spec_vectors()[name] == derived()[name]


def test_dht_ids_are_what_hivemind_computes():
    from hivemind.dht.routing import DHTID

    for key in (derived()["record_key"], derived()["peer_key"], derived()["shard_key_level_3"]):
        assert DHTID.generate(source=key).to_bytes().hex() == dht_id(key)


def test_every_vector_is_checked():
    assert set(spec_vectors()) == set(derived())


def spec_json_vectors(tag: str) -> list[dict]:
    """The JSON lines of the SPEC.md block after ``<!-- tag -->``."""
    import json

    m = re.search(r"<!-- " + re.escape(tag) + r" -->\s*```\s*(.+?)```", SPEC.read_text(), re.S)
    assert m, f"SPEC.md lost its {tag}"
    return [json.loads(line) for line in m.group(1).strip().splitlines()]


def test_answer_vectors():
    """SPEC.md 13: the answer a client extracts from each completion, nested and unclosed tags included."""
    from node.tasks import extract_answer

    vectors = spec_json_vectors("answer-vectors")
    assert any(v["completion"] == "<answer>dar<answer>ro</answer>" for v in vectors)
    for v in vectors:
        assert extract_answer(v["completion"]) == v["answer"], v


def test_split_vectors():
    """SPEC.md 13: each question's split key, its 64-bit hash (recomputed here from the preimage rule) and its side
    at test_fraction 0.1, dev_fraction 0.1; the vectors cover every side, sign-folding twins, one problem in two
    families and a non-arithmetic family."""
    from node.config import TaskConfig
    from node.tasks import split_key, split_side

    vectors = spec_json_vectors("split-vectors")
    assert {v["side"] for v in vectors} == {"train", "dev", "test"}
    shares = TaskConfig(test_fraction=0.1, dev_fraction=0.1)
    for v in vectors:
        assert split_key(v["family"], v["question"]) == v["key"], v
        key = v["key"].encode()
        name = v["family"].partition("@")[0]  # the split hashes the family's name, never its version
        preimage = key if v["key"].startswith("expr:") else name.encode() + b"\0" + key
        digest = hashlib.sha256(preimage).digest()
        assert digest[:8].hex() == v["hash64"], v
        h = int(v["hash64"], 16)
        side = "test" if h < 0.1 * 2**64 else "dev" if h < (0.1 + 0.1) * 2**64 else "train"
        assert side == v["side"], v
        assert split_side(v["family"], v["question"], shares) == v["side"], v
    by_key: dict[str, set[str]] = {}
    for v in vectors:
        by_key.setdefault(v["key"], set()).add(v["family"])
    assert any({"chain_sum", "basic_arithmetic"} <= families for families in by_key.values())  # cross-family
    assert any(not v["key"].startswith("expr:") for v in vectors)
    assert any("@" in v["family"] for v in vectors)  # a versioned family: hashed by its name
    # an empty text is not a letter_counting word key: the question text is
    assert any(v["family"] == "letter_counting" and v["key"] == v["question"] for v in vectors)


class _Echo:
    """A versioned family ``echo`` in version ``1``, as a plug-in would register it."""

    name, version = "echo", "1"

    def generate(self, config, seed, index):
        return {"question": f"Echo {index}.", "answer": str(index), "metadata": {}}

    def score(self, item, completion):
        return 0.0


def test_family_vectors(monkeypatch):
    """SPEC.md 13: the reason a receiver gives for each family string, malformed ``name@version`` strings included."""
    from node.config import TaskConfig
    from node.tasks import TaskError, TaskSource, registry

    monkeypatch.setitem(registry._RESOLVED, "echo", _Echo())
    src = TaskSource(TaskConfig(families=[{"name": "chain_sum"}, {"name": "echo"}]))
    vectors = spec_json_vectors("family-vectors")
    assert {v["reason"] for v in vectors} == {None, "task_version", "task_unknown", "task_rejected"}
    for v in vectors:
        ref = TaskRef(family=v["family"], seed=0, index=1)
        if v["reason"] is None:
            assert src.accepts(ref), v
            continue
        with pytest.raises(TaskError) as e:
            src.materialize(ref)
        assert e.value.reason == v["reason"], v


def test_every_builtin_family_has_one_index_range():
    """SPEC.md 13: items 0 <= index < size, size the config's ``size`` or 10^9, for reasoning-gym and laboratory
    families alike; the laboratory datasets made without ``size`` have the same range (they had 500)."""
    import reasoning_gym

    from node.config import TaskConfig
    from node.tasks import TaskError, TaskSource

    for name in ("lab_add", "lab_sub", "chain_sum"):
        src = TaskSource(TaskConfig(families=[{"name": name}]))
        assert src.materialize(TaskRef(family=name, seed=0, index=10**9 - 1)).question
        for bad in (TaskRef(family=name, seed=0, index=10**9), TaskRef(family=name, seed=-1, index=0)):
            with pytest.raises(TaskError) as e:
                src.materialize(bad)
            assert e.value.reason == "task_rejected"
        small = TaskSource(TaskConfig(families=[{"name": name, "config": {"size": 20}}]))
        with pytest.raises(TaskError):
            small.materialize(TaskRef(family=name, config={"size": 20}, seed=0, index=20))
    for name in ("lab_add", "lab_sub"):
        assert reasoning_gym.create_dataset(name, seed=0).size == 10**9


def test_lab_vectors():
    """SPEC.md 13: the laboratory families regenerate each item (question, gold answer) from its ref, and the
    reference trace writer writes the trace shown."""
    from node.arith import write_trace
    from node.config import TaskConfig, TaskFamily
    from node.tasks import TaskSource
    from protocol.types import TaskRef

    vectors = spec_json_vectors("lab-vectors")
    assert {v["family"] for v in vectors} == {"lab_add", "lab_sub"}
    steps = [line for v in vectors if v["family"] == "lab_sub" for line in v["trace"].split("\n")[1:]]
    assert any("=-" in line for line in steps), "no borrow in the lab_sub vectors"
    assert any("=-10 " in line for line in steps), "no column of 0 - 9 - 1"
    assert any(line.split(" r")[-1].split("<")[0].startswith("0") for line in steps), "no leading zero in a result"
    for v in vectors:
        src = TaskSource(TaskConfig(families=[TaskFamily(name=v["family"], config=v["config"])]))
        item = src.materialize(TaskRef(family=v["family"], config=v["config"], seed=v["seed"], index=v["index"]))
        assert (item.question, item.answer) == (v["question"], v["answer"]), v
        assert write_trace(item.metadata["terms"], item.metadata["op"]) == v["trace"], v


if __name__ == "__main__":
    for k, v in derived().items():
        for i in range(0, len(v), 96):
            print(f"{k} = {v[i : i + 96]}")

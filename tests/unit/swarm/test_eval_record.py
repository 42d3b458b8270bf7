"""The ``eval`` record kind: round trip through a signed record, schema bounds, and the observer shows it."""

from __future__ import annotations

import pytest

from protocol.errors import DecodeError
from protocol.identity import Identity
from protocol.records import decode_record, encode_record
from swarm.evals import EvalSummary, eval_from_wire, eval_to_wire
from tests.unit.node.test_observer import NOW, NOW_W, make_observer

LINE = {
    "step": 40,
    "accuracy": 0.375,
    "greedy_accuracy": 0.5,
    "families": {
        "chain_sum": {"accuracy": 0.375, "greedy_accuracy": 0.5, "format_rate": 0.9, "mean_length": 12.5, "n": 64}
    },
    "time": 1.0,
}


def test_eval_summary_round_trips_through_a_signed_record():
    ident = Identity.from_private_bytes(b"\x07" * 32)
    summary = EvalSummary.from_eval_line(LINE, model="builtin:tiny", policy_version=40)
    data = encode_record(
        ident, kind="eval", swarm="s", seq=1, window=NOW_W, created=NOW, payload=summary, max_bytes=1 << 20
    )
    env = decode_record(data)
    assert env.kind == "eval" and env.payload == summary
    assert env.payload.to_dict()["families"]["chain_sum"]["n"] == 64

    obs = make_observer()
    assert obs.feed(data) is not None
    peer = obs.state()["peers"][0]
    assert peer["eval"]["accuracy"] == 0.375 and peer["eval"]["step"] == 40 and peer["kinds"] == {"eval": 1}


@pytest.mark.parametrize(
    "mutate",
    [
        lambda m: m.update(accuracy=1.5),
        lambda m: m.update(accuracy=1),
        lambda m: m.update(extra=1),
        lambda m: m["families"]["chain_sum"].update(n=-1),
        lambda m: m["families"]["chain_sum"].pop("format_rate"),
        lambda m: m.update(families={f"f{i}": m["families"]["chain_sum"] for i in range(65)}),
    ],
)
def test_eval_schema_rejects_out_of_bounds(mutate):
    m = eval_to_wire(EvalSummary.from_eval_line(LINE, model="m", policy_version=1))
    mutate(m)
    with pytest.raises(DecodeError):
        eval_from_wire(m)

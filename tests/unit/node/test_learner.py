"""node.learn.learner on a tiny randomly initialised Qwen2 model (no downloads)."""

import copy
import dataclasses
import math
from unittest import mock

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from node.config import LearnerConfig
from node.learn.learner import Learner, TrainSample, by_length, completion_logprobs

PAD = 0


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg)


def samples(n: int = 6, seed: int = 1) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = int(torch.randint(1, 6, (1,), generator=g))
        c = int(torch.randint(1, 8, (1,), generator=g))
        out.append(
            TrainSample(
                torch.randint(2, 100, (p,), generator=g).tolist(),
                torch.randint(2, 100, (c,), generator=g).tolist(),
                advantage=float(torch.randn(1, generator=g)),
            )
        )
    return out


def learner(model, **cfg) -> Learner:
    return Learner(model, LearnerConfig(**cfg), device="cpu", pad_token_id=PAD, max_tokens=8)


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_completion_logprobs_match_naive_loop():
    model = tiny_model()
    batch = samples(4)
    lrn = learner(model)
    b = lrn._collate(batch)
    logp = completion_logprobs(model, b.input_ids, b.attention_mask, b.prompt_lens, b.completion_lens)
    for i, s in enumerate(batch):
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        full = model(input_ids=ids).logits.log_softmax(-1)[0]
        p = len(s.prompt_ids)
        for j, tok in enumerate(s.completion_ids):
            assert logp[i, j].item() == pytest.approx(full[p + j - 1, tok].item(), abs=1e-5)
        assert (logp[i, len(s.completion_ids) :] == 0).all()


def test_one_step_changes_parameters_and_bumps_version():
    model = tiny_model()
    lrn = learner(model)
    before = _flat(model).clone()
    metrics = lrn.step(samples())
    assert lrn.policy_version == 1
    assert not torch.equal(before, _flat(model))
    for key in ("loss", "grad_norm", "clip_low_frac", "clip_high_frac", "tokens", "seconds", "tokens_per_s"):
        assert isinstance(metrics[key], float) and math.isfinite(metrics[key])
    assert metrics["is_weight_mean"] == 1.0 and metrics["is_truncated_frac"] == 0.0
    lrn.step(samples(seed=2))
    assert lrn.policy_version == 2


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo"])
def test_micro_batching_gives_the_same_update(loss):
    batch = samples(6)
    results = []
    for mb in (1, 6):
        model = tiny_model()
        lrn = learner(model, loss=loss, micro_batch_size=mb, lr=1e-3)
        totals = lrn.accumulate_gradients(batch)
        grads = torch.cat([p.grad.flatten() for p in lrn.params])
        lrn.optimizer.zero_grad()
        lrn.step(batch)
        results.append((float(totals["loss"]), grads, _flat(model)))
    (l1, g1, p1), (l6, g6, p6) = results
    assert l1 == pytest.approx(l6, abs=1e-6)
    assert torch.allclose(g1, g6, atol=1e-6, rtol=1e-4)
    assert (p1 - p6).abs().max().item() < 1e-5


def test_micro_batches_are_cut_from_rows_sorted_by_length_and_the_order_does_not_change_the_update():
    batch = samples(9, seed=4)
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in batch]
    assert lengths != sorted(lengths)  # the rows as they come are not in order already
    shapes = []
    lrn = learner(tiny_model(), micro_batch_size=3, beta=0.1)
    real = lrn._collate
    lrn._collate = lambda rows: shapes.append([len(r.prompt_ids) + len(r.completion_ids) for r in rows]) or real(rows)
    lrn.accumulate_gradients(batch)
    flat = [n for mb in shapes for n in mb]
    assert flat == sorted(len(s.prompt_ids) + len(s.completion_ids) for s in batch)  # shortest first
    grads, params = [], []
    for sort in (True, False):  # sorted against the rows as they come
        model = tiny_model()
        lrn = learner(model, micro_batch_size=3, lr=1e-3, beta=0.1)
        with mock.patch("node.learn.learner.by_length", side_effect=by_length if sort else list) as spy:
            lrn.accumulate_gradients(list(batch))
            grads.append(torch.cat([p.grad.flatten() for p in lrn.params]))
            lrn.optimizer.zero_grad()
            lrn.step(list(batch))
        assert spy.called
        params.append(_flat(model))
    # the same gradient up to the order of float sums (as micro-batching, above); Adam's step divides by the
    # gradient's own scale, so a parameter with a near-zero gradient moves by up to lr on rounding alone: the
    # parameters are held to the same bound as micro-batching's, not to the last bit
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    assert (params[0] - params[1]).abs().max().item() < 1e-5


def test_kl_reference_only_with_beta():
    assert learner(tiny_model()).ref_model is None
    lrn = learner(tiny_model(), beta=0.1)
    assert lrn.ref_model is not None
    m0 = lrn.step(samples())
    assert m0["kl"] == pytest.approx(0.0, abs=1e-7)  # the policy equals its reference before the first update
    m1 = lrn.step(samples())
    assert m1["kl"] > 0


def _batch_and_logprobs() -> tuple[Learner, list[TrainSample], torch.Tensor]:
    """A learner (IS cap 1) on a fresh tiny model, four samples, and the model's logprobs of them ``(4, T)``."""
    model = tiny_model()
    lrn = learner(model, is_cap=1.0)
    batch = samples(4)
    b = lrn._collate(batch)
    with torch.no_grad():
        logp = completion_logprobs(model, b.input_ids, b.attention_mask, b.prompt_lens, b.completion_lens)
    return lrn, batch, logp


def test_is_weights_applied_to_behaviour_logprobs():
    lrn, batch, logp = _batch_and_logprobs()
    # Local sample 0: behaviour logprobs 1 nat above ours on every token -> w = e^-1.
    s0 = batch[0]
    s0.behaviour_logprobs = [v + 1.0 for v in logp[0, : len(s0.completion_ids)].tolist()]
    # External sample 1 with only a mean hint far below ours -> ratio capped at 1, counted as truncated.
    batch[1].external, batch[1].behaviour_logprob_mean = True, -1e9
    # External sample 2 with a hint 0.5 nat above our mean -> w = e^-0.5 on all its tokens.
    n2 = len(batch[2].completion_ids)
    batch[2].external = True
    batch[2].behaviour_logprob_mean = float(logp[2, :n2].mean()) + 0.5
    # Sample 3: no behaviour information -> weight 1.
    b = lrn._collate(batch)
    w, hits, counted = lrn._is_weights(logp, b)
    n0 = len(s0.completion_ids)
    assert torch.allclose(w[0, :n0], torch.full((n0,), math.exp(-1.0)), atol=1e-5)
    assert torch.allclose(w[1], torch.ones_like(w[1]))
    assert torch.allclose(w[2, :n2], torch.full((n2,), math.exp(-0.5)), atol=1e-5)
    assert torch.allclose(w[3], torch.ones_like(w[3]))
    n1 = len(batch[1].completion_ids)
    assert counted.item() == n0 + n1 + n2 and hits.item() == n1

    # The weights reach the loss: down-weighting every token by e^-1 scales the gradient by e^-1.
    plain = samples(4)
    g_plain = _grad_of(plain)
    weighted = copy.deepcopy(plain)
    for s in weighted:
        s.external = True
        s.behaviour_logprob_mean = 0.0  # claims probability 1: w = exp(mean old logp) < 1
    g_weighted = _grad_of(weighted)
    assert g_weighted.norm() < g_plain.norm()
    metrics = learner(tiny_model()).step(weighted)
    assert metrics["is_weight_mean"] < 1.0


def _grad_of(batch: list[TrainSample]) -> torch.Tensor:
    lrn = learner(tiny_model())
    lrn.accumulate_gradients(batch)
    return torch.cat([p.grad.flatten() for p in lrn.params])


def test_untrusted_hints_are_sanitised():
    lrn = learner(tiny_model())
    batch = samples(3)
    batch[0].external, batch[0].behaviour_logprob_mean = True, float("nan")
    batch[1].external, batch[1].behaviour_logprobs = True, [5.0]  # wrong length for a peer: ignored
    batch[2].external, batch[2].behaviour_logprob_mean = True, 7.0  # positive: clamped to 0
    b = lrn._collate(batch)
    assert not b.has_mean_behaviour[0] and not b.has_token_behaviour[1]
    assert b.behaviour_mean[2].item() == 0.0
    assert math.isfinite(lrn.step(batch)["loss"])
    bad = samples(1)
    bad[0].behaviour_logprobs = [0.0] * (len(bad[0].completion_ids) + 1)
    with pytest.raises(ValueError):
        lrn.step(bad)  # a local rollout with misaligned logprobs is a bug, not a peer's noise
    with pytest.raises(ValueError):
        lrn.step([TrainSample([1, 2], [], 1.0)])


def test_on_policy_float_noise_is_not_counted_as_truncation():
    # Behaviour logprobs equal to the learner's up to float noise (as on a purely on-policy step): a cap of 1
    # changes no weight, so no token may count as truncated; a real gap (2 nats) must count.
    lrn, batch, logp = _batch_and_logprobs()
    g = torch.Generator().manual_seed(0)
    for i, s in enumerate(batch):
        n = len(s.completion_ids)
        s.behaviour_logprobs = (logp[i, :n] + 1e-5 * torch.randn(n, generator=g)).tolist()
    assert lrn.step(copy.deepcopy(batch))["is_truncated_frac"] == 0.0
    batch[0].behaviour_logprobs = [v - 2.0 for v in batch[0].behaviour_logprobs]
    m = learner(tiny_model(), is_cap=1.0).step(batch)
    total = sum(len(s.completion_ids) for s in batch)
    assert m["is_truncated_frac"] == pytest.approx(len(batch[0].completion_ids) / total)


def test_external_token_share_and_weight_are_reported():
    # Two of four samples are a peer's, one with a hint 0.5 nat above our mean (w = e^-0.5), one without (w = 1):
    # the metrics give their share of the tokens and their mean weight, own samples left out of the mean.
    _, batch, logp = _batch_and_logprobs()
    n1, n2 = len(batch[1].completion_ids), len(batch[2].completion_ids)
    batch[1].external, batch[1].behaviour_logprob_mean = True, float(logp[1, :n1].mean()) + 0.5
    batch[2].external = True
    batch[0].behaviour_logprobs = [v + 3.0 for v in logp[0, : len(batch[0].completion_ids)].tolist()]  # own, w < 1
    total = sum(len(s.completion_ids) for s in batch)
    m = learner(tiny_model(), is_cap=1.0).step(batch)
    assert m["external_token_share"] == pytest.approx((n1 + n2) / total)
    assert m["external_is_weight_mean"] == pytest.approx((n1 * math.exp(-0.5) + n2) / (n1 + n2), rel=1e-4)
    own = learner(tiny_model()).step(samples(4))
    assert own["external_token_share"] == 0.0 and own["external_is_weight_mean"] == 0.0


@pytest.mark.parametrize("name", ["mnpo", "dpo"])
def test_preference_step_in_parts_gives_the_whole_batch_update(name):
    """MNPO's loss is a mean over independent pairs: micro-batches of pairs weighted by their share give the update of
    one pass over all pairs (what bounds a pretrained model's memory), with the metrics weighted the same way."""
    from node.learn.losses import dpo_loss, mnpo_loss

    rows = [(s.prompt_ids, s.completion_ids) for s in samples(8)]  # pairs (rows[i], rows[4 + i])
    ref_lrn = learner(tiny_model(seed=3))
    ref = ref_lrn.mean_logprobs(rows)
    fn = (lambda *a: mnpo_loss(*a, eta=0.5, ratio=0.5)) if name == "mnpo" else (lambda *a: dpo_loss(*a, beta=1.0))

    def part(lrn, lo, hi):
        def loss_fn(model):
            sel = rows[lo:hi] + rows[4 + lo : 4 + hi]
            player = lrn.mean_logprobs(sel, model=model, grad=True)
            n = hi - lo
            return fn(player[:n], player[n:], ref[lo:hi], ref[4 + lo : 4 + hi])

        return loss_fn

    results = []
    for bounds in ([(0, 4)], [(0, 1), (1, 3), (3, 4)]):
        model = tiny_model()
        lrn = learner(model, lr=1e-3)
        out = lrn.preference_step([((hi - lo) / 4, part(lrn, lo, hi)) for lo, hi in bounds])
        results.append((out, _flat(model)))
        assert lrn.policy_version == 1
    (whole, p1), (parts, p3) = results
    assert whole["loss"] == pytest.approx(parts["loss"], abs=1e-6)
    assert whole["grad_norm"] == pytest.approx(parts["grad_norm"], rel=1e-4)
    assert whole["pref_acc"] == pytest.approx(parts["pref_acc"], abs=1e-6)
    assert (p1 - p3).abs().max().item() < 1e-6 and (p1 - _flat(tiny_model())).abs().max().item() > 1e-5
    with pytest.raises(ValueError, match="at least one part"):
        learner(tiny_model()).preference_step([])


def test_guided_rows_ignore_importance_weights_and_report_per_family():
    # A peer's row with a hint far above our logprobs: under the surrogate its weight is tiny; marked guided the
    # hint is ignored (weight 1). The per-family diagnostics count the peers' completions and tokens and read the
    # receiver's mean logprob of them.
    _, batch, logp = _batch_and_logprobs()
    n1, n2 = len(batch[1].completion_ids), len(batch[2].completion_ids)
    for i, fam in ((1, "lab_sub"), (2, "lab_add")):
        batch[i].external, batch[i].family, batch[i].behaviour_logprob_mean = True, fam, 0.0
    surrogate = learner(tiny_model()).step(copy.deepcopy(batch))
    assert surrogate["peer_is_weight_lab_sub"] == pytest.approx(math.exp(float(logp[1, :n1].mean())), rel=1e-4)
    assert surrogate["peer_weight_low_frac_lab_sub"] == 1.0  # exp(mean logp of a random model) < 1/2
    assert surrogate["peer_shaping_weight_lab_sub"] == 0.0
    batch[1].guided = True
    guided = learner(tiny_model()).step(copy.deepcopy(batch))
    assert guided["peer_is_weight_lab_sub"] == 1.0 and guided["peer_weight_low_frac_lab_sub"] == 0.0
    assert guided["peer_completions_lab_sub"] == 1.0 and guided["peer_tokens_lab_sub"] == n1
    assert guided["peer_logp_lab_sub"] == pytest.approx(float(logp[1, :n1].mean()), rel=1e-4)
    p = logp[1, :n1].exp()
    assert guided["peer_shaping_weight_lab_sub"] == pytest.approx(float((0.1 * p / (p + 0.1) ** 2).mean()), rel=1e-4)
    assert guided["peer_tokens_lab_add"] == n2 and guided["peer_is_weight_lab_add"] < 1.0  # still the surrogate
    # The guided row's gradient differs from the surrogate's; the trace weight k scales exactly that row's term.
    assert guided["loss"] != pytest.approx(surrogate["loss"])
    only = [copy.deepcopy(batch[1])]
    g1 = _grad_of(only)
    lrn3 = learner(tiny_model(), guidance_weight=3.0)
    lrn3.accumulate_gradients(copy.deepcopy(only))
    g3 = torch.cat([q.grad.flatten() for q in lrn3.params])
    assert (g3 - 3.0 * g1).abs().max() <= 1e-5 * g1.abs().max()


def _trace_rows(n: int = 4, seed: int = 7) -> list[TrainSample]:
    return [dataclasses.replace(s, external=True, trace=True) for s in samples(n, seed)]


def test_the_trace_step_imitates_only_trace_rows_with_its_own_optimizer():
    own, traces = samples(6), _trace_rows()
    base = learner(tiny_model(), lr=1e-3)
    with_trace = learner(tiny_model(), lr=1e-3, trace_lr=1e-2)
    assert base.trace_optimizer is None and with_trace.trace_optimizer is not with_trace.optimizer
    rows = [(s.prompt_ids, s.completion_ids) for s in traces]
    m_base, m = base.step(own + traces), with_trace.step(own + traces)
    assert "trace_rows" not in m_base
    assert m["trace_rows"] == 4 and m["trace_tokens"] == sum(len(s.completion_ids) for s in traces)
    assert m["trace_nll"] > 0 and m["trace_grad_norm"] > 0
    assert with_trace.policy_version == base.policy_version == 1  # one policy version a step
    for _ in range(4):
        base.step(own + traces)
        with_trace.step(own + traces)
    assert float(with_trace.mean_logprobs(rows).mean()) > float(base.mean_logprobs(rows).mean()) + 0.5
    # a step without trace rows leaves the trace optimizer's state where it was
    state = copy.deepcopy(with_trace.trace_optimizer.state_dict()["state"])
    m = with_trace.step(own)
    assert m["trace_rows"] == 0 and m["trace_nll"] == 0.0
    after = with_trace.trace_optimizer.state_dict()["state"]
    assert all(torch.equal(state[i]["exp_avg"], after[i]["exp_avg"]) for i in state)


def test_the_trace_step_is_the_token_mean_nll_of_its_rows_whatever_the_micro_batch():
    traces = _trace_rows(5)
    a = learner(tiny_model(), lr=1e-3, trace_lr=1e-2, micro_batch_size=2)
    b = learner(tiny_model(), lr=1e-3, trace_lr=1e-2, micro_batch_size=32)
    ma, mb = a.trace_step(traces), b.trace_step(traces)
    assert ma["trace_nll"] == pytest.approx(mb["trace_nll"], rel=1e-5)
    assert ma["trace_grad_norm"] == pytest.approx(mb["trace_grad_norm"], rel=1e-4)
    rows = [(s.prompt_ids, s.completion_ids) for s in traces]
    lens = torch.tensor([len(s.completion_ids) for s in traces], dtype=torch.float32)
    fresh = learner(tiny_model(), lr=1e-3)
    expected = -float((fresh.mean_logprobs(rows) * lens).sum() / lens.sum())
    assert ma["trace_nll"] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(RuntimeError, match="trace step is off"):
        fresh.trace_step(traces)


def test_completion_kl_is_the_full_vocabulary_kl_from_the_reference_at_each_completion_state():
    from node.learn.learner import completion_kl

    model, ref = tiny_model(0), tiny_model(3)
    rows = samples(3)
    b = learner(model)._collate(rows)
    kl = completion_kl(model, ref, b.input_ids, b.attention_mask, b.prompt_lens, b.completion_lens)
    for i, s in enumerate(rows):  # by hand: each row alone, every completion state's next-token distributions
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        lp, lq = model(input_ids=ids).logits[0].log_softmax(-1), ref(input_ids=ids).logits[0].log_softmax(-1)
        for j in range(len(s.completion_ids)):
            t = len(s.prompt_ids) - 1 + j  # the position that predicts completion token j
            want = float((lq[t].exp() * (lq[t] - lp[t])).sum())
            assert float(kl[i, j]) == pytest.approx(want, rel=1e-4, abs=1e-6)
        assert float(kl[i, len(s.completion_ids) :].abs().sum()) == 0.0
    same = completion_kl(model, model, b.input_ids, b.attention_mask, b.prompt_lens, b.completion_lens)
    assert float(same.abs().max()) < 1e-5


def test_the_trace_anchor_holds_the_right_own_completions_states_while_the_traces_are_learnt():
    own = [dataclasses.replace(s, right=True) for s in samples(6)]
    traces = _trace_rows()
    free = learner(tiny_model(), lr=1e-6, trace_lr=1e-2)
    held = learner(tiny_model(), lr=1e-6, trace_lr=1e-2, trace_anchor=1.0)
    assert free.ref_model is None and held.ref_model is not None  # the anchor keeps the initial policy
    for _ in range(6):
        m_free, m_held = free.step(own + traces), held.step(own + traces)
    assert m_held["trace_anchor_rows"] == 36 and m_held["trace_anchor_kl"] > 0 and "trace_anchor_kl" not in m_free
    b = held._collate(own)
    args = (b.input_ids, b.attention_mask, b.prompt_lens, b.completion_lens)
    with torch.no_grad():
        drift = {n: float(_kl_mean(lrn.model, held.ref_model, b, args)) for n, lrn in (("free", free), ("held", held))}
    assert drift["held"] < 0.5 * drift["free"], drift  # the anchor keeps the own states' distribution
    rows = [(s.prompt_ids, s.completion_ids) for s in traces]
    start = float(learner(tiny_model()).mean_logprobs(rows).mean())
    assert float(held.mean_logprobs(rows).mean()) > start + 0.5  # and the traces are still learnt
    with pytest.raises(ValueError, match="trace_anchor needs the trace step"):
        LearnerConfig(trace_anchor=1.0)


def _kl_mean(model, ref, b, args) -> torch.Tensor:
    from node.learn.learner import completion_kl

    return (completion_kl(model, ref, *args) * b.mask).sum() / b.mask.sum()


def test_the_anchor_reservoir_is_a_bounded_uniform_sample_of_the_runs_right_own_completions():
    lrn = learner(tiny_model(), trace_lr=1e-2, trace_anchor=1.0, trace_anchor_rows=16)
    rows = [TrainSample([1, 2], [3, i % 90 + 2, i // 90 + 2], 0.0, right=True) for i in range(400)]
    for lo in range(0, 400, 25):
        lrn.keep_anchor(rows[lo : lo + 25])
    kept = [(r.completion_ids[1] - 2) + 90 * (r.completion_ids[2] - 2) for r in lrn.anchor_pool]
    assert len(kept) == 16 and lrn.anchor_seen == 400 and len(set(kept)) == 16
    assert min(kept) < 200 <= max(kept)  # not only the latest rows: early states stay anchored
    again = learner(tiny_model(), trace_lr=1e-2, trace_anchor=1.0, trace_anchor_rows=16)
    again.keep_anchor(rows)  # the same rows offered in one call: the same draws
    assert [r.completion_ids for r in again.anchor_pool] == [r.completion_ids for r in lrn.anchor_pool]


def test_the_trace_batch_deduplicates_a_steps_traces_and_fills_up_with_earlier_ones():
    lrn = learner(tiny_model(), trace_lr=1e-2, trace_batch=4, trace_buffer_rows=5)

    def trace(i: int) -> TrainSample:
        return TrainSample([1, 2], [3, i + 4], 1.0, external=True, trace=True, family="f")

    rows, m = lrn.select_traces([trace(0)] * 6 + [trace(1)] * 3)  # a specialist's 9 right rows, 2 distinct texts
    assert [r.completion_ids[1] for r in rows] == [4, 5]  # nothing earlier to fill with yet
    assert m == {"trace_new": 2.0, "trace_dup": 7.0, "trace_buffer": 2.0}
    lrn.policy_version += 1
    rows, m = lrn.select_traces([trace(2), trace(2), trace(0)])  # trace 0 is already held: not new, not twice
    assert rows[0].completion_ids[1] == 6 and sorted(r.completion_ids[1] for r in rows[1:]) == [4, 5]
    assert m == {"trace_new": 1.0, "trace_dup": 2.0, "trace_buffer": 3.0}
    lrn.policy_version += 1
    rows, m = lrn.select_traces([trace(i) for i in range(3, 9)])  # 6 new: the first 4 trained, all 6 kept
    assert [r.completion_ids[1] for r in rows] == [7, 8, 9, 10]
    assert m["trace_new"] == 6.0 and m["trace_buffer"] == 5.0  # bounded, oldest out first
    assert [r.completion_ids[1] for r in lrn.trace_buffer] == [8, 9, 10, 11, 12]
    assert lrn.select_traces([trace(0)])[1]["trace_new"] == 1.0  # an evicted trace is new again
    draws = set()
    for v in range(20):  # the fill-up is a uniform draw over the buffer, not its newest rows
        lrn.policy_version = 100 + v
        draws |= {r.completion_ids[1] for r in lrn.select_traces([])[0]}
    assert draws == {9, 10, 11, 12, 4}
    plain = learner(tiny_model(), trace_lr=1e-2)
    same = [trace(0)] * 3
    assert plain.select_traces(same) == (same, {})  # trace_batch 0: the rows as they come
    with pytest.raises(ValueError, match="trace_batch needs the trace step"):
        LearnerConfig(trace_batch=4)
    with pytest.raises(ValueError, match="larger than the buffer it draws from"):
        LearnerConfig(trace_lr=1e-4, trace_batch=64, trace_buffer_rows=32)


def test_a_peer_writing_a_new_text_each_time_gets_the_trace_batch_share_of_its_groups_not_of_its_texts():
    lrn = learner(tiny_model(), trace_lr=1e-2, trace_batch=32, trace_buffer_rows=40)

    def trace(source: str, prompt: int, text: int) -> TrainSample:
        return TrainSample([1, prompt], [3, text], 1.0, external=True, trace=True, family="f", source=source)

    def step(v: int) -> list[TrainSample]:  # 8 groups each: the honest specialist's one text 5 times, 8 texts
        honest = [trace("honest", 100 * v + p, 7) for p in range(8) for _ in range(5)]
        flood = [trace("flood", 100 * v + 50 + p, t) for p in range(8) for t in range(8)]
        return honest + flood

    rows, m = lrn.select_traces(step(0))
    assert m == {"trace_new": 72.0, "trace_dup": 32.0, "trace_buffer": 40.0}  # 8 + 64 new texts, 40 kept
    assert sorted(r.source for r in rows) == ["flood"] * 8 + ["honest"] * 8  # one slot a group, not 32 floods
    kept = [r.source for r in lrn.trace_buffer]
    assert kept.count("honest") == 8 and kept.count("flood") == 32  # the flood's texts went first: 4 a group
    assert len(lrn.trace_keys) == 40 and all((tuple(r.prompt_ids), tuple(r.completion_ids)) in lrn.trace_keys
                                             for r in lrn.trace_buffer)  # fmt: skip
    shares = []
    for v in range(1, 6):
        lrn.policy_version = v
        rows, _ = lrn.select_traces(step(v))
        assert len(rows) == 32 and len({(r.source, r.prompt_ids[1]) for r in rows}) == 32  # each group once
        assert sorted(r.source for r in rows[:16]) == ["flood"] * 8 + ["honest"] * 8  # this step's groups first
        shares.append(sum(r.source == "flood" for r in rows[16:]))  # then a draw of 16 of the buffer's groups
        honest = sum(r.source == "honest" for r in lrn.trace_buffer)
        assert honest >= 16  # room shared by groups: about 4 in 10 rows (by texts, 8 new honest rows in 72)
    assert 30 <= sum(shares) <= 50  # about the flood's share of held groups (3 in 5), not of texts (all 80)
    one = learner(tiny_model(), trace_lr=1e-2, trace_batch=32, trace_buffer_rows=40)  # one source: as before
    rows, _ = one.select_traces([r for r in step(0) if r.source == "flood"])
    assert [r.completion_ids[1] for r in rows] == [t for _ in range(4) for t in range(8)]


def test_a_step_with_a_trace_batch_trains_on_the_distinct_traces_and_logs_the_replay():
    lrn = learner(tiny_model(), lr=1e-6, trace_lr=1e-2, trace_batch=8)
    traces = _trace_rows()
    m = lrn.step(samples(4) + traces + traces)  # every trace twice
    distinct = len({(tuple(s.prompt_ids), tuple(s.completion_ids)) for s in traces})
    assert m["trace_new"] == distinct and m["trace_dup"] == 2 * len(traces) - distinct
    assert m["trace_rows"] == min(8, distinct)


def test_trace_only_rows_train_the_trace_step_and_not_the_rl_update():
    """``sapo.trace_groups``' rows (``trace_only``): the RL update is the one without them, to the bit; the trace
    step takes them."""
    own, extra = samples(4), [dataclasses.replace(r, trace_only=True, advantage=5.0) for r in _trace_rows(3)]
    a = learner(tiny_model(), lr=1e-3, trace_lr=1e-2)
    b = learner(tiny_model(), lr=1e-3, trace_lr=1e-2)
    real = b.trace_step
    b.trace_step = lambda r, anchor=(): real([], anchor)  # b: the RL update alone
    ma, mb = a.step(own + extra), b.step(own)
    assert ma["tokens"] == mb["tokens"] == sum(len(s.completion_ids) for s in own)  # no RL token of theirs
    assert ma["loss"] == mb["loss"] and ma["grad_norm"] == mb["grad_norm"]
    assert ma["trace_rows"] == 3 and ma["trace_tokens"] == sum(len(s.completion_ids) for s in extra)
    assert any(not torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())  # its trace step


def test_a_step_of_trace_only_rows_runs_the_trace_step_without_an_rl_update():
    """A step whose rows are all ``trace_only`` (no own group was informative) is not an error: the RL optimizer
    does not move, the trace step trains, and the policy version advances once."""
    rows = [dataclasses.replace(r, trace_only=True) for r in _trace_rows(3)]
    lrn = learner(tiny_model(), lr=1e-3, trace_lr=1e-2)
    before = {k: v.clone() for k, v in lrn.model.state_dict().items()}
    m = lrn.step(rows)
    assert m["rl_skipped"] == 1.0 and m["tokens"] == 0.0 and m["grad_norm"] == 0.0
    assert m["trace_rows"] == 3 and lrn.policy_version == 1
    assert not lrn.optimizer.state  # the RL optimizer never stepped
    assert any(not torch.equal(v, before[k]) for k, v in lrn.model.state_dict().items())
    with pytest.raises(ValueError, match="no sample with a non-empty completion"):
        learner(tiny_model(), lr=1e-3).step([dataclasses.replace(rows[0], completion_ids=[])])


def test_the_trace_step_leaves_out_peers_traces_of_prompts_the_node_already_solves():
    """``learner.trace_max_own_solve``: a guided peer's trace enters the trace step only where the node's own
    completions of that prompt solved at most that share; generator traces (no own share) always do."""
    rows = _trace_rows(6)
    shares = [0.0, 0.25, 0.5, 0.75, 1.0, None]
    rows = [dataclasses.replace(r, own_solve=v) for r, v in zip(rows, shares, strict=True)]
    kept = [r for r, v in zip(rows, shares, strict=True) if v is None or v <= 0.5]
    lrn = learner(tiny_model(), lr=1e-6, trace_lr=1e-2, trace_max_own_solve=0.5)
    seen = []
    real = lrn.trace_step
    lrn.trace_step = lambda r, anchor=(): seen.extend(r) or real(r, anchor)
    m = lrn.step(samples(4) + rows)
    assert m["trace_solved_skipped"] == 2 and m["trace_rows"] == len(kept) == 4
    assert sorted(map(id, seen)) == sorted(map(id, kept))
    off = learner(tiny_model(), lr=1e-6, trace_lr=1e-2).step(samples(4) + rows)
    assert off["trace_rows"] == 6 and "trace_solved_skipped" not in off
    with pytest.raises(ValueError, match="trace_max_own_solve needs the trace step"):
        LearnerConfig(trace_max_own_solve=0.5)

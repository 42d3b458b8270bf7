"""TransformersEngine: shapes, behaviour logprobs equal a full forward pass, EOS handling, seeding, train mode."""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from node.config import ModelConfig
from node.model import tiny
from node.model.policy import Policy, load_policy
from node.rollout.engine import GeneratedCompletion, TransformersEngine, apply_top_p, cache_keyword

QUESTIONS = ["State the final answer to the following arithmetic problem: 3 + 4 =", "What is 12 - 5?", "Hi"]


@pytest.fixture(scope="module")
def policy(tiny_cache: Path) -> Policy:
    path = tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)  # shared by modules
    return load_policy(ModelConfig(name=str(path)))


def _prompts(policy: Policy) -> list[str]:
    return [policy.format_prompt(q) for q in QUESTIONS]


def _recompute(policy: Policy, c: GeneratedCompletion, temperature: float, top_p: float) -> list[float]:
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1].float()  # (T, V)
    logp = torch.log_softmax(apply_top_p(logits / temperature, top_p), dim=-1)
    return logp.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1).tolist()


def test_shapes_and_metadata(policy: Policy) -> None:
    engine = TransformersEngine(policy, batch_size=4)
    engine.set_policy_version(7)
    outs = engine.generate(_prompts(policy), 3, max_new_tokens=12, seed=0)
    assert [len(o) for o in outs] == [3, 3, 3]
    for prompt, group in zip(_prompts(policy), outs, strict=True):
        for c in group:
            assert c.prompt_ids == policy.encode(prompt)
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= 12
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert c.policy_version == 7
            assert c.finish_reason in ("stop", "length")
            eos = policy.tokenizer.eos_token_id
            assert eos not in c.token_ids[:-1]  # nothing (no padding) after EOS
            assert (c.token_ids[-1] == eos) == (c.finish_reason == "stop")
            if c.finish_reason == "length":
                assert len(c.token_ids) == 12


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_logprobs_match_a_forward_pass(policy: Policy, temperature: float, top_p: float) -> None:
    engine = TransformersEngine(policy, batch_size=8)
    outs = engine.generate(_prompts(policy), 4, max_new_tokens=16, temperature=temperature, top_p=top_p, seed=1)
    for group in outs:
        for c in group:
            expected = _recompute(policy, c, temperature, top_p)
            assert max(abs(a - b) for a, b in zip(c.logprobs, expected, strict=True)) < 1e-4


def test_seed_makes_it_deterministic(policy: Policy) -> None:
    engine = TransformersEngine(policy, batch_size=8)
    a = engine.generate(_prompts(policy), 4, max_new_tokens=10, seed=3)
    b = engine.generate(_prompts(policy), 4, max_new_tokens=10, seed=3)
    c = engine.generate(_prompts(policy), 4, max_new_tokens=10, seed=4)
    assert [[x.token_ids for x in g] for g in a] == [[x.token_ids for x in g] for g in b]
    assert [[x.token_ids for x in g] for g in a] != [[x.token_ids for x in g] for g in c]


class _EosAfter(torch.nn.Module):
    """Wraps a model so EOS becomes overwhelmingly likely once a row has generated ``k`` tokens."""

    def __init__(self, model: torch.nn.Module, eos: int, prompt_len: int, k: int):
        super().__init__()
        self.inner, self.eos, self.prompt_len, self.k = model, eos, prompt_len, k
        self.generation_config = model.generation_config

    def forward(self, **kw):
        out = self.inner(**kw)
        generated = kw["attention_mask"].shape[1] - self.prompt_len + 1  # tokens after this step
        logits = out.logits.clone()
        if generated >= self.k:
            logits[..., self.eos] += 1e4
        else:
            logits[..., self.eos] -= 1e4
        return SimpleNamespace(logits=logits)


def test_stops_at_eos_and_strips_it_from_text(policy: Policy) -> None:
    prompt = policy.format_prompt(QUESTIONS[0])
    eos = policy.tokenizer.eos_token_id
    wrapped = replace(policy, model=_EosAfter(policy.model, eos, len(policy.encode(prompt)), k=3))
    outs = TransformersEngine(wrapped).generate([prompt], 5, max_new_tokens=10, seed=0)
    for c in outs[0]:
        assert c.finish_reason == "stop"
        assert len(c.token_ids) == 3 and c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
        assert c.text == policy.tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)
        assert tiny.EOS_TOKEN not in c.text
    short = TransformersEngine(wrapped).generate([prompt], 2, max_new_tokens=2, seed=0)
    assert all(c.finish_reason == "length" and len(c.token_ids) == 2 for c in short[0])


def test_mixed_finishes_in_one_batch(policy: Policy) -> None:
    # two prompts of different lengths: the shorter one's EOS rule fires at a different step
    prompts = [policy.format_prompt("a"), policy.format_prompt("a much longer question with many more tokens")]
    eos = policy.tokenizer.eos_token_id
    width = max(len(policy.encode(p)) for p in prompts)
    wrapped = replace(policy, model=_EosAfter(policy.model, eos, width, k=4))
    outs = TransformersEngine(wrapped, batch_size=8).generate(prompts, 2, max_new_tokens=6, seed=0)
    for group in outs:
        for c in group:
            assert c.finish_reason == "stop" and len(c.token_ids) == 4


def test_restores_train_mode_and_needs_no_grad(policy: Policy) -> None:
    policy.model.train()
    TransformersEngine(policy).generate(_prompts(policy)[:1], 2, max_new_tokens=4, seed=0)
    assert policy.model.training
    policy.model.eval()
    TransformersEngine(policy).generate(_prompts(policy)[:1], 2, max_new_tokens=4, seed=0)
    assert not policy.model.training


def test_sync_weights_bumps_version(policy: Policy) -> None:
    engine = TransformersEngine(policy)
    engine.sync_weights(3)
    assert engine.policy_version == 3
    assert engine.generate(_prompts(policy)[:1], 1, max_new_tokens=2, seed=0)[0][0].policy_version == 3


def test_top_p_keeps_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(apply_top_p(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(apply_top_p(logits, 0.1)).sum() == 1
    assert torch.equal(apply_top_p(logits, 1.0), logits)


def test_rejects_bad_arguments(policy: Policy) -> None:
    engine = TransformersEngine(policy)
    with pytest.raises(ValueError):
        engine.generate(["x"], 0, max_new_tokens=4)
    with pytest.raises(ValueError):
        engine.generate(["x"], 1, max_new_tokens=4, top_p=0.0)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_generation_warns_nothing(policy: Policy) -> None:
    """Our calls into transformers use its current cache API: no FutureWarning/DeprecationWarning (``past_key_values``
    is deprecated in 5.2x and removed in 5.40) and no warning logged through transformers' own logger (which does not
    propagate to the root logger, hence the handler on it)."""
    records = _Records()
    hf_logger = logging.getLogger("transformers")
    hf_logger.addHandler(records)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning raised from our generation path fails the test
            engine = TransformersEngine(policy, batch_size=2)
            outs = engine.generate(_prompts(policy)[:2], 2, max_new_tokens=6, seed=0)
    finally:
        hf_logger.removeHandler(records)
    assert [len(o) for o in outs] == [2, 2]
    assert records.messages == []


def test_cache_keyword_follows_the_forward_signature(policy: Policy) -> None:
    class Old:
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):  # type: ignore[no-untyped-def]
            return None

    class New:
        def forward(self, input_ids=None, cache=None, use_cache=None):  # type: ignore[no-untyped-def]
            return None

    class Wrapper:  # forwards everything to an inner model: the installed transformers' name
        def forward(self, **kw):  # type: ignore[no-untyped-def]
            return None

    assert cache_keyword(Old()) == "past_key_values"
    assert cache_keyword(New()) == "cache"
    assert cache_keyword(Wrapper()) == cache_keyword(policy.model)
    import inspect

    expected = "cache" if "cache" in inspect.signature(policy.model.forward).parameters else "past_key_values"
    assert cache_keyword(policy.model) == expected

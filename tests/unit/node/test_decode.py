"""FastDecoder: the lean decode step reproduces the transformers forward token by token (left padding, grouped heads,
biases or none, tied or untied heads, a compacted batch), and the engine samples the same completions with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from node.config import ModelConfig
from node.model import tiny
from node.model.policy import Policy, load_policy
from node.rollout.decode import FastDecoder, supports
from node.rollout.engine import TransformersEngine, _prefill, cache_keyword

PAD = 0


def _qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=PAD)  # fmt: skip
    return Qwen2ForCausalLM(cfg).eval()


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=89, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=1, tie_word_embeddings=False, pad_token_id=PAD, rope_theta=500.0)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("make", [_qwen2, _llama], ids=["qwen2-gqa-bias-tied", "llama-mqa-untied"])
def test_decode_steps_match_the_transformers_forward(make) -> None:  # type: ignore[no-untyped-def]
    model = make()
    # Hand-made random Qwen2 layers have zero q/k/v biases; make them count.
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            p.data.normal_(0, 0.5)
    assert supports(model)
    inputs = [[5, 6, 7, 8, 9], [11, 12], [5, 6, 7, 8, 9], [20, 21, 22, 23, 24, 25, 26], [30]]  # a repeated row too
    width = max(len(p) for p in inputs)
    mask = torch.zeros((len(inputs), width), dtype=torch.long)
    for i, p in enumerate(inputs):
        mask[i, width - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -1:]
    gen = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        cache_hf, first = _prefill(model, inputs, width, PAD, torch.device("cpu"))
        cache_fast, _ = _prefill(model, inputs, width, PAD, torch.device("cpu"))
        fast = FastDecoder(model, cache_fast, max_new=8)
        nxt = first.argmax(-1)
        for t in range(1, 8):
            if t == 4:  # a finished row compacted out (and one kept running with a masked new column below)
                keep = torch.tensor([0, 1, 3, 4])
                cache_hf.batch_select_indices(keep)
                fast.keep(keep)
                mask, pos, nxt = mask[keep], pos[keep], nxt[keep]
            live = torch.ones(mask.shape[0], 1, dtype=torch.long)
            if t >= 5:
                live[1] = 0  # a row done but not yet compacted: its new columns are masked
            mask = torch.cat([mask, live], dim=1)
            pos = pos + 1
            ref = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, use_cache=True,
                        logits_to_keep=1, **{cache_keyword(model): cache_hf}).logits[:, -1].float()  # fmt: skip
            got = fast.step(nxt[:, None], mask, pos)
            assert got.shape == ref.shape
            torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
            nxt = torch.multinomial(ref.softmax(-1), 1, generator=gen).squeeze(-1)


def test_supports_only_what_it_reproduces() -> None:
    model = _qwen2()
    assert supports(model)

    class Wrapped(torch.nn.Module):  # a wrapper's forward may do anything
        def __init__(self) -> None:
            super().__init__()
            self.model, self.config = model.model, model.config

    assert not supports(Wrapped())
    windowed = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                                            sliding_window=4))  # fmt: skip
    assert not supports(windowed)
    scaled = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1,
                                          rope_scaling={"rope_type": "linear", "factor": 2.0}))  # fmt: skip
    assert not supports(scaled)


def test_supports_no_hooked_or_replaced_layer() -> None:
    hooked = _qwen2()
    hooked.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert not supports(hooked)

    class Adapted(torch.nn.Linear):  # a LoRA / quantized layer keeps .weight but computes something else
        pass

    adapted = _qwen2()
    old = adapted.model.layers[1].self_attn.q_proj
    adapted.model.layers[1].self_attn.q_proj = Adapted(old.in_features, old.out_features)
    assert not supports(adapted)
    dispatched = _qwen2()
    dispatched.hf_device_map = {"": "cpu"}
    assert not supports(dispatched)


def test_bf16_decode_matches_the_transformers_forward_to_its_rounding() -> None:
    model = _qwen2().to(torch.bfloat16)
    inputs = [[5, 6, 7, 8], [9, 10]]
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with torch.inference_mode():
        cache_hf, first = _prefill(model, inputs, 4, PAD, torch.device("cpu"))
        cache_fast, _ = _prefill(model, inputs, 4, PAD, torch.device("cpu"))
        fast = FastDecoder(model, cache_fast, max_new=4)
        nxt, pos = first.argmax(-1), torch.tensor([[3], [1]])
        for _ in range(3):
            mask, pos = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1), pos + 1
            ref = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, use_cache=True,
                        logits_to_keep=1, **{cache_keyword(model): cache_hf}).logits[:, -1].float()  # fmt: skip
            got = fast.step(nxt[:, None], mask, pos)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)
            nxt = ref.argmax(-1)


def test_decoder_cache_overflow_is_an_error() -> None:
    model = _qwen2()
    with torch.inference_mode():
        cache, first = _prefill(model, [[3, 4, 5]], 3, PAD, torch.device("cpu"))
        fast = FastDecoder(model, cache, max_new=1)
        mask = torch.ones((1, 5), dtype=torch.long)
        with pytest.raises(ValueError, match="holds 4 positions"):
            fast.step(first.argmax(-1)[:, None], mask, torch.tensor([[4]]))


@pytest.fixture(scope="module")
def policy(tiny_cache: Path) -> Policy:
    path = tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)
    return load_policy(ModelConfig(name=str(path)))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_samples_the_same_completions_with_and_without_it(policy: Policy, temperature: float) -> None:
    assert supports(policy.model)
    prompts = [policy.format_prompt(q) for q in ("What is 12 - 5?", "3 + 4 =", "Hi")]
    runs = []
    for fast in (True, False):
        engine = TransformersEngine(policy, batch_size=8, fast_decode=fast)
        runs.append(
            [c for g in engine.generate(prompts, 4, max_new_tokens=24, temperature=temperature, seed=7) for c in g]
        )
    fast_out, ref_out = runs
    assert len(fast_out) == 12
    assert [c.token_ids for c in fast_out] == [c.token_ids for c in ref_out]
    assert [c.finish_reason for c in fast_out] == [c.finish_reason for c in ref_out]
    for a, b in zip(fast_out, ref_out, strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)

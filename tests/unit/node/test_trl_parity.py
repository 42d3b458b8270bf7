"""Parity with TRL: our GRPO-family losses against ``trl.GRPOTrainer._compute_loss`` on identical tensors.

TRL's own code path runs: a real ``GRPOTrainer`` is built around a tiny local Qwen2 model and its
``_compute_loss(model, inputs)`` is called on a prepared inputs dict (the dict its
``_generate_and_score_completions`` would produce), so TRL computes the completion logprobs with its fused LM
head and applies its own ratio, clipping, KL, importance weighting and normalisation. Our side computes
logprobs with ``node.learn.learner.completion_logprobs`` and the loss with ``node.learn.losses``. Loss values and
parameter gradients must agree to 1e-5.
"""

import copy

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd

from node.config import LearnerConfig
from node.learn.learner import Learner, TrainSample, completion_logprobs
from node.learn.losses import get_loss, group_advantages, policy_gradient_loss, truncated_is_weights

VOCAB, PAD = 100, 0
PROMPT_LEN, LENGTHS = 3, [5, 2, 4, 3]
MAX_COMPLETION = 6
TOL = 1e-5


def _model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg)


def _trainer(model, tmp_path, loss_type: str, *, eps_high: float | None, beta: float = 0.0) -> GRPOTrainer:
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t2")), pad_token="t0", eos_token="t1"
    )
    args = GRPOConfig(
        output_dir=str(tmp_path),
        loss_type=loss_type,
        beta=0.0,  # TRL would load a reference model from the hub for beta > 0; set after construction instead
        epsilon=0.2,
        epsilon_high=eps_high,
        per_device_train_batch_size=len(LENGTHS),
        num_generations=2,
        max_completion_length=MAX_COMPLETION,
        gradient_checkpointing=False,  # TRL defaults to True; ours keeps activations
        bf16=False,  # TRL defaults to bf16 autocast, even on CPU; compare in float32
        use_bias_correction_kl=False,  # plain k3, as GRPO's paper and our loss
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_dropout=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["t5 t6"] * 4}),
        processing_class=tok,
    )
    trainer.beta = beta
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop; one micro-batch here
    trainer.model.train()
    return trainer


def _batch():
    g = torch.Generator().manual_seed(1)
    b, t = len(LENGTHS), max(LENGTHS)
    prompt_ids = torch.randint(2, VOCAB, (b, PROMPT_LEN), generator=g)
    completion_ids = torch.randint(2, VOCAB, (b, t), generator=g)
    mask = (torch.arange(t).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(-1)).long()
    completion_ids = completion_ids.masked_fill(mask == 0, PAD)
    advantages = torch.tensor([1.2, -0.8, 0.5, -1.1])
    noise = 0.3 * torch.randn(b, t, generator=g)  # moves ratios outside [0.8, 1.28] on many tokens
    beh_noise = 0.5 * torch.randn(b, t, generator=g)
    return prompt_ids, completion_ids, mask, advantages, noise, beh_noise


def _ours_logp(model, prompt_ids, completion_ids, mask):
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attn = torch.cat([torch.ones_like(prompt_ids), mask], dim=1)
    b = len(LENGTHS)
    return completion_logprobs(model, input_ids, attn, torch.full((b,), PROMPT_LEN), torch.tensor(LENGTHS))  # (B, T)


def _grads(model) -> torch.Tensor:
    out = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return out


# (TRL loss_type, our aggregation, TRL epsilon_high, our eps_high)
CASES = [
    ("grpo", "seq_mean_token_mean", None, 0.2),
    ("dapo", "token_mean", 0.28, 0.28),
    ("bnpo", "token_mean", 0.28, 0.28),
    ("dr_grpo", "seq_mean_token_sum_norm", None, 0.2),
]


@pytest.mark.parametrize(("loss_type", "aggregation", "trl_eps_high", "eps_high"), CASES)
@pytest.mark.parametrize("variant", ["plain", "kl", "is_weights"])
def test_loss_and_gradients_match_trl(tmp_path, loss_type, aggregation, trl_eps_high, eps_high, variant):
    model = _model()
    beta = 0.05 if variant == "kl" else 0.0
    trainer = _trainer(model, tmp_path, loss_type, eps_high=trl_eps_high, beta=beta)
    prompt_ids, completion_ids, mask, adv, noise, beh_noise = _batch()

    with torch.no_grad():
        base = _ours_logp(model, prompt_ids, completion_ids, mask)
    old = (base + noise) * mask  # (B, T)
    ref = (base - noise.abs()) * mask  # (B, T)
    weights = truncated_is_weights(old, old + beh_noise, cap=1.0) if variant == "is_weights" else None

    logp = _ours_logp(model, prompt_ids, completion_ids, mask)
    ours, metrics = policy_gradient_loss(
        logp,
        old,
        adv,
        mask,
        eps_low=0.2,
        eps_high=eps_high,
        aggregation=aggregation,
        max_tokens=MAX_COMPLETION,
        is_weights=weights,
        ref_logp=ref if beta else None,
        beta=beta,
    )
    ours.backward()
    our_grads = _grads(model)

    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    if beta:
        inputs["ref_per_token_logps"] = ref
    if weights is not None:
        # TRL multiplies the per-token policy loss by this ratio when it corrects for vLLM sampling.
        trainer.use_vllm = True
        trainer.vllm_importance_sampling_correction = True
        inputs["importance_sampling_ratio"] = weights
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    trl_grads = _grads(model)

    assert metrics["clip_low_frac"] + metrics["clip_high_frac"] > 0  # the clip is exercised
    assert abs(ours.item() - theirs.item()) < TOL
    assert torch.allclose(our_grads, trl_grads, atol=TOL, rtol=0)
    if loss_type in ("grpo", "dapo"):
        low = trainer._metrics["train"]["clip_ratio/low_mean"][-1]
        high = trainer._metrics["train"]["clip_ratio/high_mean"][-1]
        assert metrics["clip_low_frac"].item() == pytest.approx(low, abs=TOL)
        assert metrics["clip_high_frac"].item() == pytest.approx(high, abs=TOL)


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo"])
def test_learner_batch_loss_matches_trl(tmp_path, loss):
    """The whole learner path (collate, micro-batches of 2, on-policy pi_old) against TRL's on-policy loss."""
    model = _model()
    spec = get_loss(loss)
    trainer = _trainer(copy.deepcopy(model), tmp_path, loss, eps_high=0.28 if spec.clip_higher else None)
    prompt_ids, completion_ids, mask, adv, _, _ = _batch()
    samples = [
        TrainSample(prompt_ids[i].tolist(), completion_ids[i, :n].tolist(), float(adv[i]))
        for i, n in enumerate(LENGTHS)
    ]
    learner = Learner(
        model,
        LearnerConfig(loss=loss, micro_batch_size=2),
        device="cpu",
        pad_token_id=PAD,
        max_tokens=MAX_COMPLETION,
    )
    ours = learner.accumulate_gradients(samples)["loss"]
    our_grads = _grads(model)
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "advantages": adv,
        "num_items_in_batch": mask.sum(),
    }
    theirs = trainer._compute_loss(trainer.model, inputs)
    theirs.backward()
    trl_grads = _grads(trainer.model)
    assert abs(ours.item() - theirs.item()) < TOL
    assert torch.allclose(our_grads, trl_grads, atol=TOL, rtol=0)


def test_group_advantages_match_trl_normalisation():
    """TRL: (r - mean) / (nanstd(r) + 1e-4), nanstd with Bessel's correction; ours with eps=1e-4."""
    rewards = torch.tensor([[1.0, 0.0, 0.5, 1.0], [0.2, 0.2, 0.9, 0.0]])
    for group in rewards:
        expected = (group - group.mean()) / (nanstd(group) + 1e-4)
        assert torch.allclose(group_advantages(group, "std", eps=1e-4), expected, atol=1e-6)
        assert torch.allclose(group_advantages(group, "none"), group - group.mean())

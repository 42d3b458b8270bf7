"""Rollout engines: turn prompts into G sampled completions each, with behaviour logprobs per token.

:class:`RolloutEngine` is the interface the node's runtime uses; :class:`TransformersEngine` implements it with
its own sampling loop over a transformers causal LM: left-padded batches, one prefill, then one token per step
through the KV cache, per-row EOS stopping, and the log-probability of every sampled token recorded as it is
drawn. A hand-written loop instead of ``model.generate(output_scores=True)``: it returns exactly what GRPO
needs (token ids + logprobs, no score tensors to re-gather) and skips generate's per-step processor machinery,
which dominates on small models (see ``benchmarks/b2_rollout.py``).

**Behaviour logprobs** are those of the *sampling* distribution: logits / temperature, then top-p
truncation and renormalisation (vLLM's ``logprobs_mode="processed_logprobs"``). With temperature 1 and top-p 1
they equal the policy's own logprobs; otherwise they are what truncated importance sampling (DART,
arXiv 2509.23866) must divide by. ``token_ids`` include the EOS token that ended a completion (the learner
must learn to stop); ``text`` does not.

Knows nothing about tasks, rewards, losses or the swarm; the transformers engine shares the learner's model
object, so syncing weights is a no-op (a vLLM engine would copy them in :meth:`RolloutEngine.sync_weights`).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

import torch

from node.policy import Policy

logger = logging.getLogger(__name__)

FinishReason = Literal["stop", "length"]


@dataclass
class GeneratedCompletion:
    """One sampled completion: its text, the prompt and completion token ids, the behaviour logprob of each
    completion token, why it ended, and the policy version that sampled it."""

    text: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int


class RolloutEngine(ABC):
    """Samples completions from the current policy; ``policy_version`` tags every completion it returns."""

    policy_version: int = 0

    @abstractmethod
    def generate(
        self,
        prompts: list[str],
        n: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[list[GeneratedCompletion]]:
        """``n`` completions for each prompt (outer list in prompt order)."""

    def set_policy_version(self, version: int) -> None:
        """Record which policy version the engine now samples from (after the learner stepped)."""
        self.policy_version = int(version)

    def sync_weights(self, version: int) -> None:
        """Make the engine sample from the learner's current weights; engines holding a copy override this."""
        self.set_policy_version(version)


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set logits outside the smallest set of tokens with total probability >= ``top_p`` to -inf (the
    most likely token is always kept). ``logits  # (B, V)``."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class TransformersEngine(RolloutEngine):
    """Sampling loop over a transformers causal LM with a KV cache; shares the policy's model object."""

    def __init__(self, policy: Policy, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.policy = policy
        self.batch_size = batch_size
        self.policy_version = 0

    def generate(
        self,
        prompts: list[str],
        n: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[list[GeneratedCompletion]]:
        if n < 1 or max_new_tokens < 1 or temperature <= 0 or not 0 < top_p <= 1:
            raise ValueError("need n >= 1, max_new_tokens >= 1, temperature > 0 and 0 < top_p <= 1")
        device = self.policy.device
        gen = torch.Generator(device=device)
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(seed)
        encoded = [self.policy.encode(p) for p in prompts]
        rows = [i for i in range(len(prompts)) for _ in range(n)]  # each prompt n times, in order
        out: list[list[GeneratedCompletion]] = [[] for _ in prompts]
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(rows), self.batch_size):
                    chunk = rows[start : start + self.batch_size]
                    for i, c in zip(
                        chunk,
                        self._sample([encoded[i] for i in chunk], max_new_tokens, temperature, top_p, gen),
                        strict=True,
                    ):
                        out[i].append(c)
        finally:
            if was_training:
                model.train()
        return out

    def _sample(
        self,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        gen: torch.Generator,
    ) -> list[GeneratedCompletion]:
        from transformers import DynamicCache

        policy, model, device = self.policy, self.policy.model, self.policy.device
        tok = policy.tokenizer
        pad = tok.pad_token_id
        b = len(prompt_ids)
        width = max(len(p) for p in prompt_ids)
        ids = torch.full((b, width), pad, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):  # left padding: every row's last prompt token sits at column -1
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        eos = torch.tensor(policy.eos_token_ids, device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        cache = DynamicCache()
        tokens = torch.empty((b, max_new_tokens), dtype=torch.long, device=device)
        logps = torch.empty((b, max_new_tokens), dtype=torch.float32, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        lengths = torch.full((b,), max_new_tokens, dtype=torch.long, device=device)
        step_input, step_pos = ids, positions
        steps = 0
        for t in range(max_new_tokens):
            logits = (
                model(
                    input_ids=step_input,
                    attention_mask=mask,
                    position_ids=step_pos,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                .logits[:, -1, :]
                .float()
            )  # (B, V)
            logits = apply_top_p(logits / temperature, top_p)
            logp = torch.log_softmax(logits, dim=-1)  # (B, V): the sampling distribution
            nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)  # (B,)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            tokens[:, t] = nxt
            logps[:, t] = logp.gather(-1, nxt[:, None]).squeeze(-1)
            hit = ~done & torch.isin(nxt, eos)
            lengths = torch.where(hit, torch.full_like(lengths, t + 1), lengths)
            done |= hit
            steps = t + 1
            if bool(done.all()):
                break
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
            step_pos = step_pos[:, -1:] + 1
            step_input = nxt[:, None]
        tokens_l, logps_l, lengths_l = tokens[:, :steps].tolist(), logps[:, :steps].tolist(), lengths.tolist()
        done_l = done.tolist()
        out = []
        for i in range(b):
            n_tok = min(lengths_l[i], steps)
            tids = tokens_l[i][:n_tok]
            text = tok.decode(tids, skip_special_tokens=True)
            out.append(
                GeneratedCompletion(
                    text=text,
                    prompt_ids=list(prompt_ids[i]),
                    token_ids=tids,
                    logprobs=logps_l[i][:n_tok],
                    finish_reason="stop" if done_l[i] else "length",
                    policy_version=self.policy_version,
                )
            )
        return out

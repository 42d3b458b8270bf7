"""Rollout engines: turn prompts into G sampled completions each, with behaviour logprobs per token.

:class:`RolloutEngine` is the interface the node's runtime uses; :class:`TransformersEngine` implements it with
its own sampling loop over a transformers causal LM: left-padded batches, one prefill, then one token per step
through the KV cache, per-row EOS stopping, and the log-probability of every sampled token recorded as it is
drawn. A hand-written loop instead of ``model.generate(output_scores=True)``: it returns exactly what GRPO
needs (token ids + logprobs, no score tensors to re-gather) and skips generate's per-step processor machinery,
which dominates on small models (see ``benchmarks/systems/b2_rollout.py``).

**Behaviour logprobs** are those of the *sampling* distribution: logits / temperature, then top-p
truncation and renormalisation (vLLM's ``logprobs_mode="processed_logprobs"``). With temperature 1 and top-p 1
they equal the policy's own logprobs; otherwise they are what truncated importance sampling (DART,
arXiv 2509.23866) must divide by. ``token_ids`` include the EOS token that ended a completion (the learner
must learn to stop); ``text`` does not.

**Resumable generation** (APRIL, arXiv 2509.18521): :meth:`RolloutEngine.generate_requests` takes
:class:`RolloutRequest` s that may carry an already generated prefix (tokens, their behaviour logprobs and the
policy version of each) and a whole-completion token budget; the prefix is re-read in the prefill and sampling
continues with the remaining budget. A ``should_stop`` callback, given which requests have finished, may end the
batch early: unfinished requests come back with ``finish_reason="abort"`` and everything generated so far, so the
caller can continue them later. Continuing a prefix under unchanged weights gives the same per-token logprobs as
sampling the whole completion in one go (tested).

Knows nothing about tasks, rewards, losses or the swarm; the transformers engine shares the learner's model
object, so syncing weights is a no-op (the vLLM engine, ``node.rollout.engine_vllm``, copies them in
:meth:`RolloutEngine.sync_weights`).
"""

from __future__ import annotations

import functools
import logging
from abc import ABC
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from node.model.policy import Policy
from node.rollout.decode import FastDecoder, supports
from node.seams import GenerationSettings

logger = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "abort"]

#: ``should_stop(finished)``: called as requests finish, with one flag per request; True ends the batch early.
StopFn = Callable[[Sequence[bool]], bool]


@dataclass
class GeneratedCompletion:
    """One sampled completion: its text, the prompt and completion token ids, the behaviour logprob of each
    completion token, why it ended, and the policy version that sampled it.

    ``finish_reason`` is ``"abort"`` for a completion the caller stopped early (APRIL keeps those to continue).
    ``token_versions`` gives the policy version that sampled each token when they differ (a continued completion);
    ``policy_version`` is then the oldest of them.
    """

    text: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int
    token_versions: list[int] | None = None


@dataclass
class RolloutRequest:
    """One completion to sample, or to continue from an already generated prefix (APRIL)."""

    prompt_ids: list[int]
    """Prompt tokens."""
    max_new_tokens: int
    """Token budget of the whole completion, prefix included (the engine samples at most the rest)."""
    token_ids: list[int] = field(default_factory=list)
    """Already generated completion tokens (empty for a fresh request)."""
    logprobs: list[float] = field(default_factory=list)
    """Behaviour logprobs of ``token_ids`` (as they were sampled, possibly by an older policy)."""
    token_versions: list[int] = field(default_factory=list)
    """Policy version that sampled each of ``token_ids``."""

    def __post_init__(self) -> None:
        if not (len(self.token_ids) == len(self.logprobs) == len(self.token_versions)):
            raise ValueError("a request's token_ids, logprobs and token_versions must have equal lengths")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")


class RolloutEngine(ABC):
    """Samples completions from the current policy with the :class:`GenerationSettings` it was built with;
    ``policy_version`` tags every completion it returns."""

    policy_version: int = 0
    settings: GenerationSettings = GenerationSettings()
    policy: Any  # ``encode(text) -> token ids`` and ``eos_token_ids``: the tokenizer both engines share

    def generate(
        self,
        prompts: list[str],
        n: int,
        *,
        seed: int | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> list[list[GeneratedCompletion]]:
        """``n`` completions for each prompt (outer list in prompt order), sampled with the engine's settings; the
        keyword overrides are for callers that decode differently (the held-out evaluator's greedy pass). Prompts
        are tokenized here, so every engine sees the learner's exact tokens."""
        s = self.settings.resolve(max_new_tokens, temperature, top_p)  # ValueError for a bad override
        if n < 1:
            raise ValueError("need n >= 1 completions per prompt")
        encoded = [self.policy.encode(p) for p in prompts]
        return self._generate_by_requests(
            encoded, n, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=seed
        )

    def generate_requests(
        self,
        requests: list[RolloutRequest],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        should_stop: StopFn | None = None,
    ) -> list[GeneratedCompletion]:
        """One completion per request, in request order; a request's prefix is continued, not resampled.

        With ``should_stop``, requests still running when it returns True come back with ``finish_reason="abort"``
        (prefix plus whatever was sampled). Engines that cannot continue or stop early do not override this."""
        raise NotImplementedError(f"{type(self).__name__} does not support resumable generation (APRIL)")

    def _generate_by_requests(
        self,
        encoded: list[list[int]],
        n: int,
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
    ) -> list[list[GeneratedCompletion]]:
        """:meth:`generate` through :meth:`generate_requests`: one fresh request per prompt (token ids) and
        completion, grouped back by prompt."""
        rows = [i for i in range(len(encoded)) for _ in range(n)]  # each prompt n times, in order
        done = self.generate_requests(
            [RolloutRequest(encoded[i], max_new_tokens) for i in rows], temperature=temperature, top_p=top_p, seed=seed
        )
        out: list[list[GeneratedCompletion]] = [[] for _ in encoded]
        for i, c in zip(rows, done, strict=True):
            out[i].append(c)
        return out

    @staticmethod
    def _check_sampling(temperature: float, top_p: float) -> None:
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError("need temperature >= 0 and 0 < top_p <= 1")

    def _completion(
        self,
        prompt_ids: list[int],
        token_ids: list[int],
        logprobs: list[float],
        versions: list[int],
        reason: FinishReason,
    ) -> GeneratedCompletion:
        """A completion as the learner gets it: text decoded with the policy's tokenizer, tagged with the oldest
        policy version that sampled any of its tokens (each token's version only when they differ: APRIL)."""
        mixed = any(v != self.policy_version for v in versions)
        return GeneratedCompletion(
            text=self.policy.tokenizer.decode(token_ids, skip_special_tokens=True),
            prompt_ids=list(prompt_ids),
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=reason,
            policy_version=min(versions) if versions else self.policy_version,
            token_versions=versions if mixed else None,
        )

    def set_policy_version(self, version: int) -> None:
        """Record which policy version the engine now samples from (after the learner stepped)."""
        self.policy_version = int(version)

    def sync_weights(self, version: int) -> None:
        """Make the engine sample from the learner's current weights; engines holding a copy override this."""
        self.set_policy_version(version)

    def stats(self) -> dict[str, float]:
        """``engine_*`` fields for the step's metrics line (weight syncs and their time, for engines with a copy)."""
        return {}


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

    def __init__(
        self,
        policy: Policy,
        batch_size: int = 64,
        settings: GenerationSettings | None = None,
        *,
        fast_decode: bool = True,
    ):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.policy = policy
        #: Decode with :class:`node.rollout.decode.FastDecoder` where it reproduces the model (:func:`supports`);
        #: False keeps the transformers forward for every token (the reference the decoder is tested against).
        self.fast_decode = fast_decode
        self.batch_size = batch_size
        self.settings = settings or GenerationSettings()
        self.policy_version = 0

    def generate_requests(
        self,
        requests: list[RolloutRequest],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        should_stop: StopFn | None = None,
    ) -> list[GeneratedCompletion]:
        self._check_sampling(temperature, top_p)
        device = self.policy.device
        gen = torch.Generator(device=device)
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(seed)
        out: list[GeneratedCompletion | None] = [None] * len(requests)
        finished = [False] * len(requests)
        todo = []
        for i, r in enumerate(requests):
            if len(r.token_ids) >= r.max_new_tokens or (r.token_ids and r.token_ids[-1] in self.policy.eos_token_ids):
                out[i] = self._finish(r, [], [], "stop" if r.token_ids[-1] in self.policy.eos_token_ids else "length")
                finished[i] = True
            else:
                todo.append(i)
        model = self.policy.model
        was_training = model.training
        model.eval()
        stopped = should_stop is not None and any(finished) and should_stop(finished)
        try:
            with torch.inference_mode():
                for start in range(0, len(todo), self.batch_size):
                    chunk = todo[start : start + self.batch_size]
                    if stopped:  # never started: handed back unchanged, to continue later
                        for i in chunk:
                            out[i] = self._finish(requests[i], [], [], "abort")
                        continue
                    results, stopped = self._sample(
                        [requests[i] for i in chunk], chunk, finished, temperature, top_p, gen, should_stop
                    )
                    for i, c in zip(chunk, results, strict=True):
                        out[i] = c
        finally:
            if was_training:
                model.train()
        return [c for c in out if c is not None]

    def _finish(
        self, req: RolloutRequest, new_ids: list[int], new_logps: list[float], reason: FinishReason
    ) -> GeneratedCompletion:
        versions = req.token_versions + [self.policy_version] * len(new_ids)
        return self._completion(req.prompt_ids, req.token_ids + new_ids, req.logprobs + new_logps, versions, reason)

    def _sample(
        self,
        requests: list[RolloutRequest],
        index: list[int],
        finished: list[bool],
        temperature: float,
        top_p: float,
        gen: torch.Generator,
        should_stop: StopFn | None,
    ) -> tuple[list[GeneratedCompletion], bool]:
        """Sample one batch of requests; ``index`` maps rows to positions in ``finished`` (updated in place).
        Returns the completions and whether ``should_stop`` ended the batch."""

        policy, model, device = self.policy, self.policy.model, self.policy.device
        pad = policy.tokenizer.pad_token_id
        b = len(requests)
        inputs = [r.prompt_ids + r.token_ids for r in requests]  # a continued request re-reads its prefix
        width = max(len(p) for p in inputs)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(inputs):  # left padding: every row's last input token sits at column -1
            mask[i, width - len(p) :] = 1
        mask = mask.to(device)
        eos = torch.tensor(policy.eos_token_ids, device=device)
        budget = torch.tensor([r.max_new_tokens - len(r.token_ids) for r in requests], device=device)  # (B,)
        max_new_tokens = int(budget.max())
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        cache_kw = cache_keyword(model)
        cache, first_logits = _prefill(model, inputs, width, pad, device)  # (B, V)
        fast = FastDecoder(model, cache, max_new_tokens) if self.fast_decode and supports(model) else None
        if fast is not None:
            cache = None  # copied into the decoder's buffers: do not hold the prompt's keys and values twice
        tokens = torch.full((b, max_new_tokens), pad, dtype=torch.long, device=device)
        logps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        hit_eos = torch.zeros(b, dtype=torch.bool, device=device)
        lengths = budget.clone()
        # The working batch: rows still running. Finished rows are compacted out of it (KV cache included) once a
        # quarter of it has finished, so a long tail of completions does not drag the finished ones along.
        rows = torch.arange(b, device=device)  # (w,) original row of each working row
        done_w, budget_w = done.clone(), budget.clone()  # (w,)
        step_input, step_pos = None, positions[:, -1:]
        steps = 0
        stopped = False
        for t in range(max_new_tokens):
            if t == 0:
                logits = first_logits
            elif fast is not None:
                assert step_input is not None  # set at the end of step 0
                logits = fast.step(step_input, mask, step_pos)  # (w, V)
            else:
                logits = (
                    model(
                        input_ids=step_input,
                        attention_mask=mask,
                        position_ids=step_pos,
                        use_cache=True,
                        logits_to_keep=1,
                        **{cache_kw: cache},
                    )
                    .logits[:, -1, :]
                    .float()
                )  # (w, V)
            if temperature == 0:  # greedy: the policy's own logprob of its most likely token
                logp = torch.log_softmax(logits, dim=-1)  # (w, V)
                nxt = logp.argmax(dim=-1)  # (w,)
            else:
                logits = apply_top_p(logits / temperature, top_p)
                logp = torch.log_softmax(logits, dim=-1)  # (w, V): the sampling distribution
                nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)  # (w,)
            nxt = torch.where(done_w, torch.full_like(nxt, pad), nxt)
            tokens[rows, t] = nxt
            logps[rows, t] = logp.gather(-1, nxt[:, None]).squeeze(-1)
            hit = ~done_w & torch.isin(nxt, eos)  # (w,)
            newly = hit | (~done_w & (budget_w <= t + 1))
            lengths[rows[hit]] = t + 1
            hit_eos[rows[hit]] = True
            done_w |= newly
            done[rows] = done_w
            steps = t + 1
            if bool(done_w.all()):
                break
            if should_stop is not None and bool(newly.any()):
                for row in rows[newly].tolist():
                    finished[index[row]] = True
                if should_stop(finished):
                    stopped = True
                    break
            n_done = int(done_w.sum())
            if n_done and 4 * n_done >= len(rows):
                keep = (~done_w).nonzero().squeeze(-1)  # (w',)
                if fast is not None:
                    fast.keep(keep)
                elif cache is not None:
                    cache.batch_select_indices(keep)
                mask, step_pos, nxt = mask[keep], step_pos[keep], nxt[keep]
                rows, done_w, budget_w = rows[keep], done_w[keep], budget_w[keep]
            mask = torch.cat([mask, (~done_w).long()[:, None]], dim=1)
            step_pos = step_pos + 1
            step_input = nxt[:, None]
        tokens_l, logps_l, lengths_l = tokens[:, :steps].tolist(), logps[:, :steps].tolist(), lengths.tolist()
        done_l, eos_l = done.tolist(), hit_eos.tolist()
        out = []
        for i, req in enumerate(requests):
            n_tok = min(lengths_l[i], steps)
            reason: FinishReason = "stop" if eos_l[i] else ("length" if done_l[i] else "abort")
            finished[index[i]] = done_l[i]
            out.append(self._finish(req, tokens_l[i][:n_tok], logps_l[i][:n_tok], reason))
        return out, stopped


def cache_keyword(model: Any) -> str:
    """The name under which ``model``'s forward takes its KV cache: ``cache`` since transformers 5.2x, where the old
    ``past_key_values`` still works but warns (FutureWarning) and goes away in 5.40; ``past_key_values`` before.
    Read from the forward's signature (``inspect.signature`` follows the deprecation decorator's wrapper), so the
    engine neither warns on a new transformers nor breaks on an old one; a wrapper whose forward names neither
    (``forward(**kw)``) gets the installed transformers' name."""
    import inspect

    forward = getattr(model, "forward", model)
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return _library_cache_keyword()
    if "cache" in params:
        return "cache"
    return "past_key_values" if "past_key_values" in params else _library_cache_keyword()


@functools.cache
def _library_cache_keyword() -> str:
    """The cache keyword of the installed transformers' causal LMs (read from Qwen2's, the built-in model's)."""
    import inspect

    from transformers import Qwen2ForCausalLM

    return "cache" if "cache" in inspect.signature(Qwen2ForCausalLM.forward).parameters else "past_key_values"


def _prefill(
    model: Any, inputs: list[list[int]], width: int, pad: int, device: torch.device
) -> tuple[Any, torch.Tensor]:
    """Run the prompt (+ prefix) of every row through ``model`` into one left-padded KV cache of ``width``.

    Identical inputs (the G rows of a fresh group) are computed once and their cache rows copied, and distinct
    inputs are run in buckets of similar length, so the prefill does not pay for padding: continued APRIL rows
    carry prefixes of very different lengths. Padded cache positions hold zeros and are masked by the caller's
    attention mask. Returns the cache and the last position's logits ``(B, V)`` (float)."""
    from transformers import DynamicCache

    uniq: dict[tuple[int, ...], int] = {}
    row_of = [uniq.setdefault(tuple(p), len(uniq)) for p in inputs]  # row -> unique input
    seqs = list(uniq)
    order = sorted(range(len(seqs)), key=lambda u: -len(seqs[u]))
    buckets: list[list[int]] = []
    for u in order:  # greedy: a bucket's rows are at least 3/4 as long as its longest
        if buckets and 4 * len(seqs[u]) >= 3 * len(seqs[buckets[-1][0]]):
            buckets[-1].append(u)
        else:
            buckets.append([u])
    # Filled slot by slot (every unique input gets its row), then stacked.
    keys: list[list[Any]] = []
    values: list[list[Any]] = []
    logits: list[Any] = [None] * len(seqs)
    for bucket in buckets:
        w = len(seqs[bucket[0]])
        ids = torch.full((len(bucket), w), pad, dtype=torch.long)
        mask = torch.zeros((len(bucket), w), dtype=torch.long)
        for j, u in enumerate(bucket):
            ids[j, w - len(seqs[u]) :] = torch.tensor(seqs[u], dtype=torch.long)
            mask[j, w - len(seqs[u]) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        cache = DynamicCache()
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
            **{cache_keyword(model): cache},
        )
        last = out.logits[:, -1, :].float()  # (b, V)
        for j, u in enumerate(bucket):
            logits[u] = last[j]
        layers: list[Any] = list(cache.layers)  # full-attention layers: ``keys``/``values`` (b, heads, w, d)
        for layer_idx, layer in enumerate(layers):
            if len(keys) <= layer_idx:
                keys.append([None] * len(seqs))
                values.append([None] * len(seqs))
            k, v = layer.keys, layer.values  # (b, heads, w, d)
            pad_w = width - w
            if pad_w:
                k = torch.nn.functional.pad(k, (0, 0, pad_w, 0))
                v = torch.nn.functional.pad(v, (0, 0, pad_w, 0))
            for j, u in enumerate(bucket):
                keys[layer_idx][u] = k[j]
                values[layer_idx][u] = v[j]
    index = torch.tensor(row_of, device=device)
    merged = DynamicCache()
    for layer_idx in range(len(keys)):
        k = torch.stack(keys[layer_idx])[index]  # (B, heads, width, d)
        v = torch.stack(values[layer_idx])[index]
        merged.update(k, v, layer_idx)
    return merged, torch.stack(logits)[index]

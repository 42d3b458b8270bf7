"""A lean one-token decode step for Llama-family causal LMs (Qwen2, Llama: the built-in models and SmolLM2).

The sampling loop of :class:`node.rollout.engine.TransformersEngine` calls the model once per generated token.
On the laboratory model (0.8M parameters, 4 layers) a transformers forward for one token spends almost all its time
in Python: some sixty module calls, a rotary table rebuilt every call, a mask built every call, and a
``DynamicCache`` that concatenates every layer's keys and values onto a new tensor each token (quadratic copying
over a completion). :class:`FastDecoder` does the same arithmetic directly on the model's own parameter tensors
(no copy: the learner's updates are seen at once) with a key/value cache allocated once for the whole completion,
the rotary angles of the new positions only, and attention as two batched matmuls (grouped-query heads without
repeating them).

It only decodes: the prefill (prompt + APRIL prefix) still goes through the transformers forward
(``engine._prefill``), whose cache it takes over. It reproduces the transformers forward to float rounding
(``tests/unit/node/test_decode.py`` compares logits token by token, with left padding, grouped heads and a
compacted batch); :func:`supports` says which models it takes, and anything else keeps the transformers path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

#: The configurations the decoder reproduces: plain rotary (no scaling), no sliding window, SiLU gated MLP.
_MODEL_TYPES = ("qwen2", "llama")


def supports(model: Any) -> bool:
    """Whether :class:`FastDecoder` reproduces ``model``'s forward: a Qwen2 or Llama causal LM with default rotary
    embeddings, full attention in every layer and a SiLU MLP (the built-in models, SmolLM2)."""
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or getattr(cfg, "model_type", None) not in _MODEL_TYPES:
        return False
    if type(model).__name__ not in ("Qwen2ForCausalLM", "LlamaForCausalLM"):
        return False  # a PEFT wrapper or a subclass may change the forward
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ())):
        return False
    if getattr(model, "hf_device_map", None) or not all(
        hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")
    ):
        return False  # weights dispatched or offloaded by accelerate live elsewhere than the module's tensors
    # Only plain linear layers with no hooks: a quantized, LoRA-wrapped or hooked layer computes something else.
    linears = [model.lm_head] + [
        m
        for layer in inner.layers
        for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                  layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
    ]  # fmt: skip
    modules = [model, *model.modules()]
    hooked = any(m._forward_hooks or m._forward_pre_hooks for m in modules)
    return not hooked and all(type(m) is torch.nn.Linear for m in linears)


class FastDecoder:
    """Decode one token a row per call, from the KV cache a transformers prefill left (``cache.layers``, each
    ``keys``/``values`` ``(B, kv_heads, width, head_dim)``), into buffers with room for ``max_new`` more tokens.

    :meth:`step` takes the same arguments as the transformers call it replaces: the new tokens ``(w, 1)``, the
    attention mask over every cached position plus the new one ``(w, n)``, and the new tokens' positions ``(w, 1)``;
    it returns the last position's logits ``(w, V)`` (float). :meth:`keep` drops finished rows (the cache's
    ``batch_select_indices``)."""

    def __init__(self, model: Any, cache: Any, max_new: int) -> None:
        inner = model.model
        self.model = model
        self.layers = list(inner.layers)
        first = self.layers[0].self_attn
        self.head_dim = int(first.head_dim)
        self.scaling = float(first.scaling)
        self.n_heads = int(model.config.num_attention_heads)
        self.n_kv = int(model.config.num_key_value_heads)
        self.eps = [
            (float(layer.input_layernorm.variance_epsilon), float(layer.post_attention_layernorm.variance_epsilon))
            for layer in self.layers
        ]
        self.norm_eps = float(inner.norm.variance_epsilon)
        rot = inner.rotary_emb
        self.inv_freq = rot.inv_freq.float()
        self.rot_scale = float(getattr(rot, "attention_scaling", 1.0))
        layers = list(cache.layers)
        width = int(layers[0].keys.shape[2])
        b = int(layers[0].keys.shape[0])
        ref = layers[0].keys
        self.k = torch.zeros((len(layers), b, self.n_kv, width + max_new, self.head_dim), dtype=ref.dtype,
                             device=ref.device)  # fmt: skip
        self.v = torch.zeros_like(self.k)
        for i, layer in enumerate(layers):
            self.k[i, :, :, :width] = layer.keys
            self.v[i, :, :, :width] = layer.values

    def keep(self, rows: Tensor) -> None:
        """Keep only the working rows ``rows`` (indices into the current batch)."""
        self.k = self.k[:, rows]
        self.v = self.v[:, rows]

    def _rope(self, pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        freqs = pos[..., None].float() * self.inv_freq  # (w, 1, d/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (w, 1, d)
        return (emb.cos() * self.rot_scale).to(dtype)[:, None], (emb.sin() * self.rot_scale).to(dtype)[:, None]

    @staticmethod
    def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @staticmethod
    def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(dtype)

    def step(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        w = input_ids.shape[0]
        n = attention_mask.shape[1]  # cached positions + this one
        slot = n - 1
        if n > self.k.shape[3]:
            raise ValueError(f"the decoder's cache holds {self.k.shape[3]} positions, the step needs {n}")
        inner = self.model.model
        x = F.embedding(input_ids, inner.embed_tokens.weight)  # (w, 1, H)
        cos, sin = self._rope(position_ids, x.dtype)  # (w, 1, 1, d)
        group = self.n_heads // self.n_kv
        bias = torch.zeros(attention_mask.shape, dtype=torch.float32, device=x.device)
        bias = bias.masked_fill(attention_mask == 0, float("-inf"))[:, None, None, :]  # (w, 1, 1, n)
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            eps_in, eps_post = self.eps[i]
            h = self._rms(x, layer.input_layernorm.weight, eps_in)
            q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(w, 1, self.n_heads, self.head_dim)
            k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(w, 1, self.n_kv, self.head_dim)
            v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(w, 1, self.n_kv, self.head_dim)
            q = self._rotate(q.transpose(1, 2), cos, sin)  # (w, heads, 1, d)
            k = self._rotate(k.transpose(1, 2), cos, sin)  # (w, kv, 1, d)
            self.k[i, :, :, slot] = k[:, :, 0]
            self.v[i, :, :, slot] = v.transpose(1, 2)[:, :, 0]
            # grouped-query attention as two batched matmuls: each key/value head serves its group of query heads
            # (in float32, as the fused kernels accumulate: in bf16 / fp16 this matches SDPA to the output's rounding)
            qg = q.reshape(w, self.n_kv, group, self.head_dim).float()
            scores = qg @ self.k[i, :, :, :n].float().transpose(-1, -2)  # (w, kv, g, n)
            probs = (scores * self.scaling + bias).softmax(-1)
            out = (probs @ self.v[i, :, :, :n].float()).to(x.dtype).reshape(w, 1, -1)  # (w, 1, heads * d)
            x = x + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            h = self._rms(x, layer.post_attention_layernorm.weight, eps_post)
            gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
            x = x + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        x = self._rms(x, inner.norm.weight, self.norm_eps)
        head = self.model.lm_head
        return F.linear(x[:, -1], head.weight, head.bias).float()  # (w, V)

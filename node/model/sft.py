"""Supervised fine-tuning on (prompt ids, completion ids) pairs: the warm starts of built models.

The loss covers completion tokens only (prompt positions are labelled -100); rows are right-padded so positions
start at 0 for every row. AdamW, linear warm-up, then cosine decay to 10% of the peak learning rate. Used by the
built-in model's build (``node.model.tiny``) and by warm-started variants of real models (``node.model.warm``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

logger = logging.getLogger(__name__)

Pair = tuple[list[int], list[int]]


def collate(batch: Sequence[Pair], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, labels)``, each ``(B, T)``; labels are the completion tokens, -100 elsewhere."""
    width = max(len(p) + len(c) for p, c in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (p, c) in enumerate(batch):  # right padding: positions start at 0 for every row
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p) : len(p) + len(c)] = torch.tensor(c)
        mask[i, : len(p) + len(c)] = 1
    return ids, mask, labels


def train_sft(
    model: Any,
    pairs: Sequence[Pair],
    *,
    batch_size: int,
    lr: float,
    warmup: int,
    pad_id: int,
    betas: tuple[float, float] = (0.9, 0.999),
    max_grad_norm: float = 1.0,
    progress: Callable[[int, int, float, float], None] | None = None,
) -> list[float]:
    """One pass over ``pairs`` in order, ``batch_size`` pairs a step; returns each step's loss. ``progress(step,
    total, loss, eta_s)`` is called about ten times. Leaves the model in eval mode."""
    if batch_size < 1 or not pairs:
        raise ValueError("need batch_size >= 1 and at least one pair")
    total = math.ceil(len(pairs) / batch_size)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=betas)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses = []
    t0 = time.perf_counter()
    for step in range(total):
        ids, mask, labels = (t.to(device) for t in collate(pairs[step * batch_size : (step + 1) * batch_size], pad_id))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress is not None and ((step + 1) % max(1, total // 10) == 0 or step + 1 == total):
            elapsed = time.perf_counter() - t0
            progress(step + 1, total, losses[-1], elapsed / (step + 1) * (total - step - 1))
    model.eval()
    return losses

"""B3 learner: one learner step (loss + backward + optimizer) against TRL's GRPOTrainer on the same batch.

Both sides start from the same randomly initialised Qwen2 model and see the same tensors (equal-length prompts,
right-padded completions of varied length, one micro-batch). Ours is ``node.learn.learner.Learner.step``; TRL's is
``GRPOTrainer._compute_loss`` + ``backward`` + gradient clipping + its own AdamW ``step`` (float32, no gradient
checkpointing: TRL's defaults of bf16 autocast and activation checkpointing are switched off so both do the same
arithmetic). Repeats alternate between the two; the table gives medians and the time ratio, plus the loss
difference and the largest parameter difference after the first update from identical weights.

    python benchmarks/systems/b3_learner.py            # full mode, writes benchmarks/results/b3_learner.md
    python benchmarks/systems/b3_learner.py --quick --out /tmp/b3
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402
from node.config import LearnerConfig  # noqa: E402
from node.learn.learner import Learner, TrainSample  # noqa: E402
from node.learn.losses import get_loss  # noqa: E402

logger = logging.getLogger(__name__)

FULL = dict(vocab=4096, hidden=256, layers=4, heads=8, kv_heads=2, batch=16, prompt=32, completion=96, repeats=7)
QUICK = dict(vocab=100, hidden=32, layers=2, heads=4, kv_heads=2, batch=4, prompt=4, completion=6, repeats=2)
LR, MAX_GRAD_NORM = 1e-4, 1.0


def _model(p: dict, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=p["vocab"],
        hidden_size=p["hidden"],
        intermediate_size=4 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        max_position_embeddings=p["prompt"] + p["completion"] + 8,
    )
    return Qwen2ForCausalLM(cfg)


def _batch(p: dict, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    b, t = p["batch"], p["completion"]
    prompt_ids = torch.randint(2, p["vocab"], (b, p["prompt"]), generator=g)
    completion_ids = torch.randint(2, p["vocab"], (b, t), generator=g)
    lengths = torch.randint(max(1, t // 4), t + 1, (b,), generator=g)
    lengths[0] = t
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(-1)).long()
    completion_ids = completion_ids.masked_fill(mask == 0, 0)
    rewards = torch.randint(0, 2, (b,), generator=g).float()
    adv = rewards - rewards.mean()
    samples = [
        TrainSample(prompt_ids[i].tolist(), completion_ids[i, : int(lengths[i])].tolist(), float(adv[i]))
        for i in range(b)
    ]
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "advantages": adv,
        "num_items_in_batch": mask.sum(),
    }
    return samples, inputs


def _trl_trainer(model, p: dict, loss: str, out_dir: str):
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    vocab = {f"t{i}": i for i in range(p["vocab"])}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t2")), pad_token="t0", eos_token="t1"
    )
    spec = get_loss(loss)
    args = GRPOConfig(
        output_dir=out_dir,
        loss_type=loss,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28 if spec.clip_higher else None,
        per_device_train_batch_size=p["batch"],
        num_generations=2,
        max_completion_length=p["completion"],
        learning_rate=LR,
        weight_decay=0.0,
        max_grad_norm=MAX_GRAD_NORM,
        gradient_checkpointing=False,
        bf16=False,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
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
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    trainer.create_optimizer()
    return trainer


def _trl_step(trainer, inputs) -> float:
    model, opt = trainer.model, trainer.optimizer
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_loss(p: dict, loss: str, device: torch.device, tmp: str) -> dict:
    base = _model(p)
    samples, inputs = _batch(p)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    cfg = LearnerConfig(loss=loss, lr=LR, max_grad_norm=MAX_GRAD_NORM, micro_batch_size=p["batch"])
    ours = Learner(copy.deepcopy(base), cfg, device=device, pad_token_id=0, max_tokens=p["completion"])
    trainer = _trl_trainer(copy.deepcopy(base).to(device), p, loss, tmp)

    # First update from identical weights: compare the losses and the updated parameters.
    our_loss = ours.step(samples)["loss"]
    trl_loss = _trl_step(trainer, inputs)
    their_params = dict(trainer.model.named_parameters())
    param_diff = max((q - their_params[n]).abs().max().item() for n, q in ours.model.named_parameters())

    wall: dict[str, list[float]] = {"ours": [], "trl": []}
    cpu: dict[str, list[float]] = {"ours": [], "trl": []}
    steps = {"ours": lambda: ours.step(samples), "trl": lambda: _trl_step(trainer, inputs)}
    for i in range(p["repeats"]):
        order = ("ours", "trl") if i % 2 == 0 else ("trl", "ours")
        for name in order:
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            steps[name]()
            _sync(device)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "loss": loss,
        "ours_ms": 1e3 * med["ours"],
        "trl_ms": 1e3 * med["trl"],
        "ratio": med["ours"] / med["trl"],
        "cpu_ratio": med_cpu["ours"] / med_cpu["trl"],
        "loss_diff": abs(our_loss - trl_loss),
        "param_diff": param_diff,
        "tokens": int(inputs["completion_mask"].sum()),
    }


def render(rows: list[dict], p: dict, mode: str, device: torch.device) -> str:
    lines = [
        "# B3 learner: one step (loss + backward + optimizer) vs TRL GRPOTrainer",
        "",
        f"* date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"* machine: {machine_info(('transformers', 'trl'))}",
        f"* mode: {mode}; device {device}; model Qwen2 random init, hidden {p['hidden']}, {p['layers']} layers, "
        f"vocab {p['vocab']}; batch {p['batch']} x (prompt {p['prompt']} + completion <= {p['completion']}); "
        f"median of {p['repeats']} interleaved repeats (order alternating) after one warm-up update; float32",
        "* target: time ratio <= 1.0; losses equal to 1e-5",
        "",
        "| loss | tokens | ours (ms) | TRL (ms) | wall ratio ours/TRL | CPU-time ratio | abs loss diff "
        "| max param diff after 1 step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['loss']} | {r['tokens']} | {r['ours_ms']:.1f} | {r['trl_ms']:.1f} | {r['ratio']:.2f} | "
            f"{r['cpu_ratio']:.2f} | "
            f"{r['loss_diff']:.2e} | {r['param_diff']:.2e} |"
        )
    lines += [
        "",
        "Ours reads pi_old from the trained forward pass (detached), TRL likewise uses `per_token_logps.detach()`"
        " when generation and optimisation are aligned; TRL computes logprobs with its chunked fused LM head, ours"
        " with `logits_to_keep` + gather/logsumexp. Timings on a shared CPU are noisy: read the ratios, not the ms; the"
        " CPU-time ratio (process CPU seconds) is less sensitive to other processes than the wall-clock one.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 2 repeats (the test runs this)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="directory of b3_learner.md")
    ap.add_argument("--repeats", type=int, default=None, help="override the number of timed repeats")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    p = dict(QUICK if args.quick else FULL)
    if args.repeats:
        p["repeats"] = args.repeats
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_loss(p, loss, device, tmp) for loss in ("grpo", "dapo", "dr_grpo")]
    md = render(rows, p, "quick" if args.quick else "full", device)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "b3_learner.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

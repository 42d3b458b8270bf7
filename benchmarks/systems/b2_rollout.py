"""B2 rollout: completions/s and tokens/s of ``TransformersEngine`` vs plain ``model.generate``, side by side.

Both sample the same prompts (default task, plain template) from the same built-in tiny model with the same
settings (temperature 1, top-p 1, EOS stopping, ``max_new_tokens``); for each batch size the two alternate for
``--repeats`` rounds and the median time of each is reported. Tokens counted are generated tokens up to and
including EOS (padding after EOS is not counted). ``model.generate`` returns no logprobs here, so the baseline
does strictly less work than the engine.

    python benchmarks/systems/b2_rollout.py            # full: batches 16 and 64, 5 repeats, default model
    python benchmarks/systems/b2_rollout.py --quick    # smoke run: small model, 1 repeat

Writes ``benchmarks/results/b2_rollout.md`` (or ``--out``) with machine info and the date.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems.harness import RESULTS, parser, report  # noqa: E402


def run_generate(policy, prompt_ids: list[list[int]], max_new_tokens: int, seed: int) -> int:
    """Plain ``model.generate`` on a left-padded batch; returns the generated tokens incl. EOS."""
    import torch

    tok = policy.tokenizer
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = policy.model.generate(
            input_ids=ids.to(policy.device),
            attention_mask=mask.to(policy.device),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            eos_token_id=policy.eos_token_ids,
            pad_token_id=tok.pad_token_id,
        )
    gen = out[:, width:].tolist()
    eos = set(policy.eos_token_ids)
    total = 0
    for row in gen:
        n = len(row)
        for j, t in enumerate(row):
            if t in eos:
                n = j + 1
                break
        total += n
    return total


def main(argv: list[str] | None = None) -> int:
    quick = "smoke run: reduced model, small batches, 1 repeat"
    ap = parser(__doc__.split("\n")[0], quick, RESULTS, "directory of b2_rollout.md")
    ap.add_argument("--cache-dir", type=Path, default=None, help="built-in model cache (default: user cache)")
    ap.add_argument("--batches", type=int, nargs="*", default=None, help="batch sizes (default 16 64)")
    ap.add_argument("--repeats", type=int, default=None, help="rounds per batch size (default 5)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args(argv)

    import torch

    from node.config import ModelConfig, TaskConfig
    from node.model import tiny
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine
    from node.tasks import TaskSource

    if args.threads:
        torch.set_num_threads(args.threads)
    batches = args.batches or ([4, 8] if args.quick else [16, 64])
    repeats = args.repeats or (1 if args.quick else 5)
    max_new = 8 if args.quick and args.max_new_tokens == 32 else args.max_new_tokens
    recipe = tiny.SMALL_RECIPE if args.quick else tiny.DEFAULT_RECIPE
    t0 = time.perf_counter()
    path = tiny.ensure_built(args.cache_dir, recipe)
    policy = load_policy(ModelConfig(name=str(path)))
    load_s = time.perf_counter() - t0
    src = TaskSource(TaskConfig())
    items = [src.materialize(r) for r in src.sample(random.Random(0), max(batches))]
    prompts = [policy.format_prompt(it.question) for it in items]
    engine = TransformersEngine(policy, batch_size=max(batches))

    rows = []
    for b in batches:
        batch_prompts = prompts[:b]
        batch_ids = [policy.encode(p) for p in batch_prompts]
        engine.generate(batch_prompts, 1, max_new_tokens=max_new, seed=0)  # warm-up both paths
        run_generate(policy, batch_ids, max_new, 0)
        t_eng, t_gen, n_eng, n_gen = [], [], [], []
        for r in range(repeats):
            t = time.perf_counter()
            outs = engine.generate(batch_prompts, 1, max_new_tokens=max_new, seed=r)
            t_eng.append(time.perf_counter() - t)
            n_eng.append(sum(len(c.token_ids) for o in outs for c in o))
            t = time.perf_counter()
            n_gen.append(run_generate(policy, batch_ids, max_new, r))
            t_gen.append(time.perf_counter() - t)
        me, mg = statistics.median(t_eng), statistics.median(t_gen)
        tok_e, tok_g = statistics.median(n_eng) / me, statistics.median(n_gen) / mg
        rows.append((b, b / me, tok_e, b / mg, tok_g, mg / me))

    params = sum(p.numel() for p in policy.model.parameters())
    header = (
        "| batch | engine compl/s | engine tok/s | generate compl/s | generate tok/s | speed-up (compl/s) |\n"
        "|---:|---:|---:|---:|---:|---:|"
    )
    lines = [f"| {b} | {ce:.1f} | {te:.0f} | {cg:.1f} | {tg:.0f} | {r:.2f}x |" for b, ce, te, cg, tg, r in rows]
    table = "\n".join([header, *lines])
    print(table)
    mode = "quick (reduced model)" if args.quick else "full"
    facts = [
        f"mode: {mode}; model builtin:tiny recipe {recipe.key()} ({params / 1e6:.2f}M params), load {load_s:.1f}s",
        f"sampling: temperature 1, top-p 1, max_new_tokens {max_new}, 1 completion per prompt, "
        f"median of {repeats} alternating repeats; tokens counted up to and including EOS",
    ]
    return report(args.out / "b2_rollout.md", "B2 rollout: TransformersEngine vs model.generate", facts, table)


if __name__ == "__main__":
    sys.exit(main())

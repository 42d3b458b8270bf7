"""B2 APRIL: completed groups/s of the rollout engine with APRIL partial rollouts vs the same engine without APRIL.

Workload: a long-tail length mix. The built-in tiny model's own answers are short and even, so its EOS
probability is overridden: at every position EOS has probability ``h`` (the rest of the distribution keeps the
model's relative probabilities). Completion lengths are then i.i.d. geometric with mean ``1/h`` (an exponential
tail), truncated at ``max_new_tokens``; a group of G completions ends with its longest one, so group lengths are
long-tailed. Both arms sample the same way from the same engine (``TransformersEngine``), per step:

* baseline: ``prompts`` fresh groups of G completions, generated to the end (``engine.generate``);
* APRIL: ``ceil(oversample * prompts)`` groups in flight (buffered partial groups first), stopped as soon as
  ``prompts`` groups are complete; the rest stay buffered and are continued next step
  (``node.rollout.april.run_round``).
  The policy version is bumped after every step (as the learner would), so continued tokens count as off-policy.

Each repeat runs ``--warmup`` untimed steps, then ``--steps`` timed steps of each arm (arms alternate); reported are
completed groups/s and tokens/s (median over repeats) and their ratio, plus APRIL's off-policy token share and
buffer size. Tokens still in APRIL's buffer at the end are not credited (conservative).

    python benchmarks/systems/b2_april.py            # full: default tiny model, 8 groups x G=8, 5 repeats
    python benchmarks/systems/b2_april.py --quick    # smoke run: reduced model, 1 repeat

Writes ``benchmarks/results/b2_april.md`` (or ``--out``) with machine info and the date.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems.harness import RESULTS, parser, report  # noqa: E402


def stop_hazard_model(model, eos_ids: list[int], hazard: float):
    """Wrap a causal LM so the first EOS id has probability ``hazard`` at every position (other EOS ids none).

    ``z_eos = logsumexp(z_other) + log(h / (1 - h))`` gives ``softmax(z)[eos] = h`` exactly."""
    import torch

    class StopHazard(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model
            self.generation_config = getattr(model, "generation_config", None)

        def forward(self, **kw):
            logits = self.inner(**kw).logits.float()  # (B, K, V)
            for e in eos_ids:
                logits[..., e] = float("-inf")
            other = torch.logsumexp(logits, dim=-1)  # (B, K)
            logits[..., eos_ids[0]] = other + math.log(hazard / (1.0 - hazard))
            return SimpleNamespace(logits=logits)

    return StopHazard()


def run_baseline(engine, prompts: list[str], steps: int, g: int, max_new: int, seed: int) -> tuple[int, int, float]:
    """``steps`` plain steps of ``len(prompts)`` groups; returns (groups, tokens, seconds)."""
    groups = tokens = 0
    t0 = time.perf_counter()
    for s in range(steps):
        out = engine.generate(prompts, g, max_new_tokens=max_new, seed=seed + s)
        groups += len(out)
        tokens += sum(len(c.token_ids) for grp in out for c in grp)
        engine.set_policy_version(engine.policy_version + 1)
    return groups, tokens, time.perf_counter() - t0


class AprilArm:
    """APRIL's rollout loop over a persistent buffer (the planner's APRIL path without task scoring)."""

    def __init__(self, engine, prompt_ids: list[list[int]], g: int, max_new: int, oversample: float) -> None:
        from node.rollout.april import AprilBuffer

        self.engine, self.prompt_ids, self.g, self.max_new, self.oversample = engine, prompt_ids, g, max_new, oversample
        self.buffer = AprilBuffer()
        self.next_prompt = 0
        self.offpolicy: list[float] = []
        self.buffer_sizes: list[int] = []

    def step(self, target: int, seed: int) -> tuple[int, int]:
        from node.rollout.april import PendingGroup, groups_in_flight, run_round

        want = groups_in_flight(target, self.oversample)
        carried = self.buffer.groups[:want]
        fresh = []
        for _ in range(want - len(carried)):
            ids = self.prompt_ids[self.next_prompt % len(self.prompt_ids)]
            fresh.append(PendingGroup(f"p{self.next_prompt}", {}, ids, self.max_new, [None] * self.g))
            self.next_prompt += 1
        complete, incomplete, stats = run_round(
            self.engine, carried + fresh, target, temperature=1.0, top_p=1.0, seed=seed
        )
        self.buffer.groups = incomplete + self.buffer.groups[want:]
        self.engine.set_policy_version(self.engine.policy_version + 1)
        self.offpolicy.append(stats.metrics(self.buffer)["april_offpolicy_token_share"])
        self.buffer_sizes.append(len(self.buffer))
        return len(complete), sum(len(c.token_ids) for grp in complete for c in grp.completions)

    def run(self, steps: int, target: int, seed: int) -> tuple[int, int, float]:
        groups = tokens = 0
        t0 = time.perf_counter()
        for s in range(steps):
            n, k = self.step(target, seed + s)
            groups += n
            tokens += k
        return groups, tokens, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    quick = "smoke run: reduced model, small batch, 1 repeat"
    ap = parser(__doc__.split("\n")[0], quick, RESULTS, "directory of b2_april.md")
    ap.add_argument("--cache-dir", type=Path, default=None, help="built-in model cache (default: user cache)")
    ap.add_argument("--prompts", type=int, default=None, help="groups per step (default 8; quick 2)")
    ap.add_argument("--group-size", type=int, default=None, help="G (default 8; quick 4)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="token budget (default 128; quick 32)")
    ap.add_argument("--mean-length", type=float, default=None, help="mean completion length 1/h (default 16)")
    ap.add_argument("--oversample", type=float, default=2.0, help="APRIL groups in flight / groups needed")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per arm per repeat (default 6; quick 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per arm per repeat (default 2)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats (default 5; quick 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier on a shared box)")
    args = ap.parse_args(argv)

    import torch

    from node.config import ModelConfig, TaskConfig
    from node.model import tiny
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine
    from node.tasks import TaskSource

    if args.threads:
        torch.set_num_threads(args.threads)
    q = args.quick
    target = args.prompts or (2 if q else 8)
    g = args.group_size or (4 if q else 8)
    max_new = args.max_new_tokens or (32 if q else 128)
    mean_len = args.mean_length or (8.0 if q else 16.0)
    steps = args.steps or (2 if q else 6)
    warmup = args.warmup if args.warmup is not None else (1 if q else 2)
    repeats = args.repeats or (1 if q else 5)
    recipe = tiny.SMALL_RECIPE if q else tiny.DEFAULT_RECIPE
    policy = load_policy(ModelConfig(name=str(tiny.ensure_built(args.cache_dir, recipe)), device="cpu"))
    hazard = 1.0 / mean_len
    policy = replace(policy, model=stop_hazard_model(policy.model, list(policy.eos_token_ids), hazard))
    src = TaskSource(TaskConfig())
    items = [src.materialize(r) for r in src.sample(random.Random(0), 256)]
    prompts = [policy.format_prompt(it.question) for it in items]
    prompt_ids = [policy.encode(p) for p in prompts]
    engine = TransformersEngine(policy, batch_size=4096)  # one batch per call: the whole step in flight

    base_gps, april_gps, base_tps, april_tps, ratios = [], [], [], [], []
    offpolicy, buffers = [], []
    for r in range(repeats):
        seed = 1000 * r
        step_prompts = [prompts[(seed + i) % len(prompts)] for i in range(target)]
        run_baseline(engine, step_prompts, warmup, g, max_new, seed)
        arm = AprilArm(engine, prompt_ids, g, max_new, args.oversample)
        arm.run(warmup, target, seed)
        bg, bt, bs = run_baseline(engine, step_prompts, steps, g, max_new, seed + 100)
        ag, at, as_ = arm.run(steps, target, seed + 100)
        base_gps.append(bg / bs)
        april_gps.append(ag / as_)
        base_tps.append(bt / bs)
        april_tps.append(at / as_)
        ratios.append((ag / as_) / (bg / bs))
        offpolicy.extend(arm.offpolicy[warmup:])
        buffers.extend(arm.buffer_sizes[warmup:])

    med = statistics.median
    header = (
        "| arm | completed groups/s | tokens/s (completed groups) | groups/s ratio | off-policy token share "
        "| buffer (groups, mean) |\n|---|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| without APRIL | {med(base_gps):.2f} | {med(base_tps):.0f} | 1.00x | 0 | 0 |",
        f"| APRIL {args.oversample:g}x | {med(april_gps):.2f} | {med(april_tps):.0f} | {med(ratios):.2f}x "
        f"| {statistics.fmean(offpolicy):.3f} | {statistics.fmean(buffers):.1f} |",
    ]
    table = "\n".join([header, *lines])
    print(table)
    params = sum(p.numel() for p in policy.model.parameters())
    facts = [
        f"mode: {'quick (reduced model)' if q else 'full'}; model builtin:tiny recipe {recipe.key()} "
        f"({params / 1e6:.2f}M params), TransformersEngine",
        f"workload: {target} groups/step x G={g}; lengths geometric, mean {mean_len:g} tokens "
        f"(EOS probability {hazard:.4f} per token), cap {max_new}; APRIL oversample {args.oversample:g}",
        f"{steps} timed steps per arm after {warmup} warm-up steps, arms alternating; median of {repeats} "
        f"repeats (per-repeat ratios: {', '.join(f'{x:.2f}' for x in ratios)})",
    ]
    title = "B2 APRIL: completed groups/s with APRIL partial rollouts vs the same engine without APRIL"
    return report(args.out / "b2_april.md", title, facts, table)


if __name__ == "__main__":
    sys.exit(main())

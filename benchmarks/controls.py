"""Controls: does a peer's completion carry something a node cannot get alone? (the sharing comparison)

The laboratory model (``builtin:lab``) in the deterministic in-process simulator, many seeds, every arm at the same
number of learner updates (one a step, the same steps), paired by seed: a seed gives every arm the same initial
models and task draws.

Settings (``configs/sim/controls-<setting>.yaml``; the YAML's configurations are the arms):

* ``het``: specialised nodes, as in the laboratory demo. Node 0 is warm-started on traces of ``lab_add`` with a
  fifth as many of ``lab_sub``, node 1 the other way round, so each *half-knows* one family (its lacking family):
  held-out pass@8 about 0.2, pass@1 about 0.06 (dev side, ``benchmarks/results/controls.md``).
* ``homo``: identical nodes (the default laboratory recipe), SAPO's own setting: 8/0 against 4/4.
* ``smol``: ``het`` on a real model, SmolLM2-135M-Instruct: each node warm-started on written working (traces) of one
  family with a fifth as much of the other, completions up to 192 new tokens; arms (a), (b), (d); 3 seeds. The
  stock model (no warm start) is evaluated on the same items at the same budget, so recovery and new skill are
  told apart.

Arms:

* (a) ``alone``: RL on own groups only (8 a step);
* (b) ``labels``: (a) plus supervised training on the node's own gold labels, bare ``<answer>x</answer>``, of its
  lacking family (``het``) or of both families (``homo``), credited ``1 - b`` (``labels``): what the task generator
  gives every node for free;
* (c) ``share``: SAPO group credit, 8 own + 8 peers' groups (``homo``: 4 + 4);
* (d) ``receiver``: receiver credit, peers' solved completions credited ``1 - b`` (``sapo.peer_advantage``), solved
  groups published;
* (e) ``answers``: (d) with every peer completion stripped to its ``<answer>`` tag (``sapo.peer_text: answer``):
  labels only, from peers;
* (f) ``stronger``: (d) taking peers' groups only where the peer's solve share beats the node's own rate
  (``sapo.peer_groups: stronger``), so a node learns a family's working only from peers that do it better.

(a') ``alone-3e5`` (``het`` only): (a) at lr 3e-5, a laboratory node's own dev-chosen rate. NOT pre-registered: added
after reading the 5-seed interim, because every arm runs at 1e-4 and alone declines there; it answers "does sharing
only beat a node hurt by the shared rate?" and is reported beside the verdict, never in it.

PRE-REGISTRATION (fixed before the first test-side run; the pilot that chose the setting read the dev side only)

* Set-up (``configs/sim/controls-het.yaml``, chosen on the DEV side, ``benchmarks/results/controls_pilot.md``): 60
  steps of 8 prompts x G = 8, lr 1e-4 for every arm (on dev, alone's lacking family ended the same at 3e-5 and
  1e-4; 3e-4 collapsed a sharing node), 8 peer groups a step from the one peer (``max_per_peer: 8``).
* ``homo`` (``configs/sim/controls-homo.yaml``): 4 identical nodes, 40 steps of 8 x 8, lr 3e-5 (B7's dev-chosen
  rate), 4 own + 4 peers' groups in the sharing arms, arms (a)-(e); (b) labels both families.
* Metric: held-out TEST-side exact accuracy (mean over 8 samples a problem, the evaluation's ``accuracy``), 64
  problems a family, at the FINAL step (``steps`` of the YAML), nothing else read as the result.
  ``het``: each node's lacking family (node 0 ``lab_sub``, node 1 ``lab_add``), averaged over the two nodes, per
  seed. ``homo``: both families, all nodes, averaged, per seed.
* Analysis: per seed, arm minus arm (paired), mean and 95% t-interval over the seeds (10 or more); pass@8 of the
  same problems beside it, and the own (known) family's exact, so harm is visible.
* Target (``het``): some sharing arm (c, d or f) beats (a) and (b) with the interval's lower end above 0, and beats
  (e) likewise. Anything else is reported as not met, with what limits it.
* Target (``homo``, added 2026-11-28 before its first run, with no homo result read on any side): the same rule
  over arms (c) and (d): some sharing arm beats (a) and (b) with the interval's lower end above 0, and beats (e)
  likewise. (c) against (a) is SAPO's own claim (4/4 against 8/0) and is reported whatever the verdict. Both
  families, all four nodes, final step (40), test side, 10 seeds.
* ``smol`` (``configs/sim/controls-smol.yaml``; written 2026-11-28 before any SmolLM2 run of it, on either side):
  30 steps of 4 prompts x G = 8, lr 1e-5 (the pretrained default, not tuned), 4 own + 4 peers' groups in (d),
  16 own gold labels a step in (b); the metric, readout and analysis of ``het`` (lacking family, test side, final
  step, paired by seed, 95% t-interval; 32 problems a family x 8 samples, no greedy); 3 seeds (0-2). Target: (d)
  beats (a) and (b) with the interval's lower end above 0. A dev-side pilot may change only the warm starts'
  size (so the lacking family is half-known: pass@8 well above pass@1) and, from its step timing alone, the step
  count (30 to 60), never the arms, the rate or the readout.
* Defaults (decision rule, written 2026-11-28 before any homo pair was read): ``sapo.peer_advantage`` becomes
  ``receiver`` with ``publish_solved: true`` if, in ``homo``, (d) is not below (a) or (c) beyond its 95% interval
  (het already shows it beating every control); otherwise the default stays ``group`` and the config says why.
* Cost, not readout (2026-11-28, after the first homo pairs had run 20 steps on 2 contended cores, about 25 minutes;
  no pair finished; one node's step-20 evaluation line scrolled past in the log, nothing else read): the identical
  initial models are evaluated once for every pair (``eval.at_start: false``: ``run_start``), and the step-20
  evaluation is dropped. The readout is unchanged.

    python benchmarks/controls.py --setting het --seeds 0-9 --workers 2     # runs what is missing, then reports
    python benchmarks/controls.py --setting het --analyze                    # report only
    python benchmarks/controls.py --setting het --quick                      # the YAML's quick overrides (a test)
    python benchmarks/controls.py --setting smol --seeds 0-2                 # SmolLM2: one pair at a time, 2 threads

Writes ``benchmarks/results/controls_<setting>.md`` / ``.json`` / ``.png`` (or under ``--out``); a reading written by
hand into ``controls_<setting>_reading.md`` beside them is appended to the report at every rewrite.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402
from benchmarks.common.multirun import read_evals, write_results  # noqa: E402

#: Node index -> the family it lacks, for the ``het`` setting's primary metric.
LACKING = {0: "lab_sub", 1: "lab_add"}
KNOWN = {0: "lab_add", 1: "lab_sub"}
#: Settings of specialised nodes, read on each node's lacking family.
SPECIALISED = ("het", "smol")
#: Sharing arms and the comparisons the target names (arm, control).
SHARING = ("share", "receiver", "stronger")
COMPARISONS = [
    *[(s, c) for s in SHARING for c in ("alone", "labels", "answers")],
    ("labels", "alone"),
    ("answers", "alone"),
    ("receiver", "share"),  # the defaults' decision rule
    *[(s, "alone-3e5") for s in SHARING],  # the reference added after the interim (not in the verdict)
]
#: The controls the pre-registered target names, per setting: ``smol`` runs (a), (b) and (d) only, and its target
#: is (d) beating (a) and (b) (module docstring).
_LAB_TARGET = (("alone", "labels", "answers"), "(a) alone, (b) labels and (e) answers")
TARGET_CONTROLS = {"het": _LAB_TARGET, "homo": _LAB_TARGET, "smol": (("alone", "labels"), "(a) alone and (b) labels")}


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += list(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def pair_done(run_dir: Path, nodes: int, steps: int) -> bool:
    """Every node evaluated at the last step (the in-process simulator writes evaluations as they happen)."""
    return all((e := read_evals(run_dir / f"node{i}")) and e[-1]["step"] >= steps for i in range(nodes))


def run_pending(
    sim: Any,
    work: Path,
    seeds: list[int],
    have: Collection[tuple[str, int]] = (),
    after_each: Callable[[], None] | None = None,
) -> None:
    """Run every (arm, seed) pair not finished yet; an unfinished pair's directory is cleared and run again (the
    in-process simulator keeps no checkpoints). With one worker the pairs run one at a time and ``after_each``
    runs after each (the report is rewritten, so a session that ends mid-run keeps every finished pair)."""
    from sim.runner import run_experiment

    pending = []
    for seed in seeds:
        for arm in [c.name for c in sim.configurations]:
            run_dir = work / arm / f"seed{seed}"
            if (arm, seed) in have or pair_done(run_dir, sim.nodes, sim.steps):
                continue
            shutil.rmtree(run_dir, ignore_errors=True)
            pending.append((arm, seed))
    print(f"{len(pending)} pairs to run", file=sys.stderr, flush=True)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if sim.workers > 1 or after_each is None:
        if pending:
            run_experiment(sim, work, progress=progress, pairs=pending)
        return
    for pair in pending:
        run_experiment(sim, work, progress=progress, pairs=[pair])
        after_each()


def _family_value(ev: dict[str, Any], fam: str, key: str) -> float:
    v = ev["families"][fam].get(key)
    return math.nan if v is None else float(v)  # pass@8 of an evaluation with fewer samples


def seed_values(run_dir: Path, nodes: int, setting: str, key: str, when: int) -> dict[str, float]:
    """The seed's metric ``key`` (``accuracy``, ``pass_at_8``) at evaluation step ``when``: the lacking family
    (``het``), the known one, and every family (``all``), averaged over nodes."""
    lacking, known, every = [], [], []
    for i in range(nodes):
        evs = {e["step"]: e for e in read_evals(run_dir / f"node{i}")}
        ev = evs[when]
        fams = sorted(ev["families"])
        every += [_family_value(ev, f, key) for f in fams]
        if setting in SPECIALISED:
            lacking.append(_family_value(ev, LACKING[i], key))
            known.append(_family_value(ev, KNOWN[i], key))
    out = {"all": statistics.fmean(every)}
    if lacking:
        out |= {"lacking": statistics.fmean(lacking), "known": statistics.fmean(known)}
    return out


#: Student's t 0.975 quantiles for 1..30 degrees of freedom (no scipy dependency for one table).
_T975 = (
    *(12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131),
    *(2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042),
)


def t975(df: int) -> float:
    """The two-sided 95% t multiplier; above 30 degrees of freedom the normal's 1.96 plus a 1/df correction."""
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95% t-interval of ``xs`` (at least two values)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    half = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def arm_keys(sim: Any) -> dict[str, str]:
    """What decides an arm's numbers (the experiment without its seed list, worker count and other arms, the arm's
    own settings, and every node's resolved config without its seed, so a changed default counts too), per arm: a
    saved pair is reused only under the same key, and adding an arm keeps the others' pairs."""
    d = sim.model_dump(mode="json")
    arms = {c["name"]: c for c in d.pop("configurations")}
    for k in ("seeds", "workers"):
        d.pop(k, None)

    def nodes(arm: str) -> list[dict[str, Any]]:
        return [{**sim.node_config(arm, i, 0).model_dump(mode="json"), "seed": None} for i in range(sim.nodes)]

    return {
        name: hashlib.sha256(json.dumps([d, arm, nodes(name)], sort_keys=True).encode()).hexdigest()[:16]
        for name, arm in arms.items()
    }


def saved_pairs(path: Path, keys: dict[str, str]) -> dict[str, dict[int, dict[str, Any]]]:
    """The finished pairs of an earlier report of this experiment (``<stem>.json``), so a run resumed on a machine
    without the run directory (a later session) keeps them; an arm whose settings changed keeps none."""
    if not path.is_file():
        return {}
    old = json.loads(path.read_text())
    out = {}
    for arm, seeds in old.get("pairs", {}).items():
        if old.get("arm_keys", {}).get(arm) == keys.get(arm):
            out[arm] = {int(k): v for k, v in seeds.items()}
        else:
            print(f"{path.name}: arm {arm} was another experiment; its pairs are not reused", file=sys.stderr)
    return out


def saved_start(path: Path, sim: Any) -> dict[str, Any] | None:
    """The shared start of an earlier report of this experiment, if its models and evaluation are the same."""
    if not path.is_file():
        return None
    start = json.loads(path.read_text()).get("shared_start")
    return start if start and start.get("key") == start_key(sim) else None


#: What a pair keeps per evaluation step: exact accuracy, pass@8, and the majority-answer baseline of the same
#: problems (always giving their most common gold answer: what an accuracy must beat to show any skill).
RECORDED = ("accuracy", "pass_at_8", "majority_baseline")


def pair_record(run_dir: Path, sim: Any, setting: str) -> dict[str, Any]:
    """A finished pair's metrics at every evaluation step: {"steps": {step: {metric: {lacking, known, all}}}}."""
    steps = sorted({e["step"] for e in read_evals(run_dir / "node0")})
    return {"steps": {str(step): {k: seed_values(run_dir, sim.nodes, setting, k, step)
                                  for k in RECORDED} for step in steps}}  # fmt: skip


def majority_line(data: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """The majority-answer baseline of the primary metric's problems, from any pair that recorded it (the problems
    are the same in every pair; pairs saved before it was kept carry none)."""
    for arm in data.values():
        for rec in arm.values():
            maj = rec["end"].get("majority_baseline")
            if maj and not any(math.isnan(v) for v in maj.values()):
                parts = ", ".join(f"{k} {v:.3f}" for k, v in maj.items())
                return [f"Majority-answer baseline (always the most common gold answer of the evaluated problems; an "
                        f"exact accuracy at or below it shows no skill): {parts}.", ""]  # fmt: skip
    return []


def collect(
    work: Path,
    sim: Any,
    setting: str,
    saved: dict[str, dict[int, dict[str, Any]]] | None = None,
    start: dict[str, Any] | None = None,
):
    """arm -> seed -> {"steps": ..., "start": ..., "end": ...} for every finished pair: on disk, else saved. A pair
    without a step-0 evaluation of its own (``eval.at_start: false``) takes ``start``, the shared one."""
    data: dict[str, dict[int, dict[str, Any]]] = {}
    for arm in [c.name for c in sim.configurations]:
        pairs = dict((saved or {}).get(arm, {}))
        for seed_dir in sorted((work / arm).glob("seed*")):
            if pair_done(seed_dir, sim.nodes, sim.steps):
                pairs[int(seed_dir.name[4:])] = pair_record(seed_dir, sim, setting)
        for seed, rec in sorted(pairs.items()):
            if seed in sim.seeds:
                steps = rec["steps"] if "0" in rec["steps"] or start is None else {"0": start, **rec["steps"]}
                data.setdefault(arm, {})[seed] = {**rec, "steps": steps, "start": steps["0"],
                                                  "end": steps[str(sim.steps)]}  # fmt: skip
    return data


def shared_start(sim: Any) -> bool:
    """Whether the experiment evaluates its initial models once for every pair (``eval.at_start: false``)."""
    return not sim.node_config(sim.configurations[0].name, 0, sim.seeds[0]).eval.at_start


def start_key(sim: Any) -> str:
    """What decides the shared start's numbers: every node's model and evaluation, and the tasks."""
    arm = sim.configurations[0].name
    parts = [_eval_key(sim.node_config(arm, i, sim.seeds[0])) for i in range(sim.nodes)]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _eval_key(cfg: Any) -> str:
    """What decides a node's initial evaluation: its model, tasks, evaluation and sampling settings."""
    return json.dumps([cfg.model_dump(mode="json")[k] for k in ("model", "tasks", "eval", "rollout")], sort_keys=True)


def _evaluate_initial(cfg: Any, run_dir: Path, done: dict[str, Path]) -> None:
    """Evaluate ``cfg``'s initial model into ``run_dir/eval.jsonl`` at step 0 (as a node's step-0 evaluation).
    ``done`` maps what decides an evaluation (model, tasks, evaluation, sampling) to a directory that already holds
    it: identical nodes (the homogeneous setting, or a stock model that is the node's own) are evaluated once."""
    import yaml

    from node.eval import append_result, evaluate_run

    what = _eval_key(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not any(e["step"] == 0 for e in read_evals(run_dir)):
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        if what in done:
            shutil.copyfile(done[what] / "eval.jsonl", run_dir / "eval.jsonl")
        else:
            append_result(run_dir, evaluate_run(run_dir, initial=True))
    done.setdefault(what, run_dir)


def _evaluate_nodes(nodes: list[Any], run_dir: Path, done: dict[str, Path]) -> None:
    """Every node's initial model evaluated into ``run_dir/node<i>`` (:func:`_evaluate_initial`)."""
    for i, cfg in enumerate(nodes):
        _evaluate_initial(cfg, run_dir / f"node{i}", done)


def initial_digests(nodes: list[Any]) -> list[str]:
    """Each node's initial weights as the node loads them (built or warm-started here if not cached), hashed: the
    same digests are the same start. A warm start rebuilt on another machine is checked against the saved one."""
    import torch

    from node.model.policy import load_policy

    out = []
    for cfg in nodes:
        model = load_policy(cfg.model).model
        h = hashlib.sha256()
        for name, t in sorted(model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        out.append(h.hexdigest()[:16])
        del model
    return out


def checked_start(saved: dict[str, Any], nodes: list[Any], work: Path, sim: Any, setting: str) -> dict[str, Any]:
    """The saved shared start, once the initial models built here are known to be the ones it was evaluated on: the
    same weight digests, or (a start saved before digests were kept) the same step-0 evaluation, run again here
    once. A different start would unpair every pair still to run from the finished ones, so it stops the run."""
    digests = initial_digests(nodes)
    if saved.get("digests") == digests:
        return saved
    if saved.get("digests") is not None:
        raise SystemExit(
            f"the initial models built here (weights {digests}) are not the ones the saved shared start was "
            f"evaluated on ({saved['digests']}): a different torch, machine or warm-start code; pairs run now would "
            "not pair with the finished ones. Run on the saved start's machine, or start the experiment afresh "
            "(remove its report JSON)."
        )
    t0 = time.perf_counter()
    _evaluate_nodes(nodes, work / "start-check", {})
    record = pair_record(work / "start-check", sim, setting)["steps"]["0"]
    print(f"saved shared start checked in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    if record != saved["record"]:
        raise SystemExit(
            f"the initial models built here evaluate to {record}, not the saved shared start's {saved['record']}: "
            "pairs run now would not pair with the finished ones. Run on the saved start's machine, or start the "
            "experiment afresh (remove its report JSON)."
        )
    return {**saved, "digests": digests}


def run_start(
    sim: Any, work: Path, setting: str, saved: dict[str, Any] | None, threads: int, digests: bool = True
) -> dict[str, Any]:
    """The shared start: every node's initial model evaluated once, and the stock model (the configured model
    without its warm start) on the same items at the same token budget, so a gain can be told from recovering what
    the stock model already had. Reused from the saved report when its key matches."""
    key = start_key(sim)
    import torch

    from node.cli.logs import setup_cli_logging

    setup_cli_logging("INFO")  # a warm start or a model conversion takes minutes: its progress lines show
    torch.set_num_threads(threads)
    arm = sim.configurations[0].name
    nodes = [sim.node_config(arm, i, sim.seeds[0]) for i in range(sim.nodes)]
    if saved and saved.get("key") == key:
        return checked_start(saved, nodes, work, sim, setting)
    t0 = time.perf_counter()
    done: dict[str, Path] = {}
    _evaluate_nodes(nodes, work / "start", done)
    stock_cfg = nodes[0].model_copy(update={"model": nodes[0].model.model_copy(update={"warm_start": None})})
    _evaluate_initial(stock_cfg, work / "stock" / "node0", done)
    print(f"shared start evaluated in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    stock = read_evals(work / "stock" / "node0")[0]
    return {
        "key": key,
        "digests": initial_digests(nodes) if digests else None,
        "record": pair_record(work / "start", sim, setting)["steps"]["0"],
        "stock": {fam: {k: f[k] for k in ("accuracy", "pass_at_8")} for fam, f in stock["families"].items()},
        "stock_model": nodes[0].model.name,
    }


def report(
    data: dict[str, dict[int, dict[str, Any]]],
    sim: Any,
    setting: str,
    command: str,
    start: dict[str, Any] | None = None,
) -> tuple[str, dict]:
    part = "lacking" if setting in SPECIALISED else "all"
    arms = list(data)
    n = sim.node_config(sim.configurations[0].name, 0, sim.seeds[0])
    lines = [
        f"# Controls ({setting}): does a peer's completion carry something a node cannot get alone?",
        "",
        f"- {machine_info()}",
        f"- command: `{command}`",
        f"- {sim.nodes} nodes x {sim.steps} steps, {n.rollout.prompts_per_step} prompts x {n.rollout.group_size} a "
        f"step, lr {n.learner.lr:g}; held-out {n.eval.side.upper()} side, {n.eval.items_per_family} problems a "
        f"family x {n.eval.samples} samples",
        "- every seed starts from the same warm-started models (the recipes' own seed is fixed), so the step-0 "
        "values agree; a seed varies the task draws and every sample after that",
        "- pre-registered (benchmarks/controls.py docstring): exact accuracy at the final step, "
        + ("each node's lacking family" if setting in SPECIALISED else "both families")
        + ", averaged over nodes; paired by seed, mean and 95% t-interval",
        "",
        *(stock_lines(start, sim) if start else []),
    ]
    summary: dict[str, Any] = {"setting": setting, "arms": {}, "comparisons": []}
    if not data:  # the shared start is evaluated, no pair has finished: the start is worth keeping on its own
        return "\n".join([*lines, "No (arm, seed) pair has finished yet.", ""]), summary
    lines += [
        "## Per arm (mean ± sd over seeds)",
        "",
        "| arm | seeds | exact start | exact end | gain | pass@8 start -> end |"
        + (" known-family exact start -> end |" if setting in SPECIALISED else ""),
        "|---|---:|---:|---:|---:|---:|" + ("---:|" if setting in SPECIALISED else ""),
    ]

    def ms(xs: list[float]) -> str:
        return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"

    for arm in arms:
        seeds = sorted(data[arm])
        s = [data[arm][k]["start"]["accuracy"][part] for k in seeds]
        e = [data[arm][k]["end"]["accuracy"][part] for k in seeds]
        p0 = [data[arm][k]["start"]["pass_at_8"][part] for k in seeds]
        p1 = [data[arm][k]["end"]["pass_at_8"][part] for k in seeds]
        gain = [b - a for a, b in zip(s, e, strict=True)]
        row = f"| {arm} | {len(seeds)} | {ms(s)} | {ms(e)} | {ms(gain)} | {ms(p0)} -> {ms(p1)} |"
        if setting in SPECIALISED:
            k0 = [data[arm][k]["start"]["accuracy"]["known"] for k in seeds]
            k1 = [data[arm][k]["end"]["accuracy"]["known"] for k in seeds]
            row += f" {ms(k0)} -> {ms(k1)} |"
        lines.append(row)
        summary["arms"][arm] = {"seeds": seeds, "start": s, "end": e, "pass8_start": p0, "pass8_end": p1}
    lines += [
        "",
        *majority_line(data),
        "## Paired differences at the final step (arm minus control, same seeds)",
        "",
        "| arm | control | seeds | exact diff | 95% interval | pass@8 diff | 95% interval | beats it |",
        "|---|---|---:|---:|---|---:|---|---|",
    ]
    for arm, ctl in COMPARISONS:
        if arm not in data or ctl not in data:
            continue
        seeds = sorted(set(data[arm]) & set(data[ctl]))
        if len(seeds) < 2:
            continue
        d = [data[arm][k]["end"]["accuracy"][part] - data[ctl][k]["end"]["accuracy"][part] for k in seeds]
        d8 = [data[arm][k]["end"]["pass_at_8"][part] - data[ctl][k]["end"]["pass_at_8"][part] for k in seeds]
        m, lo, hi = t_interval(d)
        m8, lo8, hi8 = t_interval(d8)
        beats = "yes" if lo > 0 else ("worse" if hi < 0 else "no")
        lines.append(
            f"| {arm} | {ctl} | {len(seeds)} | {m:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {m8:+.3f} | [{lo8:+.3f}, {hi8:+.3f}]"
            f" | {beats} |"
        )
        summary["comparisons"].append({"arm": arm, "control": ctl, "seeds": seeds, "diff": d, "pass8_diff": d8,
                                       "mean": m, "lo": lo, "hi": hi, "beats": beats})  # fmt: skip
    seeds_all = sorted({k for arm in arms for k in data[arm]})
    lines += ["", "## Per seed (the primary metric at the final step)", "",
              "| arm | " + " | ".join(f"s{k}" for k in seeds_all) + " |",
              "|---|" + "---:|" * len(seeds_all)]  # fmt: skip
    for arm in arms:
        cells = [f"{data[arm][k]['end']['accuracy'][part]:.3f}" if k in data[arm] else "" for k in seeds_all]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", verdict(summary, setting), ""]
    summary["pairs"] = {a: {str(k): {"steps": v["steps"]} for k, v in d.items()} for a, d in data.items()}
    return "\n".join(lines), summary


def stock_lines(start: dict[str, Any], sim: Any) -> list[str]:
    """The shared start per node and family beside the stock model's line (same items, same token budget)."""
    n = sim.node_config(sim.configurations[0].name, 0, sim.seeds[0])
    rec = start["record"]
    at_start = ", ".join(f"{part} exact {rec['accuracy'][part]:.3f} (pass@8 {rec['pass_at_8'][part]:.3f})"
                         for part in rec["accuracy"])  # fmt: skip
    if n.model.warm_start is None:  # a built-in recipe: its own build is the start; there is no other stock model
        return ["## The start", "", f"Evaluated once for every pair (the initial models are fixed): {at_start}", ""]
    lines = [
        "## The start, and the stock model at the same budget",
        "",
        f"Evaluated once for every pair (the warm starts are fixed); the stock model is `{start['stock_model']}` "
        f"without its warm start, on the same items, {n.eval.max_new_tokens or n.rollout.max_new_tokens} new tokens. "
        "An arm's end above the warm-started start but below the stock line is recovery, not new skill.",
        "",
        "| family | stock exact | stock pass@8 |",
        "|---|---:|---:|",
    ]
    for fam, v in sorted(start["stock"].items()):
        p8 = v["pass_at_8"]
        lines.append(f"| {fam} | {v['accuracy']:.3f} | {'n/a' if p8 is None else f'{p8:.3f}'} |")
    return [*lines, "", f"Warm-started start, averaged over nodes: {at_start}", ""]


def verdict(summary: dict[str, Any], setting: str) -> str:
    """The pre-registered target, read off the comparison table."""
    won: dict[str, dict[str, bool]] = {}
    for c in summary["comparisons"]:
        won.setdefault(c["arm"], {})[c["control"]] = c["beats"] == "yes"
    controls, names = TARGET_CONTROLS[setting]
    winners = [a for a, w in won.items() if a in SHARING and all(w.get(c, False) for c in controls)]
    if winners:
        return f"**Target met** by {', '.join(winners)}: beyond the 95% interval above {names}."
    return f"**Target not met**: no sharing arm beats {names} each beyond its 95% interval."


def plot(setting: str, data: dict[str, Any], path: Path) -> Path | None:
    """Exact accuracy (lacking family for het) at every evaluation step, mean over seeds with the seeds' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arm in data:
        curves: dict[int, list[float]] = {}
        for rec in data[arm].values():
            for step, v in rec["steps"].items():
                curves.setdefault(int(step), []).append(v["accuracy"]["lacking" if setting in SPECIALISED else "all"])
        xs = sorted(curves)
        mean = [statistics.fmean(curves[x]) for x in xs]
        ax.plot(xs, mean, marker="o", label=f"{arm} ({len(data[arm])} seeds)")
        ax.fill_between(xs, [min(curves[x]) for x in xs], [max(curves[x]) for x in xs], alpha=0.12)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out exact" + (" (lacking family)" if setting in SPECIALISED else ""))
    ax.set_title(f"controls ({setting}): mean over seeds, band = seeds' range")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", choices=("het", "homo", "smol"), default="het")
    ap.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,2,5")
    ap.add_argument("--workers", type=int, default=None, help="(arm, seed) pairs at once (default: the YAML's)")
    ap.add_argument("--only", default="", help="comma-separated arms to run (the report reads every finished one)")
    ap.add_argument("--work", type=Path, default=None, help="run directory (default runs/controls-<setting>)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--set", action="append", default=[], help="sim override, e.g. steps=20")
    ap.add_argument("--quick", action="store_true", help="the YAML's quick overrides (seconds; a test)")
    ap.add_argument("--analyze", action="store_true", help="only read the run directory and write the report")
    args = ap.parse_args()

    from sim.config import load_sim_config

    config = ROOT / "configs" / "sim" / f"controls-{args.setting}.yaml"
    overrides = [*args.set, f"seeds={parse_seeds(args.seeds)}"]
    overrides += [f"workers={args.workers}"] if args.workers else []
    sim = load_sim_config(str(config), overrides, quick=args.quick)
    if args.quick:
        sim = sim.model_copy(update={"seeds": parse_seeds(args.seeds)})
    work = args.work or ROOT / "runs" / f"controls-{args.setting}{'-quick' if args.quick else ''}"
    work.mkdir(parents=True, exist_ok=True)
    stem = f"controls_{args.setting}{'_quick' if args.quick else ''}"
    keys = arm_keys(sim)
    saved = saved_pairs(args.out / f"{stem}.json", keys)
    start = saved_start(args.out / f"{stem}.json", sim) if shared_start(sim) else None
    if not args.analyze:
        run_sim = sim
        if args.only:
            keep = set(args.only.split(","))
            run_sim = sim.model_copy(update={"configurations": [c for c in sim.configurations if c.name in keep]})
        t0 = time.perf_counter()
        if shared_start(sim):
            start = run_start(sim, work, args.setting, start, sim.workers * sim.torch_threads)
            write_report(work, sim, args, keys, saved, start)  # the start (its digests) is kept from now on
        run_pending(run_sim, work, sim.seeds, {(a, k) for a, seeds in saved.items() for k in seeds},
                    after_each=lambda: write_report(work, sim, args, keys, saved, start))  # fmt: skip
        print(f"ran in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    elif start is None and shared_start(sim) and (work / "stock" / "node0" / "eval.jsonl").is_file():
        start = run_start(sim, work, args.setting, None, 1, digests=False)  # finished evaluations on disk: read
    return write_report(work, sim, args, keys, saved, start)


def write_report(
    work: Path,
    sim: Any,
    args: argparse.Namespace,
    keys: dict[str, str],
    saved: dict[str, dict[int, dict[str, Any]]],
    start: dict[str, Any] | None,
) -> int:
    """Read every finished pair (on disk, else saved) and write the report; 1 when there is nothing to report."""
    stem = f"controls_{args.setting}{'_quick' if args.quick else ''}"
    data = collect(work, sim, args.setting, saved, start["record"] if start else None)
    if not data and start is None:
        print("no finished pairs to report", file=sys.stderr)
        return 1
    command = "python benchmarks/controls.py " + " ".join(sys.argv[1:])
    text, summary = report(data, sim, args.setting, command, start)
    summary["arm_keys"] = {arm: keys[arm] for arm in data}
    if start:
        summary["shared_start"] = start
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot(args.setting, data, args.out / f"{stem}.png") if data else None
    if png is not None:
        text += f"\n![exact accuracy over steps]({png.name})\n"
    reading = args.out / f"{stem}_reading.md"  # a person's reading of the numbers, kept across rewrites
    if reading.is_file():
        text += "\n" + reading.read_text()
    write_results(args.out, stem, text, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

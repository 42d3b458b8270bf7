"""Initial models evaluated once: what decides a node's step-0 evaluation, evaluating it into a run directory
(copied where an identical node was already evaluated), and an experiment whose chosen nodes skip their own.

The evaluation is deterministic given the model, the items and the evaluation seed, so identical initial nodes
(the same arm in another seed, or another arm in the same seed) give one result; the simulator (``sim.runner``)
and the experiment driver (``sim.driver.start``) evaluate each once. Imports torch and the node only inside the
functions. Knows nothing about reports or registrations.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from sim.config import SimConfig


def eval_key(cfg: Any) -> str:
    """What decides a node's initial evaluation: its model, tasks, evaluation and sampling settings."""
    return json.dumps([cfg.model_dump(mode="json")[k] for k in ("model", "tasks", "eval", "rollout")], sort_keys=True)


def _evals(node_dir: Path) -> list[dict[str, Any]]:
    path = node_dir / "eval.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def evaluate_initial(cfg: Any, run_dir: Path, done: dict[str, Path]) -> None:
    """Evaluate ``cfg``'s initial model into ``run_dir/eval.jsonl`` at step 0 (kept if already there for the same
    key). ``done`` maps what decides an evaluation to a directory that already holds it: identical nodes are
    evaluated once."""
    import yaml

    from node.config import NodeConfig
    from node.eval import append_result, evaluate_run

    what = eval_key(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    written = run_dir / "config.yaml"
    if written.is_file() and eval_key(NodeConfig.model_validate(yaml.safe_load(written.read_text()))) != what:
        (run_dir / "eval.jsonl").unlink(missing_ok=True)  # another experiment's start: not this one's
    if not any(e["step"] == 0 for e in _evals(run_dir)):
        # the sizes the node itself evaluates at (eval.quick), so the numbers are the ones its own start would give
        sized = cfg.model_copy(update={"eval": cfg.eval.sized_for(cfg.model.name)})
        written.write_text(yaml.safe_dump(sized.model_dump(mode="json"), sort_keys=False))
        if what in done:
            shutil.copyfile(done[what] / "eval.jsonl", run_dir / "eval.jsonl")
        else:
            append_result(run_dir, evaluate_run(run_dir, initial=True))
    done.setdefault(what, run_dir)


def start_record(node_dir: Path) -> str:
    """The step-0 line of a directory :func:`evaluate_initial` wrote, as ``eval.jsonl`` holds it."""
    return json.dumps(next(e for e in _evals(node_dir) if e["step"] == 0))


def without_start_eval(sim: SimConfig, nodes: dict[str, list[int]]) -> SimConfig:
    """``sim`` with the given nodes of each configuration (name -> node indices) not evaluating their start (it is
    evaluated once elsewhere), and without its registration (which asks per-seed experiments for
    ``eval.at_start``; a run does not read it)."""
    mapping = sim.model_dump(mode="json", exclude_unset=True)
    mapping.pop("registration", None)
    for conf in mapping["configurations"]:
        for i in nodes.get(conf["name"], []):  # the configuration's node_overrides merge last: nothing overrides
            node = conf.setdefault("node_overrides", {}).setdefault(str(i), {})
            node["eval"] = {**node.get("eval", {}), "at_start": False}
    return SimConfig.model_validate(mapping)

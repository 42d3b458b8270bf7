"""``swarm-node export``: a run's checkpoint as a standard Hugging Face model directory, ready for the Hub.

The directory holds ``model.safetensors`` + ``config.json``, the tokenizer files, ``generation_config.json`` and
a ``README.md`` model card (base model, training recipe from the run's ``config.yaml``, held-out results from
its ``eval.jsonl`` when present). ``AutoModelForCausalLM.from_pretrained(DIR)`` and
``PreTrainedTokenizerFast.from_pretrained(DIR)`` (or ``AutoTokenizer``) load it with no project code.

Knows how checkpoints and policies are stored (``node.learn.checkpoint``, ``node.model.policy``); nothing about the
swarm.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from protocol.config import load_config
from protocol.errors import ConfigError

logger = logging.getLogger(__name__)


def _find_checkpoint(run_dir: Path, step: int | None) -> Any:
    from node.learn.checkpoint import _verify, load_latest

    ckpt_dir = run_dir / "checkpoints"
    if step is None:
        ckpt = load_latest(ckpt_dir)
        if ckpt is None:
            raise ConfigError(f"{run_dir} has no intact checkpoint (expected {ckpt_dir}/step-*)")
        return ckpt
    path = ckpt_dir / f"step-{step:08d}"
    ckpt = _verify(path) if path.is_dir() else None
    if ckpt is None:
        have = sorted(p.name for p in ckpt_dir.glob("step-*")) if ckpt_dir.is_dir() else []
        raise ConfigError(f"no intact checkpoint for step {step} in {ckpt_dir} (have: {', '.join(have) or 'none'})")
    return ckpt


def _eval_row(run_dir: Path, step: int) -> dict[str, Any] | None:
    """The held-out evaluation at ``step``, else the latest one before it (``eval.jsonl``), else None."""
    from node.telemetry.metrics import read_jsonl

    rows = [r for r in read_jsonl(run_dir / "eval.jsonl") if isinstance(r.get("step"), int) and r["step"] <= step]
    return max(rows, key=lambda r: r["step"]) if rows else None


def _pct(v: Any) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, int | float) else "-"


def model_card(cfg: NodeConfig, step: int, policy_version: int, evaluation: dict[str, Any] | None) -> str:
    """The README.md of an exported model: what it is, how it was trained, what it scores."""
    fams = ", ".join(
        f"`{f.name}`" + (f" ({', '.join(f'{k}={v}' for k, v in f.config.items())})" if f.config else "")
        for f in cfg.tasks.families
    )
    base = cfg.model.name
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [rl-swarm, grpo, sapo, reinforcement-learning]",
        *([f"base_model: {base}"] if not base.startswith(("builtin:", "/", ".", "~")) else []),
        "---",
        "",
        f"# {base} trained with rl-swarm (step {step})",
        "",
        "Post-trained with reinforcement learning in a peer-to-peer swarm (rl-swarm): the node trained on its own",
        "rollouts and on peers' rollouts (SAPO), re-scoring every peer completion with its own verifier.",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{base}` |",
        f"| steps | {step} (optimizer updates: {policy_version}) |",
        f"| tasks (reasoning-gym) | {fams} |",
        f"| loss | {cfg.learner.loss}, lr {cfg.learner.lr:g}, beta {cfg.learner.beta:g} |",
        f"| batch per step | {cfg.sapo.local_groups} own + {cfg.sapo.external_groups} peers' groups "
        f"of {cfg.rollout.group_size} completions |",
        f"| max new tokens | {cfg.rollout.max_new_tokens}, temperature {cfg.rollout.temperature:g} |",
        f"| swarm | `{cfg.swarm_id}` |",
        "",
    ]
    if evaluation is not None:
        lines += [
            f"## Held-out evaluation (step {evaluation['step']})",
            "",
            f"Sampled accuracy {_pct(evaluation.get('accuracy'))}, greedy accuracy "
            f"{_pct(evaluation.get('greedy_accuracy'))}.",
            "",
        ]
        fam_rows = evaluation.get("families") or {}
        if fam_rows:
            lines += ["| family | accuracy | greedy | format | mean length | n |", "|---|---:|---:|---:|---:|---:|"]
            for name, r in fam_rows.items():
                mean_len = r.get("mean_length")
                lines.append(
                    f"| {name} | {_pct(r.get('accuracy'))} | {_pct(r.get('greedy_accuracy'))} | "
                    f"{_pct(r.get('format_rate'))} | {mean_len if mean_len is None else f'{mean_len:.1f}'} | "
                    f"{r.get('n', '-')} |"
                )
            lines.append("")
    else:
        lines += ["## Held-out evaluation", "", "None recorded in the run directory (no `eval.jsonl`).", ""]
    lines += [
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("PATH")',
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
        "```",
        "",
    ]
    return "\n".join(lines)


def export_run(run_dir: Path, out: Path, step: int | None = None) -> Path:
    """Write ``run_dir``'s checkpoint (latest, or ``step``) to ``out`` as a Hugging Face model directory."""
    from node.cli.preflight import check_output_dir

    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = load_config(NodeConfig, config_file, [])
    check_output_dir(out, "--out directory")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out directory {out} is not empty; pick a new directory")
    ckpt = _find_checkpoint(run_dir, step)

    from safetensors.torch import load_file

    from node.model.policy import load_policy

    policy = load_policy(cfg.model.model_copy(update={"device": "cpu"}))
    tensors = load_file(str(ckpt.path / "model.safetensors"))
    for alias, canonical in ckpt.state.get("tied", {}).items():
        tensors[alias] = tensors[canonical]
    policy.model.load_state_dict(tensors, strict=True)
    out.mkdir(parents=True, exist_ok=True)
    model = policy.model
    gen = model.generation_config
    eos = policy.eos_token_ids
    gen.eos_token_id = eos[0] if len(eos) == 1 else eos
    gen.pad_token_id = policy.tokenizer.pad_token_id
    gen.do_sample = True
    gen.temperature = cfg.rollout.temperature
    gen.top_p = cfg.rollout.top_p
    gen.max_new_tokens = cfg.rollout.max_new_tokens
    model.save_pretrained(str(out), safe_serialization=True)
    policy.tokenizer.save_pretrained(str(out))
    (out / "README.md").write_text(
        model_card(cfg, ckpt.step, ckpt.policy_version, _eval_row(run_dir, ckpt.step)), encoding="utf-8"
    )
    (out / "rl_swarm.json").write_text(
        json.dumps({"run_dir": str(run_dir.resolve()), "step": ckpt.step, "policy_version": ckpt.policy_version})
    )
    logger.info("exported %s (step %d) to %s", ckpt.path, ckpt.step, out)
    return out

"""The built-in default policy ``builtin:tiny``: a 0.8M-parameter Qwen2-config causal LM built offline.

The build (once per recipe, cached; about 2-3 minutes on 2 CPU cores) has three deterministic parts:

1. a byte-level BPE tokenizer with few merges (``tokenizers``, digits split one per token; nearly one token
   per character) trained on prompts and answers of the SAPO reasoning-gym families and the default mix, saved
   as a ``PreTrainedTokenizerFast`` without a chat template, so prompts use ``node.tasks.PLAIN_TEMPLATE``;
2. a randomly initialised Qwen2 model (Qwen Team, *Qwen2 Technical Report*, arXiv 2407.10671) sized to generate
   thousands of tokens/s on two CPU cores;
3. a short supervised warm start on the default task mix (question -> ``<answer>x</answer>`` + EOS), drawn
   only from the train side of each family under the default shares (``node.tasks``: dev and test items are
   never seen; ``NodeConfig`` refuses larger shares with the built-in model): first on
   gold answers only, then on a mix where only a fraction ``correct_fraction`` of the targets are gold and the
   rest are the gold answers of *other* items of the same family (plausible, question-independent
   distractors). The model learns the format, part of each skill and a calibrated *habit of answering at
   random*, so it starts at a success rate clearly between 0 and 1 and RL has signal from the first step.

What RL then does is measured on held-out problems (``node.eval``, exact match against the majority-answer
baseline, with pass@8): with the default config, 150 steps move held-out exact accuracy only from 0.191 to 0.204
(3 seeds), every family stays at or below its majority baseline and pass@8 falls (0.375 -> 0.257): RL sharpens
the model onto frequent answers and undoes the random-answer habit; it adds no new skill
(``benchmarks/results/b7_generalization.md``). The model is the fast demo of the machinery, not of learning.

The cache directory is ``<cache>/tiny-<hash of the recipe>``: a recipe change rebuilds. The build runs in a
temporary directory beside it and is renamed into place under a file lock, so concurrent first starts neither
duplicate work nor leave a half-written model.

Knows nothing about sampling, RL or the swarm; it only turns a :class:`TinyRecipe` into a model directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from node.config import TaskConfig, TaskFamily
from node.model.sft import train_sft
from node.tasks import PLAIN_TEMPLATE, SAPO_FAMILIES, TaskSource, format_answer

logger = logging.getLogger(__name__)

BUILTIN_NAME = "builtin:tiny"
R = TypeVar("R")
#: Bump when the build code changes in a way the recipe fields do not capture.
BUILD_CODE_VERSION = 5  # 5: split v2 (SPEC 13): warm-start items avoid the new dev and test sides
EOS_TOKEN, PAD_TOKEN = "<|endoftext|>", "<|pad|>"
_RECIPE_FILE = "rl_swarm_recipe.json"


def _default_sft_families() -> tuple[TaskFamily, ...]:
    return tuple(TaskConfig().families)


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines the built model; its hash names the cache directory."""

    seed: int = 0
    # tokenizer
    vocab_size: int = 300
    """Byte-level BPE with few merges (the 258 byte and special tokens plus ~40): nearly one token per character,
    which the default mix's character-level skills need (reversing a word, counting a letter). Measured: with
    1024 tokens, word reversal reached 0.03 held-out greedy accuracy after 150 warm-start steps; with 300, 0.26."""
    tokenizer_items_per_family: int = 200
    # model (Qwen2 config)
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 2048
    tie_embeddings: bool = True
    """Tied input/output embeddings (as Qwen2.5-0.5B). Measured with the real learner and the earlier partial-credit
    metric: the tied recipe below rose from ~0.13 to ~0.33 in 100 RL steps (mostly sharpening, as exact match later
    showed); an untied, fully trained variant started at 0.70 and did not improve."""
    # supervised warm start
    sft_families: tuple[TaskFamily, ...] = field(default_factory=_default_sft_families)
    tokenizer_families: tuple[TaskFamily, ...] = ()
    """Families whose items the tokenizer is trained on besides the SAPO nine; empty = ``sft_families``. Models
    warm-started on different family subsets share one tokenizer when they name the same families here, so
    peers' behaviour hints stay usable between them."""
    sft_task_seed: int = 12345
    """Task seed of the warm-start items (differs from the default ``tasks.seed`` so RL prompts are not the
    exact items seen in the warm start, even where a family's item space is larger than the pool)."""
    sft_clean_steps: int = 450
    """Warm-start steps on gold answers only (the model learns part of each skill)."""
    sft_noisy_steps: int = 150
    """Following steps where only ``correct_fraction`` of the targets are gold (the model learns to be wrong)."""
    sft_batch_size: int = 32
    sft_lr: float = 3e-3
    sft_warmup: int = 20
    correct_fraction: float = 0.4
    """Share of gold targets in the noisy phase; sets the starting success rate."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["sft_families"] = [f.model_dump() for f in self.sft_families]
        if self.tokenizer_families:
            d["tokenizer_families"] = [f.model_dump() for f in self.tokenizer_families]
        else:  # absent, not empty: recipes from before the field keep their key (and their cached build)
            del d["tokenizer_families"]
        d["build_code_version"] = BUILD_CODE_VERSION
        return d

    def key(self) -> str:
        return recipe_key(self.to_dict())


def recipe_key(recipe: dict[str, Any]) -> str:
    """16 hex chars of SHA-256 over the canonical JSON of a recipe (with its build code version): its cache name."""
    blob = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


DEFAULT_RECIPE = TinyRecipe()


def recipe_with(overrides: dict[str, Any]) -> TinyRecipe:
    """:data:`DEFAULT_RECIPE` with ``overrides`` (``model.builtin``) applied; family lists are lists of
    ``{name, config, weight}`` mappings. Raises ``ValueError`` naming an unknown field or a bad family."""
    return replace_recipe(DEFAULT_RECIPE, overrides, "built-in", ("sft_families", "tokenizer_families"))


def replace_recipe(default: R, overrides: dict[str, Any], what: str, family_fields: tuple[str, ...]) -> R:
    """``default`` (a recipe dataclass) with ``overrides`` applied, ``family_fields`` given as lists of ``{name,
    config, weight}`` mappings; ``ValueError`` names an unknown field (of the ``what`` recipe) or a bad family."""
    if not overrides:
        return default
    known = {f.name for f in dataclasses.fields(default)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown {what} recipe field(s) {unknown}; known: {sorted(known)}")
    values = dict(overrides)
    for key in family_fields:
        if key in values:
            values[key] = tuple(TaskFamily.model_validate(f) for f in values[key])
    return dataclasses.replace(default, **values)  # type: ignore[type-var]


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/rl-swarm``, else ``~/.cache/rl-swarm``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rl-swarm"


#: A reduced recipe (seconds to build, near-zero skill) for tests and quick benchmark runs.
SMALL_RECIPE = TinyRecipe(
    vocab_size=300,
    tokenizer_items_per_family=20,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    sft_clean_steps=10,
    sft_noisy_steps=10,
    sft_batch_size=16,
)


def model_dir(cache_dir: Path | None = None, recipe: TinyRecipe | None = None) -> Path:
    """Where ``recipe``'s model (default: :data:`DEFAULT_RECIPE`) lives, built or not."""
    recipe = recipe or DEFAULT_RECIPE
    return Path(cache_dir or default_cache_root()).expanduser() / f"tiny-{recipe.key()}"


def is_built(cache_dir: Path | None = None, recipe: TinyRecipe | None = None) -> bool:
    """Whether ``recipe``'s model (default :data:`DEFAULT_RECIPE`) is built and complete in the cache."""
    return (model_dir(cache_dir, recipe or DEFAULT_RECIPE) / _RECIPE_FILE).exists()


def ensure_built(cache_dir: Path | None = None, recipe: TinyRecipe | None = None) -> Path:
    """The directory of ``recipe``'s model (default: :data:`DEFAULT_RECIPE`), building it first if it is not
    cached; safe when several processes start at once."""
    from node.model.cache import build_once

    recipe = recipe or DEFAULT_RECIPE
    what = f"{BUILTIN_NAME} (recipe {recipe.key()})"
    return build_once(model_dir(cache_dir, recipe), _RECIPE_FILE, lambda tmp: build(recipe, tmp), what)


def build(recipe: TinyRecipe, out: Path) -> dict[str, Any]:
    """Build the tokenizer, the model and its warm start into ``out``; returns build statistics."""
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    tok = build_tokenizer(recipe)
    model = build_model(recipe, tok)
    t_tok = time.perf_counter() - t0
    stats = warm_start(recipe, model, tok)
    stats.update(tokenizer_s=round(t_tok, 3), total_s=round(time.perf_counter() - t0, 2))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    assert isinstance(tok, PreTrainedTokenizerFast)
    tok.save_pretrained(str(out))
    (out / "build_stats.json").write_text(json.dumps(stats, indent=1))
    (out / _RECIPE_FILE).write_text(json.dumps(recipe.to_dict(), indent=1, sort_keys=True))  # written last
    logger.info("built %s in %.1fs (final warm-start loss %.3f)", BUILTIN_NAME, stats["total_s"], stats["final_loss"])
    return stats


def _format_prompt(question: str) -> str:
    return PLAIN_TEMPLATE.format(question=question)


def build_tokenizer(recipe: TinyRecipe) -> Any:
    """Byte-level BPE over prompts and answers of the SAPO families and the warm-start families."""
    families = [TaskFamily(name=n) for n in SAPO_FAMILIES] + list(recipe.tokenizer_families or recipe.sft_families)
    corpus = []
    rng = random.Random(recipe.seed)
    for fam in families:
        src = TaskSource(TaskConfig(families=[fam], seed=recipe.sft_task_seed))
        for ref in src.sample(rng, recipe.tokenizer_items_per_family):
            item = src.materialize(ref)
            answer = item.answer if item.answer is not None else str(item.metadata.get("example_answer", ""))
            corpus.append(_format_prompt(item.question) + format_answer(answer))
    # one token each for the answer tags: the format costs two tokens, not eight
    return train_byte_bpe(corpus, recipe.vocab_size, ["<answer>", "</answer>"])


def train_byte_bpe(corpus: list[str], vocab_size: int, added_tokens: list[str]) -> Any:
    """A byte-level BPE tokenizer over ``corpus`` with digits split one per token, EOS and pad special tokens and
    ``added_tokens`` as single tokens; left padding (generation batches)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    tok.add_tokens(added_tokens)
    tok.padding_side = "left"
    return tok


def build_model(recipe: Any, tok: Any) -> Any:
    """A freshly initialised Qwen2 causal LM (seeded) matching the tokenizer; ``recipe`` is any recipe with the model
    fields of :class:`TinyRecipe` (``seed``, ``hidden_size``, ... -- the laboratory model's too)."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(recipe.seed)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=recipe.tie_embeddings,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return model


def sft_examples(recipe: TinyRecipe, n: int, correct_fraction: float, salt: int) -> list[tuple[str, str]]:
    """``n`` deterministic (prompt, completion) pairs; each target is the gold answer with probability
    ``correct_fraction``, else the gold answer of another item of the same family (drawn from the same batch of
    items), so a distractor is a plausible answer to that kind of question, never another family's answer."""
    rng = random.Random(recipe.seed * 1_000_003 + salt)
    src = TaskSource(TaskConfig(families=list(recipe.sft_families), seed=recipe.sft_task_seed, pool_size=10**9))
    items = [src.materialize(ref) for ref in src.sample(rng, n)]
    answers = [it.answer if it.answer is not None else str(it.metadata.get("example_answer", "")) for it in items]
    by_family: dict[str, list[str]] = {}
    for item, answer in zip(items, answers, strict=True):
        by_family.setdefault(item.ref.family, []).append(answer)
    pairs = []
    for item, answer in zip(items, answers, strict=True):
        if rng.random() >= correct_fraction:
            answer = rng.choice(by_family[item.ref.family])
        pairs.append((_format_prompt(item.question), format_answer(answer)))
    return pairs


def warm_start(recipe: TinyRecipe, model: Any, tok: Any) -> dict[str, Any]:
    """Supervised steps on :func:`sft_examples`, clean then noisy (loss on completion tokens only); AdamW,
    linear warmup then cosine decay to 10% over both phases."""
    torch.manual_seed(recipe.seed)
    bs = recipe.sft_batch_size
    pairs = sft_examples(recipe, recipe.sft_clean_steps * bs, 1.0, salt=1)
    pairs += sft_examples(recipe, recipe.sft_noisy_steps * bs, recipe.correct_fraction, salt=2)
    total_steps = recipe.sft_clean_steps + recipe.sft_noisy_steps
    eos = tok.eos_token_id
    seqs = []
    for prompt, completion in pairs:
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        c = tok(completion, add_special_tokens=False)["input_ids"] + [eos]
        seqs.append((p, c))
    t0 = time.perf_counter()

    def progress(step: int, total: int, loss: float, eta: float) -> None:
        logger.info("building %s: warm start step %d/%d (loss %.3f, about %.0fs left)", BUILTIN_NAME, step, total,
                    loss, eta)  # fmt: skip

    losses = train_sft(
        model, seqs[: total_steps * bs], batch_size=bs, lr=recipe.sft_lr, warmup=recipe.sft_warmup,
        pad_id=tok.pad_token_id, betas=(0.9, 0.98), progress=progress,
    )  # fmt: skip
    tail = losses[-10:] if losses else [float("nan")]
    return {
        "sft_s": round(time.perf_counter() - t0, 2),
        "final_loss": sum(tail) / len(tail),
        "params": sum(p.numel() for p in model.parameters()),
    }

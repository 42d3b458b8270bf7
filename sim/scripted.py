"""A cheap scripted stand-in for a node's heavy parts (policy, tasks, engine, learner), for scale and unit tests.

The "model" is a Bernoulli policy per task family: on a prompt of family ``f`` it answers correctly with
probability ``p_f = sigmoid(theta_f)``. Tasks are addressed by real :class:`~protocol.types.TaskRef` s and are
regenerable from them (the gold answer is a hash of the question), and completions are real text in the
project's ``<answer>...</answer>`` format scored by a trivial verifier, so everything between the parts -- the
runtime, the wire records, the receivers' re-scoring, SAPO's zero-advantage drops -- is the real code path.

The learner is honest about what it is given: it decodes each :class:`~node.seams.TrainSample` (prompt ->
family and gold answer, completion -> right or wrong) and takes the REINFORCE step of the Bernoulli policy,
``theta_f += lr * sum_samples(A * d log pi(y) / d theta_f) / B`` with ``d log pi / d theta = 1 - p`` for a right
answer and ``-p`` for a wrong one, where ``B = G * (I + J)`` is the *nominal* batch (a constant normaliser, as in
Dr.GRPO, so a group teaches as much whatever else is in the batch; a sample-count mean would make a node that
found a single informative group take a step as large as one with a full batch). Peers' groups therefore change
the policy exactly as much as their advantages say, so sharing can matter (a node that never solves family ``f``
learns it from peers who do).

Knows nothing about networking or the simulator's schedule; uses only the standard library.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from typing import Any

from node.config import NodeConfig, TaskConfig
from node.runtime import NodeParts
from node.seams import GenerationSettings, TrainSample
from node.tasks import TaskError, TaskItem, extract_answer, format_answer
from protocol.types import TaskRef

#: Token id that ends a completion (byte tokens are shifted by one to leave it free).
EOS = 0
#: Bytes (= tokens) of the longest scripted answer; ``rollout.max_new_tokens`` must be at least this.
MIN_NEW_TOKENS = len(format_answer("999999"))
TOKENIZER_ID = "scripted-bytes-v1"


def _config_key(config: Any) -> str:
    return TaskRef(family="", config=dict(config)).key()


def gold_answer(question: str) -> str:
    """The gold answer of a scripted question: a stable 6-digit code derived from the question text."""
    return str(int.from_bytes(hashlib.sha256(question.encode()).digest()[:4], "big") % 1_000_000)


def question_of(ref: TaskRef) -> str:
    """The question text of ``ref``; starts with the family name so the scripted model knows what it sees."""
    return f"{ref.family}|{ref.seed}|{ref.index}|{_config_key(ref.config)}: recall the code."


def family_of(question: str) -> str:
    return question.split("|", 1)[0]


class ScriptedTokenizer:
    """Byte-level "tokenizer": token = byte + 1, ``EOS`` = 0."""

    eos_token_id = EOS
    pad_token_id = EOS

    @staticmethod
    def encode(text: str) -> list[int]:
        return [b + 1 for b in text.encode("utf-8")]

    @staticmethod
    def decode(ids: list[int]) -> str:
        return bytes(i - 1 for i in ids if 0 < i <= 256).decode("utf-8", errors="replace")


class ScriptedModel:
    """Per-family success logits of one node (its whole "parameter vector")."""

    def __init__(self, families: list[str], *, init_p: float, init_spread: float, max_p: float, seed: int) -> None:
        rng = random.Random(f"scripted-init:{seed}")
        base = math.log(init_p / (1 - init_p))
        self.theta = {f: base + rng.gauss(0.0, init_spread) for f in families}
        self.max_p = max_p

    def p(self, family: str) -> float:
        theta = self.theta.get(family)
        if theta is None:
            return 0.0
        return min(self.max_p, 1.0 / (1.0 + math.exp(-theta)))


@dataclass
class ScriptedPolicy:
    """Stands in for :class:`node.model.policy.Policy` (prompt formatting, encoding, tokenizer id)."""

    model: ScriptedModel
    tokenizer: ScriptedTokenizer = field(default_factory=ScriptedTokenizer)
    tokenizer_id: str = TOKENIZER_ID
    name: str = "scripted"

    def format_prompt(self, question: str) -> str:
        return question

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)


class ScriptedTasks:
    """Stands in for :class:`node.tasks.TaskSource`: same sampling, refs regenerable, exact-match verifier."""

    def __init__(self, cfg: TaskConfig) -> None:
        if not cfg.families:
            raise TaskError("tasks.families is empty")
        self.cfg = cfg
        self._families = [(f.name, dict(f.config)) for f in cfg.families]
        self._weights = [f.weight for f in cfg.families]
        self._allowed = {(name, _config_key(config)) for name, config in self._families}

    @property
    def families(self) -> list[str]:
        return [name for name, _ in self._families]

    def sample(self, rng: random.Random, n: int) -> list[TaskRef]:
        picks = rng.choices(range(len(self._families)), weights=self._weights, k=n)
        out = []
        for i in picks:
            name, config = self._families[i]
            out.append(
                TaskRef(family=name, config=dict(config), seed=self.cfg.seed, index=rng.randrange(self.cfg.pool_size))
            )
        return out

    def accepts(self, ref: TaskRef) -> bool:
        return (ref.family, _config_key(ref.config)) in self._allowed

    def materialize(self, ref: TaskRef) -> TaskItem:
        if not self.accepts(ref):
            raise TaskError(f"task {ref.family!r} is not one of this node's families")
        if not isinstance(ref.index, int) or not 0 <= ref.index < self.cfg.pool_size:
            raise TaskError(f"task index {ref.index!r} outside [0, {self.cfg.pool_size})")
        question = question_of(ref)
        return TaskItem(ref=ref, question=question, answer=gold_answer(question))

    def materialize_for_training(self, ref: TaskRef) -> TaskItem:
        """:meth:`materialize`: the scripted model learns per family, never per item, so it keeps no held-out
        split (held-out evaluation needs a real policy)."""
        return self.materialize(ref)

    def trace(self, item: TaskItem) -> str | None:
        """No written working: scripted items are bare sums."""
        return None

    def warn_if_small(self, total_draws: int) -> list[str]:
        """Nothing to warn about: scripted items cannot be memorized."""
        return []

    def score(self, item: TaskItem, completion_text: str, *, own: bool = True) -> float:
        return 1.0 if extract_answer(completion_text) == item.answer else 0.0

    def metrics(self) -> dict[str, Any]:
        """No plug-ins, nothing to count."""
        return {}


@dataclass
class ScriptedGeneration:
    """One completion, with the fields the runtime reads from the real engine's generations."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_ids: list[int]
    finish_reason: str = "stop"
    policy_version: int = 0


class ScriptedEngine:
    """Stands in for the rollout engine: G answers per prompt, right with the model's probability."""

    def __init__(self, policy: ScriptedPolicy, answer_tokens: int, settings: GenerationSettings) -> None:
        self.policy = policy
        self.answer_tokens = answer_tokens
        self.settings = settings
        self.policy_version = 0

    def set_policy_version(self, version: int) -> None:
        self.policy_version = version

    def sync_weights(self, version: int) -> None:
        self.policy_version = version

    def stats(self) -> dict[str, float]:
        return {}

    def generate(
        self,
        prompts: list[str],
        group_size: int,
        /,
        *,
        seed: int | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> list[list[ScriptedGeneration]]:
        max_new_tokens = self.settings.resolve(max_new_tokens).max_new_tokens
        rng = random.Random(seed)
        out = []
        for prompt in prompts:
            gold = gold_answer(prompt)
            p = self.policy.model.p(family_of(prompt))
            prompt_ids = self.policy.encode(prompt)
            group = []
            for _ in range(group_size):
                right = rng.random() < p
                answer = gold if right else str((int(gold) + 1 + rng.randrange(999_999)) % 1_000_000)
                core = format_answer(answer)
                text = "." * max(0, min(self.answer_tokens, max_new_tokens - len(core))) + core
                ids = self.policy.encode(text)
                lp = math.log(max(p if right else 1 - p, 1e-6)) / len(ids)
                group.append(
                    ScriptedGeneration(
                        text=text,
                        token_ids=ids,
                        logprobs=[lp] * len(ids),
                        prompt_ids=prompt_ids,
                        policy_version=self.policy_version,
                    )
                )
            out.append(group)
        return out


class ScriptedLearner:
    """REINFORCE on the per-family Bernoulli policy, from the advantage-weighted samples it is given."""

    def __init__(self, policy: ScriptedPolicy, lr: float, batch_samples: int) -> None:
        self.policy = policy
        self.lr = lr
        self.batch_samples = max(1, batch_samples)
        self.policy_version = 0

    def step(self, samples: list[TrainSample]) -> dict[str, float]:
        tok = self.policy.tokenizer
        model = self.policy.model
        grads: dict[str, float] = {}
        n = 0
        n_ext = 0
        for s in samples:
            if not s.completion_ids:
                continue
            question = tok.decode(s.prompt_ids)
            family = family_of(question)
            if family not in model.theta:
                continue
            right = extract_answer(tok.decode(s.completion_ids)) == gold_answer(question)
            p = model.p(family)
            grads[family] = grads.get(family, 0.0) + s.advantage * ((1.0 - p) if right else -p)
            n += 1
            n_ext += bool(getattr(s, "external", False))
        if n == 0:
            raise ValueError("no sample with a non-empty completion to train on")
        for family, g in grads.items():
            model.theta[family] += self.lr * g / self.batch_samples
        self.policy_version += 1
        return {"sequences": float(n), "external_sequences": float(n_ext), "families_updated": float(len(grads))}


def build_scripted_parts(
    cfg: NodeConfig, *, lr: float, init_p: float, init_spread: float, max_p: float, answer_tokens: int
) -> NodeParts:
    """The four scripted parts of one node, as a :class:`node.runtime.NodeParts`; seeded by ``cfg.seed``."""

    tasks = ScriptedTasks(cfg.tasks)
    model = ScriptedModel(tasks.families, init_p=init_p, init_spread=init_spread, max_p=max_p, seed=cfg.seed)
    policy = ScriptedPolicy(model)
    return NodeParts(
        policy=policy,
        tasks=tasks,
        engine=ScriptedEngine(policy, answer_tokens, GenerationSettings.of(cfg.rollout)),
        learner=ScriptedLearner(
            policy, lr, cfg.rollout.group_size * (cfg.sapo.local_groups + cfg.sapo.external_groups)
        ),
    )

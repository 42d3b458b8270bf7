"""Preference oracles for MNPO: who says which of two responses to a prompt is better, behind one interface.

* :class:`VerifiableOracle` -- the task's own verifier (reasoning-gym ``score_answer``); a pair only where the
  rewards differ (a tie says nothing).
* :class:`RewardModelOracle` -- a scalar reward model: a transformers sequence-classification model with one
  output, by hub name or local directory (loaded with the same offline rules as the policy: no download when the
  hub is off or unreachable).
* :class:`SyntheticOracle` -- for the simulator: a preference matrix over a fixed response set with a
  non-transitive (rock-paper-scissors-like) cyclic part, an optional transitive part, and heterogeneous
  per-player perturbations (:meth:`SyntheticOracle.population`). Preferences that no scalar reward explains:
  the setting where Nash-style (MNPO) training should beat reward-style (DPO/IPO) training.

Every oracle answers :meth:`PreferenceOracle.pairs`: given a prompt and candidate texts, the ``(winner, loser)``
index pairs it asserts. Knows nothing about the swarm, opponents or the loss.
"""

from __future__ import annotations

import logging
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from node.config import OracleConfig, RewardModelOracleConfig, VerifiableOracleConfig
from node.tasks import extract_answer, is_exact
from protocol.errors import SwarmError
from protocol.types import TaskRef

logger = logging.getLogger(__name__)


class OracleError(SwarmError):
    """An oracle cannot be built (missing reward model, bad matrix) or cannot judge a prompt."""


class PreferenceOracle(ABC):
    """Judges responses to one prompt."""

    @abstractmethod
    def pairs(self, task: TaskRef, texts: Sequence[str], rng: random.Random) -> list[tuple[int, int]]:
        """``(winner, loser)`` index pairs into ``texts`` the oracle asserts (each unordered pair at most once)."""

    def exact(self, task: TaskRef, texts: Sequence[str]) -> list[bool] | None:
        """Whether each text is exactly right, for oracles that know (a verifier); ``None`` otherwise. It never
        decides which pairs exist; the MNPO phase trains first on the pairs it decides (a right answer over a wrong
        one) and reports how many there were."""
        return None


class PointwiseOracle(PreferenceOracle):
    """An oracle from a scalar score per response: ``i`` beats ``j`` when ``score_i - score_j > margin``."""

    def __init__(self, margin: float = 0.0) -> None:
        self.margin = margin

    @abstractmethod
    def scores(self, task: TaskRef, texts: Sequence[str]) -> list[float]:
        """One score per text (higher is better)."""

    def pairs(self, task: TaskRef, texts: Sequence[str], rng: random.Random) -> list[tuple[int, int]]:
        s = self.scores(task, texts)
        return _ordered_pairs(texts, lambda i, j: s[i] - s[j] > self.margin + 1e-12)


def _ordered_pairs(texts: Sequence[str], beats: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """``(winner, loser)`` for every unordered pair of different texts where ``beats`` says one beats the other."""
    out = []
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if texts[i] == texts[j]:
                continue
            if beats(i, j):
                out.append((i, j))
            elif beats(j, i):
                out.append((j, i))
    return out


class VerifiableOracle(PointwiseOracle):
    """The verifier's reward in [0, 1]: a pair only where rewards differ by more than ``margin``.

    ``rank="exact"`` ranks instead by (exactly right, answer in the format, shorter text), lexicographically: partial
    credit never decides a pair, and ties between two right (or two wrong) answers are broken by format, then length
    (``VerifiableOracleConfig.rank``); ``shorter_wins=False`` drops the length (equal exactness and format: no pair).

    ``tasks`` is a :class:`node.tasks.TaskSource` (or anything with ``materialize`` and ``score``): prompts are
    regenerated from their refs and every text is scored locally; a peer's reward hint is never used.
    """

    def __init__(self, tasks: Any, margin: float = 0.0, rank: str = "reward", shorter_wins: bool = True) -> None:
        super().__init__(margin)
        self.tasks = tasks
        self.rank = rank
        self.shorter_wins = shorter_wins

    def scores(self, task: TaskRef, texts: Sequence[str]) -> list[float]:
        item = self.tasks.materialize(task)
        return [float(self.tasks.score(item, t)) for t in texts]

    def pairs(self, task: TaskRef, texts: Sequence[str], rng: random.Random) -> list[tuple[int, int]]:
        if self.rank == "reward":
            return super().pairs(task, texts, rng)
        answers = [extract_answer(t) for t in texts]
        keys = [
            (x, a is not None, -len(t) if self.shorter_wins else 0)
            for x, a, t in zip(self.exact(task, texts), answers, texts, strict=True)
        ]
        return _ordered_pairs(texts, lambda i, j: keys[i] > keys[j])

    def exact(self, task: TaskRef, texts: Sequence[str]) -> list[bool]:
        item = self.tasks.materialize(task)
        return [bool(is_exact(item, extract_answer(t), float(self.tasks.score(item, t)))) for t in texts]


class RewardModelOracle(PointwiseOracle):
    """A sequence-classification reward model's logit on ``prompt + response`` (batched, no gradient).

    ``prompt_of`` turns a TaskRef into the prompt text the reward model sees (the question). The model is loaded
    from a local directory, or from the hub cache, or from the hub if allowed and reachable
    (``node.model.policy.hub_offline`` / ``hub_reachable``); otherwise :class:`OracleError`.
    """

    def __init__(
        self,
        name_or_path: str,
        prompt_of: Callable[[TaskRef], str],
        *,
        margin: float = 0.0,
        max_length: int = 512,
        batch_size: int = 16,
        device: Any = "cpu",
    ) -> None:
        super().__init__(margin)
        import torch

        self.prompt_of = prompt_of
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.model, self.tokenizer = _load_reward_model(name_or_path)
        self.model.to(self.device).eval().requires_grad_(False)
        if getattr(self.model.config, "num_labels", 1) != 1:
            raise OracleError(f"reward model {name_or_path!r} has {self.model.config.num_labels} outputs; need 1")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if getattr(self.model.config, "pad_token_id", None) is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id

    def scores(self, task: TaskRef, texts: Sequence[str]) -> list[float]:
        import torch

        prompt = self.prompt_of(task)
        out: list[float] = []
        for lo in range(0, len(texts), self.batch_size):
            chunk = list(texts[lo : lo + self.batch_size])
            enc = self.tokenizer(
                [prompt] * len(chunk),
                chunk,
                truncation=True,
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            ).to(self.device)
            with torch.no_grad():
                logits = self.model(**enc).logits  # (b, 1)
            out.extend(float(x) for x in logits[:, 0].float().cpu())
        return [x if math.isfinite(x) else -math.inf for x in out]


def _load_reward_model(name_or_path: str) -> tuple[Any, Any]:
    from pathlib import Path

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from node.model.policy import _looks_like_path, hub_offline, hub_reachable

    path = Path(name_or_path).expanduser()
    local = path.is_dir()
    if not local and _looks_like_path(name_or_path):
        raise OracleError(f"reward model path {name_or_path!r} does not exist")
    source = str(path) if local else name_or_path

    def load(local_only: bool) -> tuple[Any, Any]:
        tok = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1, local_files_only=local_only)
        return model, tok

    try:
        return load(local_only=True)
    except (OSError, ValueError) as e:
        if local:
            raise OracleError(f"cannot load reward model from {source!r}: {e}") from e
        cached_error = e
    if hub_offline() or not hub_reachable():
        raise OracleError(
            f"reward model {name_or_path!r} is not in the local cache and the hub is off or unreachable"
        ) from cached_error
    try:
        return load(local_only=False)
    except (OSError, ValueError) as e:
        raise OracleError(f"cannot load reward model {name_or_path!r}: {e}") from e


class SyntheticOracle(PreferenceOracle):
    """Preferences over a fixed response set ``{"r0", ..., "r{K-1}"}`` given by a matrix ``P[a, b] = Pr(a > b)``.

    ``P + P^T = 1`` and ``P[a, a] = 1/2``. :meth:`pairs` compares every pair of distinct known texts once and draws
    the winner from ``P`` (a noisy annotator); texts outside the set are ignored.
    """

    def __init__(self, matrix: Sequence[Sequence[float]]) -> None:
        k = len(matrix)
        if k < 2 or any(len(row) != k for row in matrix):
            raise OracleError("the preference matrix must be square, at least 2 x 2")
        for a in range(k):
            for b in range(k):
                p = float(matrix[a][b])
                if not (0.0 <= p <= 1.0 and abs(p + float(matrix[b][a]) - 1.0) < 1e-9):
                    raise OracleError(f"P[{a}][{b}] = {p}: need 0 <= P <= 1 and P[a][b] + P[b][a] = 1")
        self.matrix = [[float(x) for x in row] for row in matrix]
        self.k = k
        self.index = {response_text(i): i for i in range(k)}

    def prob(self, a: int, b: int) -> float:
        """``Pr(r_a > r_b)``."""
        return self.matrix[a][b]

    def pairs(self, task: TaskRef, texts: Sequence[str], rng: random.Random) -> list[tuple[int, int]]:
        out = []
        for i in range(len(texts)):
            for j in range(i + 1, len(texts)):
                a, b = self.index.get(texts[i]), self.index.get(texts[j])
                if a is None or b is None or a == b:
                    continue
                out.append((i, j) if rng.random() < self.matrix[a][b] else (j, i))
        return out

    @staticmethod
    def cyclic_matrix(k: int, cyclic: float = 1.0, transitive: float = 0.0) -> list[list[float]]:
        """``P = 1/2 + 1/2 * clip(cyclic * C + transitive * T)`` with ``C`` the cyclic tournament of odd ``k`` (``a``
        beats the next ``(k-1)/2`` responses mod ``k``: rock-paper-scissors for ``k = 3``) and ``T[a, b] =
        (b - a) / (k - 1)`` (lower index better, a transitive ranking)."""
        if k < 3 or k % 2 == 0:
            raise OracleError(f"cyclic preferences need an odd number of responses >= 3, got {k}")
        half = (k - 1) // 2
        m = []
        for a in range(k):
            row = []
            for b in range(k):
                if a == b:
                    row.append(0.5)
                    continue
                c = 1.0 if (b - a) % k <= half else -1.0
                t = (b - a) / (k - 1)
                row.append(0.5 + 0.5 * max(-1.0, min(1.0, cyclic * c + transitive * t)))
            m.append(row)
        return m

    @classmethod
    def population(
        cls,
        players: int,
        k: int,
        *,
        cyclic: float = 1.0,
        transitive: float = 0.0,
        heterogeneity: float = 0.0,
        seed: int = 0,
    ) -> tuple[SyntheticOracle, list[SyntheticOracle]]:
        """The population-level oracle and one heterogeneous oracle per player.

        Player ``i``'s matrix adds ``heterogeneity * N_i`` to the population's skew part, with ``N_i`` a random
        skew-symmetric matrix (entries uniform in [-1, 1]) and ``sum_i N_i = 0`` (centred), so the players disagree
        with each other but their average is the population's preference. Entries are clipped to [0, 1].
        """
        base = cls.cyclic_matrix(k, cyclic, transitive)
        rng = random.Random(f"synthetic-oracle:{seed}")
        noise = [[[0.0] * k for _ in range(k)] for _ in range(players)]
        for a in range(k):
            for b in range(a + 1, k):
                draws = [rng.uniform(-1.0, 1.0) for _ in range(players)]
                mean = sum(draws) / players
                for i in range(players):
                    noise[i][a][b] = draws[i] - mean
                    noise[i][b][a] = -(draws[i] - mean)
        per_player = []
        for i in range(players):
            m = [
                [min(1.0, max(0.0, base[a][b] + 0.5 * heterogeneity * noise[i][a][b])) for b in range(k)]
                for a in range(k)
            ]
            for a in range(k):  # clipping keeps P + P^T = 1 only up to rounding; restore it exactly
                for b in range(a + 1, k):
                    m[b][a] = 1.0 - m[a][b]
            per_player.append(cls(m))
        return cls(base), per_player


def response_text(i: int) -> str:
    """The text of synthetic response ``i``."""
    return f"r{i}"


def build_oracle(
    cfg: OracleConfig, tasks: Any, *, prompt_of: Callable[[TaskRef], str], device: Any
) -> PreferenceOracle:
    """The oracle a node's ``mnpo.oracle`` config names."""
    if isinstance(cfg, VerifiableOracleConfig):
        return VerifiableOracle(tasks, margin=cfg.margin, rank=cfg.rank, shorter_wins=cfg.shorter_wins)
    if isinstance(cfg, RewardModelOracleConfig):
        return RewardModelOracle(
            cfg.model,
            prompt_of,
            margin=cfg.margin,
            max_length=cfg.max_length,
            batch_size=cfg.batch_size,
            device=device,
        )
    raise OracleError(f"unknown oracle config {type(cfg).__name__}")

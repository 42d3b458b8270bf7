"""Rollout -> record: a step's own completions as the swarm sees them, with the engine's tokens kept beside them.

The engine returns :class:`node.seams.Generation` s (text, token ids, behaviour logprobs); the swarm and the wire
carry :class:`protocol.types.Completion` s (text, counts, a logprob summary, the node's reward as a hint). A step's
own groups travel as :class:`OwnRollouts`: the pooled groups the SAPO sampler and the publisher read, and, by group
key, the generations the learner trains on (exact tokens and behaviour logprobs, no re-tokenization).

Knows nothing about peers, losses or the network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from node.seams import Generation
from protocol.types import Completion, Group, TaskRef
from swarm.pool import SELF, PooledGroup


def completion_of(gen: Generation, reward_hint: float | None) -> Completion:
    """The wire form of one generated completion: text, token count, finish reason, policy version, the mean
    behaviour logprob (a hint for peers' importance weights) and this node's reward (a hint, never trusted)."""
    return Completion(
        text=gen.text,
        n_tokens=len(gen.token_ids),
        finish_reason=gen.finish_reason,
        policy_version=gen.policy_version,
        logprob_mean=(math.fsum(gen.logprobs) / len(gen.logprobs)) if gen.logprobs else None,
        reward_hint=reward_hint,
    )


def group_of(task: TaskRef, gens: Sequence[Generation], rewards: Sequence[float] | None) -> Group:
    """The wire form of one prompt's completions (``rewards``: hints, one per completion, or none)."""
    return Group(
        task=task,
        completions=tuple(completion_of(g, None if rewards is None else rewards[i]) for i, g in enumerate(gens)),
    )


@dataclass
class OwnRollouts:
    """One step's own scored groups and, by group key, the generations they came from."""

    groups: list[PooledGroup] = field(default_factory=list)
    generations: dict[str, Sequence[Generation]] = field(default_factory=dict)
    exact: list[bool] = field(default_factory=list)
    """Per completion (groups in order): whether its answer is exactly right -- the twin of the partial-credit
    rewards, which rise with half-right strings (empty when no exact check was given)."""

    def informative(self, *, solved: bool = False) -> list[Group]:
        """The groups worth publishing: peers drop zero-advantage groups anyway; with ``solved``, also the groups
        whose every completion was right (``sapo.publish_solved``)."""
        return [g.group for g in self.groups if g.informative or (solved and g.solved)]


def own_rollouts(
    refs: Sequence[TaskRef],
    gens: Sequence[Sequence[Generation]],
    score: Callable[[int, str], float],
    *,
    step: int,
    policy_version: int,
    tokenizer_id: str,
    exact: Callable[[int, str, float], bool] | None = None,
) -> OwnRollouts:
    """Score each completion with ``score(prompt_index, text)`` and wrap the groups for the pool and the learner;
    with ``exact(prompt_index, text, reward)``, also record whether each answer is exactly right."""
    out = OwnRollouts()
    for i, (ref, comps) in enumerate(zip(refs, gens, strict=True)):
        rewards = tuple(float(score(i, c.text)) for c in comps)
        if exact is not None:
            out.exact.extend(exact(i, c.text, r) for c, r in zip(comps, rewards, strict=True))
        key = f"{SELF}:{step}:{i}"
        out.groups.append(
            PooledGroup(
                key=key,
                source=SELF,
                group=group_of(ref, comps, rewards),
                rewards=rewards,
                step=step,
                policy_version=policy_version,
                tokenizer=tokenizer_id,
            )
        )
        out.generations[key] = comps
    return out

"""Adversarial swarm members for the in-process simulator: they publish hostile traffic every round.

Each adversary is a real swarm peer (its own Ed25519 identity, channel and memory transport) whose outgoing
traffic passes through the fault wrappers of :mod:`protocol.transport.faults`. Its own records are validly
signed rollouts for the swarm's tasks with wrong answers (every completion identical, so receivers that
re-score them find zero advantage); the wrappers then turn that into the attack:

* ``garbage``: plus ``records_per_round`` random byte strings (rejected before decoding);
* ``forged_reward``: every completion's reward hint set to 1 and re-signed (valid records; receivers re-score);
* ``replay``: plus re-publications of honest records it fetched (rejected as replays);
* ``flood``: plus validly signed junk records beyond the per-sender quota (rejected as a flood);
* ``wrong_swarm``: its records name another swarm id (rejected);
* ``tamper``: honest records it fetched re-published with flipped bits (rejected: signature or decoding).

Knows nothing about how honest nodes learn; the simulator checks that none of this changes their rewards.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from protocol.identity import Identity
from protocol.records import encode_record, window_of
from protocol.transport import faults
from protocol.transport.base import Transport
from protocol.types import Completion, Group, RolloutBatch, TaskRef

logger = logging.getLogger(__name__)

WRONG_ANSWER = "<answer>forged</answer>"


def junk_batch(refs: list[TaskRef], group_size: int, version: int) -> RolloutBatch:
    """Rollouts with one wrong answer repeated ``group_size`` times per task, claiming a perfect reward."""
    comp = Completion(text=WRONG_ANSWER, n_tokens=8, finish_reason="stop", reward_hint=1.0)
    return RolloutBatch(
        model="adversary",
        policy_version=version,
        tokenizer="adversary",
        groups=tuple(Group(task=r, completions=(comp,) * group_size) for r in refs),
    )


def wrap_transport(
    kind: str,
    inner: Transport,
    *,
    identity: Identity,
    swarm_id: str,
    records_per_round: int,
    clock: Callable[[], float],
    window_seconds: float,
    seed: int,
) -> Transport:
    """The adversary's transport: ``inner`` wrapped in the fault injectors of attack ``kind``."""
    if kind == "garbage":
        return faults.Flood(inner, copies=records_per_round, size=512, seed=seed)
    if kind == "forged_reward":
        return faults.Forge(inner, forger=identity, mode="reward", reward=1.0, seed=seed)
    if kind == "replay":
        return faults.Replay(inner, copies=records_per_round, seed=seed)
    if kind == "tamper":
        return faults.Replay(
            faults.Tamper(inner, p=1.0, flips=3, direction="publish", seed=seed),
            copies=records_per_round,
            seed=seed + 1,
        )
    if kind == "flood":
        rng = random.Random(seed)

        def make(i: int) -> bytes:
            now = clock()
            refs = [TaskRef(family="flood", index=rng.randrange(1 << 30))]
            return encode_record(
                identity,
                kind="rollouts",
                swarm=swarm_id,
                seq=int(now * 1000) + 1 + (i % 5000),
                window=window_of(now, window_seconds),
                created=now,
                payload=junk_batch(refs, 2, 0),
            )

        return faults.Flood(inner, copies=records_per_round, make=make, seed=seed)
    if kind == "wrong_swarm":
        return inner  # the channel itself is opened for another swarm id
    raise ValueError(f"unknown adversary type {kind!r}")


class Adversary:
    """One hostile peer: each round it publishes a junk record through its (wrapped) channel and polls."""

    def __init__(
        self, kind: str, channel: Any, refs: Callable[[random.Random], list[TaskRef]], group_size: int, seed: int
    ) -> None:
        self.kind = kind
        self.channel = channel
        self.refs = refs
        self.group_size = group_size
        self.rng = random.Random(f"adversary:{seed}")
        self.rounds = 0

    async def act(self) -> None:
        """One round: fetch (so replay/tamper have honest records to abuse), then publish."""
        try:
            await self.channel.poll()
        except Exception as e:  # an attacker's failures are its own problem
            logger.debug("adversary poll failed: %s", e)
        batch = junk_batch(self.refs(self.rng), self.group_size, self.rounds)
        try:
            await self.channel.publish("rollouts", batch)
        except Exception as e:
            logger.debug("adversary publish failed: %s", e)
        self.rounds += 1

    async def close(self) -> None:
        await self.channel.close()

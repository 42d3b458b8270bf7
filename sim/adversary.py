"""Adversarial swarm members for the in-process simulator: they publish hostile traffic every round.

Each adversary is a real swarm peer (its own Ed25519 identity, channel and memory transport) whose outgoing
traffic passes through the fault wrappers of :mod:`sim.faults`. Its own records are validly
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

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from protocol.identity import Identity
from protocol.records import encode_record, window_of
from protocol.transport.base import Transport
from protocol.types import Completion, Group, RolloutBatch, TaskRef
from sim import faults

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


class SybilSwarm:
    """``count`` throwaway identities per round, each publishing one valid, *informative* record (half right, half
    wrong answers, so re-scoring keeps its groups): the attack a per-peer cap cannot stop. Identities are minted
    fresh every round (derived from ``(seed, round, i)``), as a cheap attacker would. Publishes straight into the
    network through one transport, each record listed in its own identity's signed index entry."""

    def __init__(
        self,
        transport: Transport,
        *,
        count: int,
        swarm_id: str,
        refs: Callable[[random.Random], list[TaskRef]],
        solve: Callable[[TaskRef], str],
        group_size: int,
        clock: Callable[[], float],
        window_seconds: float,
        seed: int,
        start: int = 0,
        concurrency: int = 1,
    ) -> None:
        self.kind = "sybil"
        #: Publishes in flight at once (1 in the simulator, which stays deterministic; more against a real DHT).
        self.concurrency = max(1, concurrency)
        self.transport = transport
        self.count, self.swarm_id, self.refs, self.solve = count, swarm_id, refs, solve
        self.group_size = max(2, group_size)
        self.clock, self.window_seconds, self.seed, self.start = clock, window_seconds, seed, start
        self.rng = random.Random(f"sybil:{seed}")
        self.rounds = 0
        self.published = 0
        self.senders: set[str] = set()

    def _batch(self, ref: TaskRef) -> RolloutBatch:
        from node.tasks import format_answer

        right = format_answer(self.solve(ref))
        wrong = format_answer("0")
        half = self.group_size // 2
        comps = tuple(
            Completion(text=right if i < half else wrong, n_tokens=8, finish_reason="stop", reward_hint=1.0)
            for i in range(self.group_size)
        )
        return RolloutBatch(
            model="sybil", policy_version=0, tokenizer="sybil", groups=(Group(task=ref, completions=comps),)
        )

    async def act(self) -> None:
        """One round: ``count`` fresh identities publish one record each (from round ``start`` on)."""
        import hashlib

        from protocol.layout import IndexWriter

        r = self.rounds
        self.rounds += 1
        if r < self.start:
            return
        now = self.clock()
        window = window_of(now, self.window_seconds)

        async def one(i: int) -> None:
            ident = Identity.from_private_bytes(hashlib.sha256(f"sybil:{self.seed}:{r}:{i}".encode()).digest())
            data = encode_record(
                ident,
                kind="rollouts",
                swarm=self.swarm_id,
                seq=int(now * 1000),
                window=window,
                created=now,
                payload=self._batch(self.refs(self.rng)[0]),
            )
            # Throwaway identities do not pay the index work stamp (SPEC 7.4): free to mint, read after stamped ones.
            index = IndexWriter(ident, self.swarm_id, work_bits=None).add(data, window)
            try:
                await self.transport.publish(data, window=window, sender=ident.peer_id, index=index)
                self.published += 1
                self.senders.add(ident.peer_id)
            except Exception as e:
                logger.debug("sybil publish failed: %s", e)

        for first in range(0, self.count, self.concurrency):
            await asyncio.gather(*(one(i) for i in range(first, min(self.count, first + self.concurrency))))

    async def close(self) -> None:
        await self.transport.close()

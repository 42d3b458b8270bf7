"""py-libp2p GossipSub and Pubsub, patched to count what the library drops silently, and the router we build.

py-libp2p 0.8.1 only logs a message refused by its per-topic spam protection, a message its 32-slot subscription
buffer cannot take, and a message from a peer whose score fell below the publish threshold; these subclasses
count each of them by reason through a ``count`` callback. The router is GossipSub v1.1 with peer scoring: each
invalid message costs its forwarder one point (``P4``, decaying 1% per heartbeat); below ``-PUBLISH_THRESHOLD``
its messages are refused, below ``-GRAYLIST_THRESHOLD`` it is ignored altogether.

Knows nothing about records or the sync protocol.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub, ValidationError
from libp2p.pubsub.score import ScoreParams, TopicScoreParams

from protocol.transport.config import Libp2pTransportConfig

PUBLISH_THRESHOLD = 20.0
GRAYLIST_THRESHOLD = 50.0

Count = Callable[[str], None]

# What the topic validator said of the copy it is validating beyond True/False ("unjudged", "forwarder_failed"): a
# list set per CountingPubsub.validate_msg call; the validator runs in a child task, which inherits a copy of the
# context and so shares the list.
_QUALIFIERS: ContextVar[list[str] | None] = ContextVar("lp2p_verdict_qualifiers", default=None)


def _qualify(kind: str) -> None:
    box = _QUALIFIERS.get()
    if box is None:
        raise RuntimeError(f"{kind}() qualifies a verdict: call it from a topic validator run by validate_msg")
    box.append(kind)


class CountingGossipSub(GossipSub):
    """GossipSub that counts what its spam protection drops (it only logs them)."""

    count: Count = staticmethod(lambda reason: None)

    def _check_spam_protection(self, peer_id: ID, msg: Any) -> bool:
        ok = super()._check_spam_protection(peer_id, msg)
        if not ok:
            self.count("spam_protection")
        return ok


class CountingPubsub(Pubsub):
    """Pubsub that counts messages its subscription buffer drops (it only logs them), and writes each RPC whole.

    Nothing is lost by a subscription drop here (the topic validator already stored the record), but it is
    counted. py-libp2p 0.8.1 writes RPCs to a peer's stream from several tasks (the outbound queue, publish,
    control messages), and its yamux stream takes its write lock per frame, not per write: under load a 200 KB
    RPC and a control message interleave, the receiver fails to parse the RPC and its whole host stops. One lock
    per stream around each RPC write prevents it.
    """

    count: Count = staticmethod(lambda reason: None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()
        #: The forwarder whose message just failed validation without being judged (see :meth:`unjudged`).
        self.spared: ID | None = None

    def unjudged(self) -> None:
        """Called by the topic validator: it cannot tell whether the message it is validating is valid (e.g.
        fetching an announced record timed out). That copy is dropped without costing its forwarder score and
        without caching the failure.

        py-libp2p knows only valid and invalid: an invalid message costs its forwarder a P4 point and the verdict
        is cached for 5 minutes by message id, so every later forwarder of the same message is refused and
        penalized too. Under load one slow fetch would then cost many honest peers their score, and the record
        could not arrive by gossip at all."""
        _qualify("unjudged")

    def forwarder_failed(self) -> None:
        """Called by the topic validator: the forwarder failed us (it announced a record it then did not serve),
        which says nothing about the message itself. The forwarder pays the P4 point, but the failure is not
        cached, so the same announcement from another forwarder is validated afresh."""
        _qualify("forwarder_failed")

    async def validate_msg(self, msg_forwarder: ID, msg: Any) -> None:
        # A box per validation, which the validator's task inherits: copies of one message from several
        # forwarders are validated at the same time, so what the validator says must reach this copy's call only.
        box: list[str] = []
        token = _QUALIFIERS.set(box)
        try:
            await super().validate_msg(msg_forwarder, msg)
        except ValidationError:
            msg_id = self._msg_id_constructor(msg)
            cached = self.validation_cache.cache.get(msg_id)
            # py-libp2p's own timeout starts while a validation still queues for one of its 10 slots: under load
            # an honest message can run out of time before it is even looked at.
            if cached is not None and cached.error_message == "Validation timeout":
                box.append("unjudged")
            if cached is not None and (cached.error_message or "").startswith("Validation error"):
                self.count("validator_raised")  # a bug of ours, not the forwarder's: counted to be seen
            if "unjudged" in box or "forwarder_failed" in box:
                self.validation_cache._remove(msg_id)  # the next copy is validated afresh
            if "unjudged" in box:
                self.spared = msg_forwarder  # push_msg scores right after this raise, with no await between
            raise
        finally:
            _QUALIFIERS.reset(token)

    async def write_msg(self, stream: Any, rpc_msg: Any) -> bool:
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            return await super().write_msg(stream, rpc_msg)

    def notify_subscriptions(self, publish_message: Any) -> None:
        for topic in publish_message.topicIDs:
            if topic in self.topic_ids:
                try:
                    self.subscribed_topics_send[topic].send_nowait(publish_message)
                except trio.WouldBlock:
                    self.count("subscription_overflow")


def build_pubsub(host: Any, cfg: Libp2pTransportConfig, count: Count) -> tuple[CountingPubsub, CountingGossipSub]:
    """The transport's GossipSub router (scored, counting) and the Pubsub service over ``host``."""
    score = ScoreParams(
        p4_invalid_messages=TopicScoreParams(weight=1.0, cap=1000.0, decay=0.99),
        publish_threshold=-PUBLISH_THRESHOLD,
        gossip_threshold=-PUBLISH_THRESHOLD,
        graylist_threshold=-GRAYLIST_THRESHOLD,
    )
    router = CountingGossipSub(
        protocols=[PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=cfg.degree,
        degree_low=max(1, cfg.degree - 2),
        degree_high=2 * cfg.degree,
        heartbeat_interval=cfg.heartbeat_interval_s,
        max_messages_per_topic_per_second=cfg.router_max_messages_per_s,
        score_params=score,
        do_px=cfg.gossipsub_px,
    )
    router.count = count
    scorer = router.scorer
    assert scorer is not None  # built from score_params above
    gate = scorer.allow_publish

    def allow_publish(peer: ID, topics: list[str]) -> bool:
        ok = gate(peer, topics)
        if not ok:
            count("low_peer_score")
        return ok

    pubsub = CountingPubsub(host, router, validation_timeout=cfg.request_timeout_s)
    pubsub.count = count
    penalize = scorer.on_invalid_message

    def on_invalid_message(peer: ID, topic: str) -> None:
        if pubsub.spared is not None and pubsub.spared == peer:
            pubsub.spared = None
            count("unjudged")
            return
        penalize(peer, topic)

    # Count refusals by score and spare unjudged messages: the scorer's methods are wrapped on this instance
    # (py-libp2p offers no hook).
    setattr(scorer, "allow_publish", allow_publish)  # noqa: B010
    setattr(scorer, "on_invalid_message", on_invalid_message)  # noqa: B010
    return pubsub, router

"""The hivemind transport: signed record bytes in a hivemind (Kademlia) DHT, in the sharded ``protocol.layout``.

Key layout (``protocol/SPEC.md`` section 7):

* record ``{swarm}/rollouts/{window}/{sender}/{digest}`` -> the record bytes (a plain value, no subkey), where
  ``digest`` is the first 16 bytes of SHA-256 of the record, in hex: keys are content addressed, so nobody can
  overwrite a record with different bytes, and any peer can check a value against its key;
* peer ``{swarm}/peer/{window}/{sender}`` -> the sender's signed index entry for the window (plain value);
* shard ``{swarm}/shard/{window}/{level}/{shard}`` -> subkey ``sender`` -> the same signed index entry, for each
  level the writer writes. An entry that lists more digests is stored with a later expiration (base + 0.01 s per
  digest), so hivemind keeps the newest one.

A poll reads a few shards, the followed senders' peer keys and one top-level shard (one ``get_many``), then at
most ``poll_records`` new record keys (another ``get_many``): per-node cost per poll does not grow with the swarm,
and no key holds more than about ``poll_senders`` entries. Large values never share a key (p2pd caps a message
at 4 MiB: 32 x 200 KB under one key fails silently). Entries expire ``expiration_windows`` windows after their
window ends.

Every honest node runs :class:`DHTRecordGuard` (a hivemind ``RecordValidatorBase``) on everything it is asked
to store and on every value a peer returns: a record must decode as a signed record of this swarm whose
``(window, sender, digest)`` reproduces the key it is stored under, and must pass the caller's ``validate``
hook; an index entry must be signed by its sender, name this swarm, and sit under a key (and subkey) its own
``(window, sender)`` produces. Refusals are counted by reason (:meth:`HivemindTransport.rejections`).

The DHT runs as an in-process ``DHTNode`` on a private event loop in a daemon thread (with its own ``p2pd``
child process). That sidesteps hivemind's ``DHT`` process wrapper, whose pipe breaks on values above ~16 KB
(hivemind PR #660), and it keeps peer bytes out of that wrapper's pickled pipe. Callers' coroutines never run
hivemind code on their own loop; every call into the DHT has a timeout.

The daemon's libp2p key is the node's identity key (``protocol.transport.netkey``), written to a 0600 file in a
private temporary directory at start and removed at close, so a node restarted with the same ``identity.key`` has the
same ``/p2p/`` id (and, when ``port`` is set, the same multiaddr) and its DHT id, derived from the same public key,
is the same too. A transport built without a key makes a fresh one (a new peer id at every start).

If the daemon dies under a running node (killed, out of memory, crashed: any exit but the clean exit 0 that
SIGINT/SIGTERM give it when the node is being stopped too), the next call restarts the DHT node on the same port
with the same libp2p key and DHT id, bootstrapping from the configured peers and the peers it was last connected
to, so peers' routing tables stay valid; a failed restart is retried with a growing delay.

With ``cfg.gossip`` (the default) the node also joins the swarm's GossipSub topic through p2pd's own pubsub and serves
the sync protocol (``protocol.transport.hivemind.gossip``, SPEC 7.6): every record is published to the DHT and to the
topic, and ``fetch_recent`` adds what arrived over the topic or by sync, so libp2p-transport nodes are in the same
swarm.

This is the only module of the project that imports hivemind. It knows nothing about what a record means
beyond its signed header (``protocol.records`` decodes it), nor about replay, quotas or dedup by sequence
number: the channel's validator does those on the receive path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import Collection, Coroutine, Sequence
from typing import Any

import msgpack
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import P2PDaemonError, PeerID
from multiaddr import Multiaddr
from multiaddr.protocols import P_P2P as P2P_CODE

from protocol.codec import RecordDecodeError, RecordSignatureError
from protocol.errors import TransportError
from protocol.layout import (
    ShardParams,
    ShardReader,
    decode_index_entry,
    peer_key,
    record_digest_hex,
    record_key,
    shard_key,
    shard_of,
)
from protocol.transport.base import RecordCheck, Transport
from protocol.transport.config import DHT_REPLICAS, HivemindTransportConfig, ProtocolConfig
from protocol.transport.gossip import INLINE_MAX_BYTES, gossip_topic
from protocol.transport.hivemind.capacity import CappedStorage, install
from protocol.transport.hivemind.gossip import TopicMember
from protocol.transport.hivemind.guard import (
    NO_SUBKEY,
    DHTRecordGuard,
    answer_pings_during_create,
    keep_valid_subkeys,
    key_id,
)
from protocol.transport.hivemind.loop import LoopThread, T, port_of
from protocol.transport.hivemind.pubsub import PUBSUB_FLAGS, daemon_args
from protocol.transport.hivemind.reach import (
    DEMOTE_NETWORKS,
    REACHABLE,
    UNKNOWN,
    UNREACHABLE,
    DialBackService,
    Probe,
    candidates,
    probe,
    set_client_mode,
)
from protocol.transport.netkey import NetworkKey

logger = logging.getLogger(__name__)
answer_pings_during_create()  # before any DHT process forks from this one (hivemind's DHT is a ForkProcess)


#: Seconds p2pd gets to exit after SIGTERM on close before it is killed.
P2PD_EXIT_TIMEOUT_S = 5.0
#: An index entry listing one more digest expires this much later (hivemind keeps the later-expiring value).
ENTRY_EXPIRATION_STEP_S = 0.01
#: Delay before retrying a failed DHT restart, doubled per failure up to the maximum (seconds).
RESTART_BACKOFF_S = (2.0, 60.0)
#: Peers' addresses remembered to bootstrap from after a restart.
MAX_KNOWN_PEERS = 16
#: Seconds between attempts to rejoin the swarm while this node's routing table is empty.
REJOIN_INTERVAL_S = 10.0
#: Seconds between dial-back probes while nobody has answered one, and between re-checks once a peer has.
REACH_RETRY_S = (5.0, 600.0)
#: Domain of the DHT id derived from the node's public key (``DHTID.generate`` hashes it with SHA-1).
DHT_ID_DOMAIN = b"rl-swarm/dht-id/v1\x00"


class HivemindTransport(Transport):
    """Transport over a hivemind DHT node; build it with ``await HivemindTransport.create(cfg, swarm=...)``."""

    def __init__(
        self,
        cfg: HivemindTransportConfig,
        protocol: ProtocolConfig,
        swarm: str,
        runner: LoopThread,
        node: DHTNode,
        guard: DHTRecordGuard | None,
        addresses: list[str],
        create_kwargs: dict[str, Any] | None = None,
        key_dir: str | None = None,
        member: TopicMember | None = None,
    ):
        self.cfg = cfg
        self.protocol = protocol
        self.swarm = swarm
        self.guard = guard
        self._runner = runner
        self._node = node
        self._addresses = addresses
        self._record_validator = guard.hook if guard is not None else None
        self.params = ShardParams.from_config(protocol)
        self.reader = ShardReader(swarm, self.params, keep_windows=cfg.expiration_windows + 2)
        self._closed = False
        self._fetch_lock = asyncio.Lock()
        # (p2pd child, a task that ends when it exits): one per daemon, on the DHT loop (see _daemon_exited).
        self._exit_watch: tuple[Any, asyncio.Future[Any]] | None = None
        # What a restart needs: the DHTNode.create arguments, the daemon's key file, peers' addresses.
        self._create_kwargs = dict(create_kwargs or {})
        self._key_dir = key_dir
        self._known_peers: OrderedDict[str, str] = OrderedDict()  # libp2p peer id -> a multiaddr with /p2p/
        self._restart_lock = asyncio.Lock()
        self._restart_after = 0.0  # monotonic time before which a failed restart is not retried
        self._restart_failures = 0
        #: DHT restarts after the daemon died (``stats()['restarts']``).
        self.restarts = 0
        self._rejoin_after = 0.0  # monotonic time before which an empty routing table is not acted on again
        self._rejoin_task: asyncio.Task[None] | None = None
        self._rejoin_said = False  # this stretch alone was logged (once, not every 10 s)
        #: Times this node found its routing table empty and pinged known peers again, and how many answered.
        self.rejoins = 0
        self.rejoined = 0
        #: What the last dial-back probe found (``reach.REACHABLE`` / ``UNREACHABLE`` / ``UNKNOWN``), with
        #: ``client_mode: auto``; and the probe task, on the DHT's loop.
        self.reachability = UNKNOWN
        self._reach_future: Any = None
        #: The node's membership of the swarm's GossipSub topic (``cfg.gossip``), attached to each daemon it runs.
        self.member = member
        #: Whether any peer has answered a probe (retry quickly only while none has).
        self._reach_heard = False

    @classmethod
    async def create(
        cls,
        cfg: HivemindTransportConfig,
        *,
        swarm: str,
        validate: RecordCheck | None = None,
        protocol: ProtocolConfig | None = None,
        key: NetworkKey | None = None,
    ) -> HivemindTransport:
        """Start a DHT node (and its p2pd), bootstrapping from ``cfg.initial_peers`` or starting a new swarm.

        ``key`` is p2pd's libp2p key (the node's identity, :meth:`NetworkKey.of`): the same key gives the same
        ``/p2p/`` id and DHT id at every start; None makes a fresh one.

        ``validate`` is the store-time hook (e.g. ``RecordValidator.verdict``); it must be stateless, since
        hivemind validates the same entry many times. ``protocol`` gives the window length and record size cap
        (defaults: ``ProtocolConfig()``); every node of a swarm must use the same window length.
        """
        protocol = protocol if protocol is not None else ProtocolConfig()
        guard = None
        if cfg.store_validation:
            guard = DHTRecordGuard(
                swarm,
                max_bytes=protocol.max_record_bytes,
                max_ttl_s=(cfg.expiration_windows + protocol.max_future_windows + 2) * protocol.window_seconds,
                validate=validate,
                params=ShardParams.from_config(protocol),
                clock_offset_s=protocol.clock_offset_s,
            )
        runner = LoopThread(name=f"hivemind-dht-{swarm}")
        key = key if key is not None else NetworkKey.generate()
        key_dir = tempfile.mkdtemp(prefix="rl-swarm-p2pd-")  # mode 0700: only this user can reach the key file
        key.write_p2pd_key(os.path.join(key_dir, "p2pd.key"))
        kwargs: dict[str, Any] = dict(
            initial_peers=list(cfg.initial_peers) or None,
            host_maddrs=[f"/ip4/{cfg.host}/tcp/{cfg.port}"],
            # auto: a node given peers starts as a client (never a replica nobody can dial) until a peer dials it
            client_mode=cfg.client_mode if isinstance(cfg.client_mode, bool) else bool(cfg.initial_peers),
            # a node whose peers are all down trains alone and retries (_rejoin_if_alone), it does not fail
            ensure_bootstrap_success=False,
            record_validator=guard,
            wait_timeout=cfg.request_timeout_s,
            # The node's own key (never hivemind's default, shared by all DHTs in one process), in a private file
            # that a restarted daemon reads again. No "identity taken" probe: it starts a second daemon at every
            # start, and a key file is one node's (two processes sharing one would collide on records as well).
            identity_path=os.path.join(key_dir, "p2pd.key"),
            check_if_identity_free=False,
            node_id=DHTID.generate(source=DHT_ID_DOMAIN + key.public),
            num_replicas=DHT_REPLICAS,
        )
        if cfg.announce_maddrs:
            kwargs["announce_maddrs"] = list(cfg.announce_maddrs)
        if cfg.relay_via_peers and cfg.initial_peers:
            kwargs.update(use_auto_relay=True, trusted_relays=list(cfg.initial_peers), force_reachability="private")
        member = None
        if cfg.gossip:
            member = TopicMember(
                swarm=swarm,
                topic=gossip_topic(cfg.topic_prefix, swarm),
                protocol=protocol,
                expiration_windows=cfg.expiration_windows,
                hook=guard.hook if guard is not None else validate,
                key=key,
                sync_interval_s=cfg.sync_interval_s,
                request_timeout_s=cfg.request_timeout_s,
                inline_max_bytes=INLINE_MAX_BYTES,
            )
        try:
            node = await runner.call(
                _create_capped(kwargs, protocol.index_work_bits, pubsub=cfg.gossip), timeout=cfg.startup_timeout_s
            )
            maddrs = await runner.call(node.get_visible_maddrs(), timeout=cfg.request_timeout_s)
            if member is not None:
                await runner.call(member.attach(node.p2p, [str(m) for m in maddrs]), timeout=cfg.startup_timeout_s)
        except BaseException as e:
            runner.stop()
            shutil.rmtree(key_dir, ignore_errors=True)
            if isinstance(e, asyncio.CancelledError):
                raise
            raise TransportError(f"hivemind DHT could not start ({e.__class__.__name__}: {e})") from e
        addresses = [str(m) for m in maddrs]
        logger.info("hivemind DHT up for swarm %r at %s", swarm, ", ".join(addresses))
        self = cls(
            cfg, protocol, swarm, runner, node, guard, addresses, create_kwargs=kwargs, key_dir=key_dir, member=member
        )
        if cfg.initial_peers and not node.protocol.routing_table.peer_id_to_uid:
            logger.warning(
                "none of the %d --peers address(es) answered: training alone, retrying every %.0f s",
                len(cfg.initial_peers),
                REJOIN_INTERVAL_S,
            )
        if cfg.client_mode == "auto":
            if node.protocol.routing_table.peer_id_to_uid:
                # decide before the node is handed out (a NATed node: within the probe's 4 s dial timeout), so
                # peers and the node's own first publish see it in its mode
                with contextlib.suppress(Exception):
                    await runner.call(self._reach_step(), timeout=30.0)
            self._reach_future = asyncio.run_coroutine_threadsafe(self._reach_loop(), runner.loop)
        return self

    # -- Transport interface -------------------------------------------------------------------------------------

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        """Store the record under its content-addressed key and its sender's index entry under the peer key and the
        shard of each level this node writes; without ``index`` the record is stored but nobody can find it."""
        await self._ensure_daemon()
        if len(data) > self.protocol.max_record_bytes:
            cap = self.protocol.max_record_bytes
            raise TransportError(f"record of {len(data)} bytes exceeds max_record_bytes={cap}")
        digest = record_digest_hex(data)
        # Expire a fixed number of windows after the record's own window ends (not after the store).
        expiration = float((window + 1 + self.cfg.expiration_windows) * self.protocol.window_seconds)
        keys: list[str] = [record_key(self.swarm, window, sender, digest)]
        values: list[bytes] = [data]
        subkeys: list[str | None] = [None]
        expirations = [expiration]
        if index is not None:
            try:
                entry = decode_index_entry(index, verify_signature=False)
            except (RecordDecodeError, RecordSignatureError) as e:
                raise TransportError(f"hivemind transport refuses a malformed index entry ({e.reason})") from None
            if entry.window != window or entry.sender != sender or digest not in entry.digests:
                raise TransportError("hivemind transport refuses an index entry that does not list this record")
            entry_exp = expiration + ENTRY_EXPIRATION_STEP_S * entry.count
            keys.append(peer_key(self.swarm, window, sender))
            values.append(index)
            subkeys.append(None)
            expirations.append(entry_exp)
            for level in self.reader.write_levels():
                keys.append(shard_key(self.swarm, window, level, shard_of(window, sender, level, self.params.fanout)))
                values.append(index)
                subkeys.append(sender)
                expirations.append(entry_exp)
        if self.member is not None:
            await self._gossip(data, window)
        if self.guard is not None:
            # Refuse up front, with the reason, what every honest replica (our own node included) would refuse.
            record = DHTRecord(key_id(keys[0]), NO_SUBKEY, msgpack.packb(data, use_bin_type=True), expiration)
            reason = self.guard.check(record)
            if reason is not None:
                raise TransportError(f"hivemind transport refuses to publish this record ({reason})")
        try:
            ok = await self._call(
                self._node.store_many(keys, values, expirations, subkeys=subkeys, beam_size=self.cfg.lookup_beam),
                timeout=self.cfg.request_timeout_s * 2,
            )
        except TimeoutError:
            raise TransportError(f"hivemind store timed out after {self.cfg.request_timeout_s * 2:.0f}s") from None
        if not all(ok.values()):
            # Our node stored it; some replica refused (e.g. its clock puts the window out of range) or timed out.
            logger.debug("hivemind store of %s/%s not accepted by every replica: %s", window, digest, ok)
        if index is not None:
            self.reader.remember_own(data, window)

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        """A bounded sample of the records of ``windows`` (those of ``prefer`` first) plus what earlier polls fetched;
        never hangs, never raises on network faults: on a timeout it returns what it has."""
        await self._ensure_daemon()
        self._rejoin_if_alone()
        self._adopt_pushed(windows)
        async with self._fetch_lock:
            try:
                polled = await self.reader.poll(windows, prefer, self._get_shards, self._get_peers, self._get_records)
            except TimeoutError:
                logger.debug("hivemind fetch timed out; returning cached records")
                polled = [d for w in sorted(set(windows)) for d in self.reader.cache.get(w, {}).values()]
        pushed = self.member.records(list(windows)) if self.member is not None else []  # arrived during the poll too
        return list(dict.fromkeys([*polled, *pushed])) if pushed else polled

    def _adopt_pushed(self, windows: Sequence[int]) -> None:
        """Put the records that arrived over the topic (validated at the edge) into the DHT reader's cache under their
        DHT digest, so a poll fetches from the DHT only what gossip has not brought."""
        if self.member is None:
            return
        store = self.member.store
        for w, digest in store.inventory(list(windows), 1 << 16):
            have = self.reader.cache.setdefault(w, OrderedDict())
            key = digest[:16].hex()  # SPEC 7.1's digest: the first 16 bytes of the SHA-256 that 7.3 uses whole
            if key not in have:
                data = store.get(digest)
                if data is not None:
                    have[key] = data

    async def _gossip(self, data: bytes, window: int) -> None:
        """Publish on the swarm's topic too (SPEC 7.6); a failure is logged and counted, the DHT store still runs."""
        assert self.member is not None
        member = self.member
        try:
            await self._call(member.publish(data, window), self.cfg.request_timeout_s)
        except Exception as e:
            member.counters.drop("gossip_publish_failed")
            logger.debug("gossip publish failed: %s: %s", e.__class__.__name__, e)

    async def sync_now(self) -> int:
        """Pull the recent windows from every connected peer over the sync protocol (tests); new records."""
        if self.member is None:
            return 0
        await self._ensure_daemon()
        return await self._call(self.member.sync_all(), self.cfg.request_timeout_s * 3)

    async def peers(self) -> list[str]:
        """libp2p peer ids (base58) of the DHT nodes in this node's routing table."""
        if self._closed:
            return []
        await self._ensure_daemon()
        node = self._node

        async def read() -> list[str]:
            # Remember where connected peers listen: a restarted DHT bootstraps from them (the node that started
            # the swarm has no initial peers of its own).
            with contextlib.suppress(Exception):
                for info in await asyncio.wait_for(node.p2p.list_peers(), self.cfg.request_timeout_s):
                    addrs = [str(a) for a in info.addrs if "/ip4/" in str(a) or "/ip6/" in str(a)]
                    if addrs:
                        self._known_peers.pop(str(info.peer_id), None)
                        self._known_peers[str(info.peer_id)] = f"{addrs[0]}/p2p/{info.peer_id}"
                while len(self._known_peers) > MAX_KNOWN_PEERS:
                    self._known_peers.popitem(last=False)
            return [str(pid) for pid in node.protocol.routing_table.peer_id_to_uid]

        return await self._runner.call(read(), timeout=self.cfg.request_timeout_s * 2)

    def _rejoin_if_alone(self) -> None:
        """Ping the configured and remembered peers again, in the background, when this node's routing table is
        empty; at most every :data:`REJOIN_INTERVAL_S`, and never holding up the poll that noticed it.

        hivemind drops a peer from the routing table after one unanswered request and learns of peers only from
        requests. Two nodes that time out on each other at once (a partition, a paused process whose pending
        requests all expire when it resumes) forget each other for good, and the nodes of a split swarm never find
        each other again. The node that started the swarm has no initial peers, so peers it was connected to are
        remembered (:meth:`peers`) for this as for a restart."""
        if self._closed or time.monotonic() < self._rejoin_after or self._node.protocol.routing_table.peer_id_to_uid:
            return
        if self._rejoin_task is not None and not self._rejoin_task.done():
            return
        self._rejoin_after = time.monotonic() + REJOIN_INTERVAL_S
        addrs = list(dict.fromkeys([*self.cfg.initial_peers, *self._known_peers.values()]))
        if addrs:
            self._rejoin_task = asyncio.get_running_loop().create_task(self._rejoin(addrs))

    async def _rejoin(self, addrs: list[str]) -> None:
        node = self._node
        self.rejoins += 1
        if not self._rejoin_said:
            self._rejoin_said = True
            logger.info("no DHT peers left; pinging %d known peer(s) again", len(addrs))

        async def ping(addr: str) -> bool:
            maddr = Multiaddr(addr)
            peer = PeerID.from_base58(maddr["p2p"])
            with contextlib.suppress(Exception):  # the daemon may still know a route if this dial fails
                # hivemind has no public call for this; DHTNode.create reaches its initial peers the same way
                await node.p2p._client.connect(peer, [maddr.decapsulate_code(P2P_CODE)])
            return await node.protocol.call_ping(peer, validate=False, strict=False) is not None

        async def ping_all() -> list[bool | BaseException]:
            return await asyncio.gather(*(ping(a) for a in addrs), return_exceptions=True)

        try:
            answers = await self._call(ping_all(), self.cfg.request_timeout_s * 2)
        except Exception as e:  # a background task: nobody awaits it, so it must not end in an exception
            logger.debug("rejoin pings failed: %s: %s", e.__class__.__name__, e)
            return
        answered = sum(1 for a in answers if a is True)
        self.rejoined += answered
        if answered:
            self._rejoin_said = False
            logger.info("rejoined the swarm: %d of %d known peer(s) answered", answered, len(addrs))

    async def check_reachability(self) -> str:
        """Ask connected peers to dial this node back now (``reach.probe``); the verdict, also kept in
        :attr:`reachability`. Does not switch modes (the background check does, with ``client_mode: auto``)."""
        self._check_open()
        if self._reach_future is not None and not self._reach_future.done():
            # the background check probes at start: a second probe now would be refused by the same peers
            deadline = time.monotonic() + 30.0
            while self.reachability == UNKNOWN and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            return self.reachability
        verdict = (await self._runner.call(self._probe(), timeout=60.0)).verdict
        if verdict != UNKNOWN:
            self.reachability = verdict
        return verdict

    async def _probe(self) -> Probe:
        node = self._node
        port = port_of(list(self.cfg.announce_maddrs) or self._addresses)
        if not port:
            return Probe()
        servers = list(node.protocol.routing_table.peer_id_to_uid)
        peers = await candidates(node.p2p, servers, self.cfg.request_timeout_s)
        return await probe(node.p2p, peers, [port]) if peers else Probe()

    async def _reach_loop(self) -> None:
        """``client_mode: auto``: probe until a peer answers, re-check every few minutes. Runs on the DHT's loop."""
        while not self._closed:
            await asyncio.sleep(REACH_RETRY_S[1] if self._reach_heard else REACH_RETRY_S[0])
            if self._closed:
                return
            try:
                await asyncio.wait_for(self._reach_step(), 60.0)
            except Exception as e:  # nobody awaits this task: it must not end in an exception
                logger.debug("reachability probe failed: %s: %s", e.__class__.__name__, e)

    async def _reach_step(self) -> None:
        """One dial-back probe; switch to what it found, saying so in one log line (on a change, or the first
        verdict). A client serves once a peer opened a connection; a server stops serving only on answers from
        several networks (``reach.Probe.demotes``), so one hostile peer cannot demote it. Runs on the DHT's loop."""
        found = await self._probe()
        verdict = found.verdict
        if verdict == UNKNOWN or self._closed:
            return
        self._reach_heard = True
        node = self._node
        if verdict == UNREACHABLE and not node.protocol.client_mode and not found.demotes:
            logger.debug(
                "dial-back: peers in %d network(s) found no port open; %d needed to stop serving",
                len(found.closed_networks),
                DEMOTE_NETWORKS,
            )
            return
        client = verdict == UNREACHABLE
        changed = node.protocol.client_mode != client
        first = self.reachability == UNKNOWN
        self.reachability = verdict
        if changed:
            await set_client_mode(node, client)
            self._create_kwargs["client_mode"] = client
        if client and (changed or first):
            logger.warning(
                "peers cannot dial this node (behind NAT or a firewall): running as a DHT client "
                "(reads and writes records, stores none for others)"
            )
        elif changed or first:
            logger.info("peers can dial this node: serving the DHT")

    def addresses(self) -> list[str]:
        """Full multiaddrs other peers can bootstrap from (``/ip4/HOST/tcp/PORT/p2p/PEERID``)."""
        return list(self._addresses)

    async def close(self) -> None:
        """Shut the DHT node and its p2pd down, then stop the private loop; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._runner.closing = True
        if self._rejoin_task is not None:
            self._rejoin_task.cancel()
        if self._reach_future is not None:
            self._reach_future.cancel()

        async def shutdown() -> None:
            if self.member is not None:
                self.member.detach()
            # Not DHTNode.shutdown(): it first asks p2pd, over its control socket, to drop each RPC handler. A
            # p2pd that already got the terminal's SIGINT (Ctrl-C reaches the whole process group) has closed
            # that socket's listener, and each request then waits for a reply that never comes. The daemon is
            # ours and dies next, which drops its handlers anyway: stop the node's background jobs, end p2pd.
            self._node.is_alive = False
            await self._node.p2p.shutdown()

        try:
            await self._runner.call(shutdown(), timeout=P2PD_EXIT_TIMEOUT_S)
        except Exception as e:
            logger.warning("hivemind p2pd did not exit in %.0fs (%s); killing it", P2PD_EXIT_TIMEOUT_S, e)
        finally:
            self._kill_p2pd()
            self._runner.stop()
            if self._key_dir is not None:
                shutil.rmtree(self._key_dir, ignore_errors=True)

    def set_record_validator(self, validate: RecordCheck | None) -> None:
        """Swap the store-time hook; takes effect at once (the guard runs in this process)."""
        self._record_validator = validate
        if self.guard is not None:
            self.guard.hook = validate

    # -- extras ---------------------------------------------------------------------------------------------------

    async def store_raw(self, key: str, value: bytes, expiration_time: float, subkey: str | None = None) -> bool:
        """Store arbitrary bytes under an arbitrary key, bypassing :meth:`publish`'s layout (fault injection and
        tests only: a hostile peer built with ``store_validation=False`` uses it to try forged entries)."""
        self._check_open()
        return await self._call(
            self._node.store(key, value, expiration_time, subkey=subkey, beam_size=self.cfg.lookup_beam),
            timeout=self.cfg.request_timeout_s * 2,
        )

    def rejections(self) -> dict[str, int]:
        """DHT entries this node refused (to store, or from a peer's lookup response), by reason; ``shard_full``:
        entries a full shard key refused (SPEC 7.4)."""
        out = dict(self.reader.dropped)
        storage = self._storage()
        full = storage.counts["shard_full"] if storage is not None else 0
        if full:
            out["shard_full"] = full
        if self.member is not None:
            for reason, n in self.member.counters.rejections().items():
                out[reason] = out.get(reason, 0) + n
        if self.guard is None:
            return out
        with self.guard._lock:
            for reason, n in self.guard.rejections.items():
                out[reason] = out.get(reason, 0) + n
        return out

    def evictions(self) -> dict[str, int]:
        """Shard entries this node's storage and cache dropped from a full key (SPEC 7.4), by reason: ``outranked``
        (a better-ranked new sender took the place), ``trimmed`` (a merged lookup result cut to capacity when
        cached)."""
        out: Counter[str] = Counter()
        for capped in self._capped():
            out.update(capped.evicted)
        return {reason: n for reason, n in out.items() if n}

    def stats(self) -> dict[str, float]:
        """Counters for metrics and benchmarks: the sharded reader's reads and bytes, entries the guard accepted
        and seconds it spent checking."""
        out: dict[str, float] = {
            **self.reader.stats,
            "swarm_estimate": self.reader.estimate or 0.0,
            "read_level": self.reader.read_level(),
            "restarts": self.restarts,
            "rejoins": self.rejoins,
            "rejoined": self.rejoined,
            "client_mode": float(self._node.protocol.client_mode),
            "reachable": {REACHABLE: 1.0, UNREACHABLE: 0.0}.get(self.reachability, -1.0),
        }
        if self.member is not None:
            for name, value in self.member.stats().items():
                if isinstance(value, dict):
                    out.update({f"gossip_{name}_{reason}": n for reason, n in value.items()})
                else:
                    out[f"gossip_{name}"] = value
        storage = self._storage()
        if storage is not None:
            out["storage_keys"] = len(storage)  # keys this node stores for the swarm (a soak watches it)
            out["shard_key_entries_max"] = storage.max_entries
            out["shard_key_bytes_max"] = storage.max_bytes
            out["shard_evicted"] = sum(self.evictions().values())
        if self.guard is None:
            return {**out, "accepted": 0, "guard_seconds": 0.0, "guard_cpu_seconds": 0.0}
        with self.guard._lock:
            return {
                **out,
                "accepted": self.guard.accepted,
                "guard_seconds": self.guard.seconds,
                "guard_cpu_seconds": self.guard.cpu_seconds,
            }

    # -- internals ------------------------------------------------------------------------------------------------

    def _storage(self) -> CappedStorage | None:
        """This node's capped DHT storage (SPEC 7.4), None before it is installed."""
        storage = getattr(getattr(self._node, "protocol", None), "storage", None)
        return storage if isinstance(storage, CappedStorage) else None

    def _capped(self) -> list[CappedStorage]:
        """This node's capped storage and cache (SPEC 7.4), those installed."""
        protocol = getattr(self._node, "protocol", None)
        found = (getattr(protocol, "storage", None), getattr(protocol, "cache", None))
        return [s for s in found if isinstance(s, CappedStorage)]

    def _daemon(self) -> Any:
        """This node's p2pd child process (an ``asyncio`` subprocess), or None when it has no daemon of its own."""
        return getattr(getattr(self._node, "p2p", None), "_child", None)

    def _daemon_exit(self) -> int | None:
        """The p2pd daemon's exit code, or None while it runs (or when this node has no daemon of its own)."""
        child = self._daemon()
        return None if child is None else child.returncode

    async def _ensure_daemon(self) -> None:
        """Raise if closed; restart the DHT if its daemon died under us (see the module docstring)."""
        if self._closed:
            raise TransportError("hivemind transport is closed")
        code = self._daemon_exit()
        if code is None:
            return
        if code == 0:
            # SIGINT/SIGTERM (Ctrl-C reaches the whole process group): the node is stopping too; fail at once,
            # since a request would wait for its full timeout.
            raise TransportError("hivemind's p2pd daemon exited (code 0)")
        async with self._restart_lock:
            if self._daemon_exit() is None:  # restarted by a concurrent call meanwhile
                return
            if time.monotonic() < self._restart_after:
                raise TransportError(f"hivemind's p2pd daemon exited (code {code}); restart pending")
            await self._restart(code)

    async def _restart(self, code: int) -> None:
        old = self._node
        port = self.cfg.port or port_of(self._addresses)
        peers = list(dict.fromkeys([*self.cfg.initial_peers, *self._known_peers.values()]))
        logger.warning(
            "hivemind's p2pd daemon exited (code %s); restarting the DHT on port %s with %d known peers",
            code,
            port,
            len(peers),
        )
        kwargs = {
            **self._create_kwargs,
            "initial_peers": peers or None,
            "host_maddrs": [f"/ip4/{self.cfg.host}/tcp/{port}"],
            "node_id": old.node_id,
            "client_mode": old.protocol.client_mode,
        }

        async def drop_old() -> None:
            if self.member is not None:
                self.member.detach()
            old.is_alive = False
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.p2p.shutdown(), 2.0)

        with contextlib.suppress(Exception):
            await self._runner.call(drop_old(), timeout=3.0)
        try:
            try:
                node = await self._runner.call(
                    _create_capped(kwargs, self.params.work_bits, pubsub=self.cfg.gossip),
                    timeout=self.cfg.startup_timeout_s,
                )
            except Exception as e:
                if port == 0:
                    raise
                # The port may still be held (e.g. by a stray daemon): any port beats none, peers are dialled by us.
                logger.warning("DHT restart on port %s failed (%s); trying a free port", port, e)
                kwargs["host_maddrs"] = [f"/ip4/{self.cfg.host}/tcp/0"]
                node = await self._runner.call(
                    _create_capped(kwargs, self.params.work_bits, pubsub=self.cfg.gossip),
                    timeout=self.cfg.startup_timeout_s,
                )
            maddrs = await self._runner.call(node.get_visible_maddrs(), timeout=self.cfg.request_timeout_s)
        except Exception as e:
            self._restart_failures += 1
            delay = min(RESTART_BACKOFF_S[0] * 2 ** (self._restart_failures - 1), RESTART_BACKOFF_S[1])
            self._restart_after = time.monotonic() + delay
            logger.warning("DHT restart failed (%s: %s); retrying in %.0fs", e.__class__.__name__, e, delay)
            raise TransportError(f"hivemind DHT restart failed ({e.__class__.__name__}: {e})") from e
        if self._closed:  # closed while restarting: the new daemon must not outlive the transport
            with contextlib.suppress(Exception):
                await self._runner.call(node.p2p.shutdown(), timeout=P2PD_EXIT_TIMEOUT_S)
            raise TransportError("hivemind transport is closed")
        self._node = node
        self._addresses = [str(m) for m in maddrs]
        if self.member is not None:
            try:
                await self._runner.call(self.member.attach(node.p2p, self._addresses), self.cfg.startup_timeout_s)
            except Exception as e:  # the DHT works without it; the next restart tries again
                logger.warning("could not rejoin the gossip topic after the restart: %s: %s", type(e).__name__, e)
        self._restart_failures = 0
        self.restarts += 1
        logger.warning("DHT restarted (restart %d) at %s", self.restarts, ", ".join(self._addresses))

    async def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """A DHT request on the private loop that ends as soon as p2pd exits (it would otherwise wait out its
        whole timeout, and a node stopping after Ctrl-C would sit on its last publish)."""
        child = self._daemon()

        async def unless_daemon_exits() -> T:
            work = asyncio.ensure_future(coro)
            if child is None:
                return await work
            died = self._daemon_exited(child)
            try:
                await asyncio.wait({work, died}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # timed out or cancelled by the caller: the request goes too
                work.cancel()
                raise
            if not work.done():
                work.cancel()
                raise TransportError(f"hivemind's p2pd daemon exited (code {child.returncode})")
            return work.result()

        return await self._runner.call(unless_daemon_exits(), timeout)

    def _daemon_exited(self, child: Any) -> asyncio.Future[Any]:
        """A task that ends when ``child`` (this node's p2pd) exits; one per daemon, shared by every request.

        Call on the DHT loop. Not one ``child.wait()`` per request: asyncio's ``Process.wait()`` appends a waiter
        to the subprocess transport's ``_exit_waiters`` and, when cancelled, leaves it there until the process
        exits (CPython ``base_subprocess._wait``), so a node that made a request a second kept every one of them:
        ~5,000 cancelled futures an hour in the multi-process soak. ``asyncio.wait`` removes its own callback
        from the shared task when it returns, so waiting on it leaves nothing behind.
        """
        watch = self._exit_watch
        if watch is None or watch[0] is not child or watch[1].cancelled():
            watch = self._exit_watch = (child, asyncio.ensure_future(child.wait()))
        return watch[1]

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("hivemind transport is closed")
        code = self._daemon_exit()
        if code is not None:
            # e.g. Ctrl-C reached the daemon too: a request would wait for its full timeout, so fail at once
            raise TransportError(f"hivemind's p2pd daemon exited (code {code})")

    async def _get_shards(self, addrs: list[Any]) -> dict[Any, Any]:
        keys = {shard_key(self.swarm, *a): a for a in addrs}
        # latest: a cached shard would hide entries announced since; force a lookup across the key's replicas.
        found = await self._call(
            self._node.get_many(list(keys), sufficient_expiration_time=float("inf"), beam_size=self.cfg.lookup_beam),
            self.cfg.request_timeout_s,
        )
        out: dict[Any, Any] = {}
        for key, addr in keys.items():
            entry = found.get(key)
            value = entry.value if entry is not None else None
            if isinstance(value, dict):
                out[addr] = [v.value for v in value.values() if isinstance(getattr(v, "value", None), bytes)]
        return out

    async def _get_peers(self, addrs: list[Any]) -> dict[Any, Any]:
        keys = {peer_key(self.swarm, *a): a for a in addrs}
        found = await self._call(
            self._node.get_many(list(keys), sufficient_expiration_time=float("inf"), beam_size=self.cfg.lookup_beam),
            self.cfg.request_timeout_s,
        )
        out: dict[Any, Any] = {}
        for key, addr in keys.items():
            entry = found.get(key)
            if entry is not None and isinstance(entry.value, bytes):
                out[addr] = entry.value
        return out

    async def _get_records(self, addrs: list[Any]) -> dict[Any, Any]:
        keys = {record_key(self.swarm, *a): a for a in addrs}
        # Content addressing makes every unexpired copy identical: any replica's answer will do.
        found = await self._call(
            self._node.get_many(list(keys), beam_size=self.cfg.lookup_beam), self.cfg.request_timeout_s
        )
        out: dict[Any, Any] = {}
        for key, addr in keys.items():
            entry = found.get(key)
            if entry is not None and isinstance(entry.value, bytes):
                out[addr] = [entry.value]
        return out

    def _kill_p2pd(self) -> None:
        child = self._daemon()
        if child is None or child.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            child.kill()


def forget_finished_searches(node: DHTNode) -> None:
    """Stop a hivemind ``DHTNode`` keeping one empty entry per key it ever looked up.

    With ``reuse_get_requests`` (on by default), each lookup joins ``node.pending_get_requests[key]``, a defaultdict
    of ``SortedSet``; a finished search leaves its key's set empty but never removes it. Every window brings new keys
    (records, peer and shard keys), so a node that polls for hours grew its Python heap by ~95,000 blocks an hour
    in the multi-process soak (``benchmarks/results/soak_multiproc_heap.md``), a SortedSet of some 30 objects per key.
    After hivemind's own callback, the emptied set is dropped; the next lookup of that key makes a new one, as before.
    Runs on the DHT's loop (a search's done callback), like everything else that touches the dict."""
    reuse = node._reuse_finished_search_result

    def reuse_then_forget(finished: Any) -> None:
        reuse(finished)
        pending = node.pending_get_requests
        if finished.key_id in pending and not pending[finished.key_id]:
            del pending[finished.key_id]

    node._reuse_finished_search_result = reuse_then_forget


async def _create_capped(kwargs: dict[str, Any], work_bits: int, *, pubsub: bool = False) -> DHTNode:
    """``DHTNode.create`` with the shard capacity of SPEC 7.4 (ranking entries at the swarm's ``work_bits``) installed
    in the node's storage and cache, and shard keys' entries judged one by one (SPEC 9); on the DHT's own loop,
    before anyone else holds the node. ``pubsub``: p2pd runs GossipSub too (``pubsub.PUBSUB_FLAGS``)."""
    with daemon_args(PUBSUB_FLAGS if pubsub else {}):
        return await _create_node(kwargs, work_bits)


async def _create_node(kwargs: dict[str, Any], work_bits: int) -> DHTNode:
    try:
        node = await DHTNode.create(**kwargs)
    except P2PDaemonError as e:
        # p2pd started with bootstrap peers exits when none of them can be dialled ("failed to connect to bootstrap
        # peers": the field's most reported start-up failure). Start without them: the node trains alone and
        # pings them again every REJOIN_INTERVAL_S (_rejoin_if_alone) until one answers.
        if not kwargs.get("initial_peers") or "bootstrap" not in str(e):
            raise
        logger.debug("p2pd could not reach its bootstrap peers (%s); starting without them", e)
        node = await DHTNode.create(**{**kwargs, "initial_peers": None})
    install(node, work_bits)
    keep_valid_subkeys(node.protocol)
    forget_finished_searches(node)
    await DialBackService().register(node.p2p)
    return node

"""Configs of the wire protocol and of each transport (a discriminated union on ``type``).

Only pydantic here: validating a node config never imports a transport backend. Knows nothing about how a
transport is built from its config (each transport module does that).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from protocol.config import StrictModel

DHT_REPLICAS = 5
"""Nodes a hivemind DHT key is stored at (hivemind's ``num_replicas``, its default, pinned here)."""


class ProtocolConfig(StrictModel):
    """Record limits and time windows; every node of one swarm must use the same ``window_seconds``."""

    window_seconds: int = Field(default=15, ge=1, le=3600)
    """Length of a time window in seconds. 15 s is 5x the ~3 s clock skew the DHT tolerates and well above
    the 1-2 s an 8-peer hivemind swarm needs to spread a record, yet short enough that one window key holds
    only a few records per peer and stale rollouts age out within a minute."""
    max_record_bytes: int = Field(default=1 << 20, ge=1024, le=4 << 20)
    """Records larger than this are refused before decoding (1 MiB: py-libp2p GossipSub silently drops more;
    the p2pd message cap is 4 MiB)."""
    max_future_windows: int = Field(default=1, ge=0, le=16)
    """Accept records stamped at most this many windows ahead of our clock (clock skew between peers)."""
    max_past_windows: int = Field(default=4, ge=0, le=1024)
    """Reject records stamped more than this many windows ago (4 x 15 s = 1 min: covers slow propagation on
    32-peer swarms, rejects stale rollouts and replays of old records)."""
    quota_per_window: int = Field(default=16, ge=1, le=100_000)
    """Records accepted per sender per window; more are dropped as a flood (an honest node publishes about
    once per training step)."""
    replay_capacity: int = Field(default=200_000, ge=1000)
    """Most (sender, seq) pairs remembered for replay detection (bounds memory under a sybil flood)."""
    fetch_past_windows: int = Field(default=1, ge=0, le=16)
    """Windows before the current one that each poll fetches again (records published late in a window)."""
    timeout_s: float = Field(default=30.0, gt=0, le=600)
    """Timeout of one transport call (publish or fetch) made by the channel, in seconds."""
    shard_fanout: int = Field(default=4, ge=2, le=16)
    """Sharded index (SPEC.md 7): level l of a window's index has ``shard_fanout ** l`` shards. Swarm-wide."""
    shard_levels: int = Field(default=7, ge=1, le=10)
    """Levels of the sharded index (0 .. shard_levels-1); 7 levels of fan-out 4 give 4,096 shards at the top,
    ~2.5 senders per shard at 10,000 senders. Swarm-wide."""
    poll_shards: int = Field(default=1, ge=1, le=64)
    """Random shards of each window one poll reads (at the level the reader's swarm-size estimate picks)."""
    poll_senders: int = Field(default=12, ge=1, le=4096)
    """The reading level is the lowest one where ``poll_shards`` shards of a window hold at most this many senders:
    swarms up to this size are read whole every poll; larger ones are sampled (bounds the index bytes a poll reads
    to about what a 10-node swarm costs)."""
    poll_records: int = Field(default=10, ge=1, le=4096)
    """Most new records one poll fetches (the per-node cost bound, whatever the swarm size; about what a 10-node
    swarm delivers per step, so a node of a huge swarm costs what it costs in a small one)."""
    poll_newcomer_records: int = Field(default=4, ge=0, le=4096)
    """Of ``poll_records``, slots kept for senders this node does not follow yet (how fast newcomers are found;
    all that a flood of sybil identities can take)."""
    follow_senders: int = Field(default=6, ge=0, le=256)
    """Senders whose index entries each poll reads directly (the channel picks the ones it accepted records
    from most recently); their new records are fetched before anyone else's."""
    index_work_bits: int = Field(default=12, ge=0, le=32)
    """Work stamp of index entries (SPEC 7.4): leading zero bits a node mints once per window for its own entries
    (2**bits SHA-256s, ~3 ms at 12) and requires of entries it counts in its swarm-size estimate and reads first.
    Unstamped entries are still read, after stamped ones; a full shard key keeps the most worked entries. Swarm-wide;
    0 mints nothing worth counting and counts every entry (the simulator's large swarms use it)."""
    clock_offset_s: float = Field(default=0.0, ge=-86_400, le=86_400)
    """Seconds added to this node's clock wherever the protocol reads it (record stamps, windows, the store-time
    guard's expiry check). For tests of a peer whose clock is wrong; leave 0 (a real node reads the system clock)."""

    @model_validator(mode="after")
    def _fetch_within_acceptance(self) -> ProtocolConfig:
        if self.fetch_past_windows > self.max_past_windows:
            raise ValueError(
                f"fetch_past_windows ({self.fetch_past_windows}) exceeds max_past_windows ({self.max_past_windows}): "
                "records fetched that far back would be rejected as stale; lower fetch_past_windows"
            )
        if self.follow_senders + self.poll_newcomer_records > self.poll_records:
            raise ValueError(
                f"follow_senders ({self.follow_senders}) + poll_newcomer_records ({self.poll_newcomer_records}) "
                f"exceed poll_records ({self.poll_records}): raise poll_records so every followed sender gets a "
                "record per poll"
            )
        return self


class MemoryTransportConfig(StrictModel):
    """In-process network for the simulator and tests (all nodes in one process share one network)."""

    type: Literal["memory"] = "memory"
    seed: int = 0
    """Seed of the network's fault randomness (loss, duplication, jitter are deterministic given it)."""
    latency_s: float = Field(default=0.0, ge=0, le=3600)
    """Delay before a published record becomes visible to a reader, in seconds."""
    jitter_s: float = Field(default=0.0, ge=0, le=3600)
    """Extra uniform random delay in [0, jitter_s] per (record, reader)."""
    loss: float = Field(default=0.0, ge=0, le=1)
    """Probability that a given reader never sees a given record."""
    duplicate: float = Field(default=0.0, ge=0, le=1)
    """Probability that a given reader gets a given record twice per fetch."""
    retention_windows: int = Field(default=8, ge=1, le=10_000)
    """Windows kept behind the newest window published; older records are forgotten (like DHT expiry)."""


class HivemindTransportConfig(StrictModel):
    """hivemind DHT: one content-addressed key per record, found through signed index entries under a peer key and a
    sharded per-window index (see ``protocol/SPEC.md`` 7)."""

    type: Literal["hivemind"] = "hivemind"
    host: str = "127.0.0.1"
    """Interface to listen on; ``0.0.0.0`` to accept peers from other machines."""
    port: int = Field(default=0, ge=0, le=65535)
    """TCP port to listen on; 0 picks a free one (printed as a multiaddr at start)."""
    initial_peers: list[str] = Field(default_factory=list)
    """Multiaddrs of peers to bootstrap from; empty starts a new swarm."""
    announce_maddrs: list[str] = Field(default_factory=list)
    """Multiaddrs to announce instead of the listen addresses (public address behind port forwarding)."""
    client_mode: bool | Literal["auto"] = "auto"
    """``true``: a DHT client (serves no keys, for nodes behind NAT; it still reads and writes records); ``false``: a
    DHT server; ``auto``: found out by asking peers to dial this node back (``protocol/transport/hivemind/reach.py``):
    a node started with peers runs as a client until a peer could dial it, a node that starts a swarm as a server
    until peers in two networks say they cannot (SPEC 9); the switch is one log line and re-checked every few
    minutes."""
    relay_via_peers: bool = False
    """Reserve a circuit-relay slot at the initial peers (p2pd ``-autoRelay`` with them as trusted relays, reachability
    forced private) so that peers can reach this node through them. For a node known to be behind NAT that must
    serve; measured in ``benchmarks/results/netlab.md`` (the default, client_mode auto, needs no relay)."""
    expiration_windows: int = Field(default=4, ge=1, le=1024)
    """Records expire this many windows after the end of their window (should be >= max_past_windows)."""
    request_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """Timeout of one DHT request (store or get), in seconds."""
    startup_timeout_s: float = Field(default=60.0, gt=0, le=600)
    """Time allowed for the DHT (and its p2pd daemon) to start and bootstrap, in seconds."""
    store_validation: bool = True
    """Install the record validator in the DHT so peers refuse forged or malformed records at store time."""
    gossip: bool = True
    """Also join the swarm's GossipSub topic through p2pd's own pubsub and serve the sync protocol (SPEC 7.6), so
    this node and libp2p-transport nodes are one swarm; false: the DHT only (records of libp2p nodes never arrive)."""
    topic_prefix: str = Field(default="rl-swarm", min_length=1, max_length=64)
    """The GossipSub topic is ``{topic_prefix}/{swarm}/records/1`` (the libp2p transport's ``topic_prefix``)."""
    sync_interval_s: float = Field(default=5.0, gt=0, le=3600)
    """With ``gossip``: every so often pull the records we miss from one random connected peer (the libp2p
    transport's anti-entropy; covers records published before we joined that never went into the DHT)."""
    lookup_beam: int = Field(default=8, ge=DHT_REPLICAS, le=64)
    """Nodes one DHT lookup (a store or a get) visits at least around its key: at least the DHT_REPLICAS (5) a key is
    stored at, and better a few more (a node that does not answer keeps its place in the beam, so with 8 a store
    reaches 5 replicas while at most 3 of the 8 are gone). hivemind's default, its k-bucket size of 20, visits most
    of a 32-node swarm for every key; 8 is the k of BitTorrent's Mainline DHT (BEP 5). See SPEC 9 (Lookups)."""


class Libp2pTransportConfig(StrictModel):
    """py-libp2p GossipSub push plus a direct sync protocol for catch-up, no Go daemon (``protocol/SPEC.md`` 7.3)."""

    type: Literal["libp2p"] = "libp2p"
    host: str = "127.0.0.1"
    """Interface to listen on; ``0.0.0.0`` to accept peers from other machines."""
    port: int = Field(default=0, ge=0, le=65535)
    """TCP port to listen on; 0 picks a free one (printed as a multiaddr with ``/p2p/`` at start)."""
    initial_peers: list[str] = Field(default_factory=list)
    """Multiaddrs (with ``/p2p/`` peer id) of peers to bootstrap from; empty starts a new swarm."""
    topic_prefix: str = Field(default="rl-swarm", min_length=1, max_length=64)
    """The GossipSub topic is ``{topic_prefix}/{swarm}/records/1``."""
    max_messages_per_s: float = Field(default=8.0, gt=0, le=1000)
    """Own publish rate limit, messages per second (publishes wait for a token, counted as ``publish_throttled``);
    kept below ``router_max_messages_per_s`` so our own records are never dropped by a peer's spam guard."""
    router_max_messages_per_s: float = Field(default=200.0, gt=0, le=100_000)
    """GossipSub spam protection: messages per second per forwarding peer and topic before they are dropped
    (py-libp2p's default of 10 silently drops honest relays on swarms of more than ~10 peers)."""
    inline_max_bytes: int = Field(default=900_000, ge=1024, le=1_000_000)
    """Records up to this size travel inside the gossip message; larger ones are announced and fetched over the
    sync protocol (py-libp2p drops pubsub frames over 1 MiB silently)."""
    expiration_windows: int = Field(default=4, ge=1, le=1024)
    """Records are kept this many windows behind the current one, then forgotten (like DHT expiry)."""
    max_records_per_window: int = Field(default=4096, ge=16, le=1_000_000)
    """Most records kept for one window (bounds memory under a flood; evictions are counted)."""
    sync_interval_s: float = Field(default=5.0, gt=0, le=3600)
    """Anti-entropy period: every so often pull the records we miss from one random peer (heals gossip loss,
    covers records published before we joined)."""
    heartbeat_interval_s: int = Field(default=1, ge=1, le=120)
    """GossipSub heartbeat (mesh maintenance and gossip) period in seconds."""
    degree: int = Field(default=6, ge=1, le=64)
    """GossipSub target mesh degree D (D_low = D - 2, D_high = 2 D)."""
    request_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """Timeout of one network operation (connect, publish, sync request, edge fetch), in seconds."""
    startup_timeout_s: float = Field(default=30.0, gt=0, le=600)
    """Time allowed to start the host and connect to the initial peers, in seconds."""
    announce_maddrs: list[str] = Field(default_factory=list, max_length=8)
    """Addresses to advertise to peers instead of the listen addresses (a public address behind port forwarding,
    or the real interface when listening on ``0.0.0.0``)."""
    peer_exchange: bool = True
    """Ask connected peers for signed advertisements of the peers they know and dial some of them, so a swarm
    bootstrapped from one address becomes a mesh and survives its bootstrap node leaving (SPEC.md 7.3)."""
    target_peers: int = Field(default=8, ge=1, le=256)
    """Peer exchange dials known peers while fewer than this many are connected (GossipSub's mesh degree D is 6:
    a few more connections give its heartbeat spare peers to graft)."""
    peer_exchange_interval_s: float = Field(default=5.0, gt=0, le=3600)
    """Period of the peer exchange: ask one random connected peer for advertisements, then dial if below
    ``target_peers``."""
    max_known_peers: int = Field(default=256, ge=8, le=100_000)
    """Most peer advertisements kept (newest per peer; the oldest go first)."""
    advertisement_ttl_s: float = Field(default=600.0, ge=30, le=86_400)
    """Advertisements older than this are ignored (a peer re-signs its own one every exchange)."""
    gossipsub_px: bool = False
    """GossipSub v1.1 peer exchange on PRUNE (py-libp2p's implementation). Off: measured to leave most peers of a
    32-peer swarm bootstrapped from one address connected only to the bootstrap node (SPEC.md 7.3); kept for that
    comparison."""


TransportConfig = Annotated[
    MemoryTransportConfig | HivemindTransportConfig | Libp2pTransportConfig, Field(discriminator="type")
]
"""Any transport config; YAML picks one with ``transport: {type: memory|hivemind|libp2p, ...}``."""

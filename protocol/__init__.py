"""The wire layer (no torch): who a peer is, what it publishes, how records are checked, how bytes move.

* ``errors``     -- :class:`SwarmError` and the protocol's error classes
* ``config``     -- strict pydantic base model, YAML + overrides loader, one-line config errors
* ``types``      -- TaskRef, Completion, Group, RolloutBatch, Envelope (plain immutable values)
* ``identity``   -- Ed25519 key files (0600) and peer ids
* ``codec``      -- canonical MessagePack (one byte form per value, bombs refused) and the wire's errors
* ``schema``     -- the ``expect_*`` checks that decoders of maps are built from
* ``kinds``      -- the registry of payload kinds and the built-in ``rollouts`` kind
* ``records``    -- the signed, versioned envelope: encode, sign, decode, verify; digest, seq, windows
* ``validation`` -- the receive-path checks (size, schema, signature, swarm, window, replay, quota), counted
* ``layout``     -- the sharded key layout: signed bounded index entries, shards and levels, bounded random reads
* ``version``    -- the protocol version (major.minor), the compatibility rule, the one-line mismatch report
* ``channel``    -- sign+publish own records, fetch+validate+dedup peers' records over a transport
* ``lazy``       -- lazy re-exports for package faces whose modules import heavy libraries
* ``transport``  -- the Transport interface and its implementations (memory; hivemind and libp2p, a folder each)

Layers, top to bottom (an import-linter contract): ``channel`` -> ``validation`` -> ``layout`` -> ``records`` ->
``kinds`` -> ``schema`` -> ``codec`` -> ``identity`` | ``types`` | ``version`` | ``config`` | ``lazy`` -> ``errors``;
``transport`` spans them (its interface and configs low, its backends high).

Never imports torch, transformers or hivemind at import time (``protocol.transport.hivemind`` and
``protocol.transport.libp2p`` aside, which import their library).
"""

from protocol.lazy import lazy_exports

__all__ = [
    "Channel",
    "Completion",
    "ConfigError",
    "DecodeError",
    "Envelope",
    "Group",
    "Identity",
    "RecordValidator",
    "RolloutBatch",
    "SignatureError",
    "SwarmError",
    "TaskRef",
    "TransportError",
    "compatible",
    "decode_record",
    "encode_record",
    "local_version",
    "record_digest",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "Channel": "channel",
        "ConfigError": "errors",
        "DecodeError": "errors",
        "SignatureError": "errors",
        "SwarmError": "errors",
        "TransportError": "errors",
        "Identity": "identity",
        "decode_record": "records",
        "encode_record": "records",
        "record_digest": "records",
        "Completion": "types",
        "Envelope": "types",
        "Group": "types",
        "RolloutBatch": "types",
        "TaskRef": "types",
        "RecordValidator": "validation",
        "compatible": "version",
        "local_version": "version",
    },
)

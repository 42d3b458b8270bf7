"""SPEC.md 16 states the reference node's defaults a peer must match or know; they are the config's."""

import re
from pathlib import Path

from node.config import NodeConfig

SPEC = (Path(__file__).resolve().parents[3] / "protocol" / "SPEC.md").read_text()


def section_16() -> str:
    m = re.search(r"## 16\. Observables.*", SPEC, re.S)
    assert m, "SPEC.md lost section 16"
    return " ".join(m.group(0).split())


def test_spec_16_defaults_are_the_configs():
    text = section_16()
    cfg = NodeConfig()
    proto = cfg.protocol
    assert f"Swarm id `{cfg.swarm_id}`" in text
    assert f"`runtime.poll_interval_s` = {cfg.runtime.poll_interval_s} s" in text
    assert f"`runtime.publish_interval_s` = {cfg.runtime.publish_interval_s} s" in text
    assert f"`window_seconds` {proto.window_seconds};" in text
    assert f"`quota_per_window` {proto.quota_per_window};" in text
    assert proto.max_record_bytes == 1 << 20 and "`max_record_bytes` 1 MiB" in text
    # the layout every node of a swarm must share, carried by nothing on the wire (issue 56)
    assert f"`shard_fanout` {proto.shard_fanout}," in text
    assert f"`shard_levels` {proto.shard_levels} " in text
    assert f"`index_work_bits` {proto.index_work_bits} " in text


def test_spec_title_names_this_major_and_no_minor():
    """The title follows ``protocol/version.py``'s major; the minor lives in section 15 alone (minors come often)."""
    from protocol.version import PROTOCOL_VERSION

    title = SPEC.splitlines()[0]
    major = PROTOCOL_VERSION[0]
    assert title == f"# rl-swarm wire protocol, version {major}.x (`schema_version` {major})"
    assert f"this code: **{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}**" in SPEC

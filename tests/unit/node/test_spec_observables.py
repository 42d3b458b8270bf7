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

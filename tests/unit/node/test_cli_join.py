"""``swarm-node join``'s config resolution: YAML, ``--set`` overrides and the network flags."""

from __future__ import annotations

import logging

import pytest

from node.cli.join import resolve_config
from protocol.errors import ConfigError


def test_network_flags_with_the_memory_transport_are_one_warning_naming_them(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="node.cli.join"):
        cfg = resolve_config(None, ["transport.type=memory"], peers=["/ip4/127.0.0.1/tcp/1"], host="0.0.0.0", port=7)
    assert cfg.transport.type == "memory"
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("--peers, --host, --port ignored with --transport memory")


def test_network_flags_reach_a_network_transport() -> None:
    cfg = resolve_config(None, [], peers=["/ip4/127.0.0.1/tcp/4001"], host="127.0.0.1", port=4002)
    assert (cfg.transport.host, cfg.transport.port) == ("127.0.0.1", 4002)
    assert cfg.transport.initial_peers == ["/ip4/127.0.0.1/tcp/4001"]


def test_a_bad_override_is_still_a_config_error_with_the_memory_transport() -> None:
    with pytest.raises(ConfigError, match="transport"):
        resolve_config(None, ["transport.type=memory", "transport.nope=1"], peers=[], host="x", port=None)

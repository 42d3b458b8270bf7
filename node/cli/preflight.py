"""Cheap checks of user input that run before anything slow starts (the DHT, p2pd, the model build).

A wrong run directory, a model path that does not exist or a malformed peer address should cost the user one
second and one clear line, not a DHT start-up and a traceback. Every check raises :class:`ConfigError` with a
message that names the input and says what to change; none of them creates a file.

Knows nothing about torch, transformers or hivemind (it must stay instant); the model loader and the
transports still do their own, complete checks later.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path

from protocol.errors import ConfigError

#: A multiaddr's textual form, used when the ``multiaddr`` package is not installed.
_MADDR_RE = re.compile(r"^(/[A-Za-z0-9\-]+/[^/\s]+)+$")


def _first_existing(path: Path) -> Path:
    """``path`` itself or its nearest ancestor that exists."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output_dir(path: Path, what: str = "run dir") -> None:
    """``path`` is (or can be created as) a writable directory; creates nothing."""
    path = Path(path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"{what} {path} is a file, not a directory; pick another path")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{what} {path} is not writable by this user; pick another path or fix its permissions")
        return
    base = _first_existing(path.absolute())
    if not base.is_dir():
        raise ConfigError(f"cannot create {what} {path}: {base} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(
            f"cannot create {what} {path}: {base} is not writable by this user; pick another path or fix its "
            "permissions"
        )


def make_output_dir(path: Path, what: str = "run dir") -> None:
    """Check ``path`` (see :func:`check_output_dir`), then create it; an OS refusal is one ConfigError line."""
    check_output_dir(path, what)
    try:
        Path(path).expanduser().mkdir(parents=True, exist_ok=True)
        probe = Path(path).expanduser() / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        # os.access can be wrong (root, read-only mounts, ACLs): the real attempt has the last word
        raise ConfigError(f"cannot write to {what} {path}: {e.strerror or e}") from None


def looks_like_path(name: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else (``./x``, ``/x``, ``~/x``, ``a/b/c``) is a path."""
    return name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1


def check_model_name(name: str) -> None:
    """A local model path must exist and look like a saved transformers model; hub names are checked later."""
    if name.startswith("builtin:"):
        return
    path = Path(name).expanduser()
    if not path.exists():
        if looks_like_path(name):
            raise ConfigError(f"model path {name!r} does not exist (model.name takes a hub name or a local directory)")
        return
    if not path.is_dir():
        raise ConfigError(f"model path {name!r} is not a directory (expected a saved transformers model)")
    if not (path / "config.json").exists():
        raise ConfigError(f"model directory {name!r} has no config.json (not a saved transformers model)")


def check_peers(peers: Sequence[str], transport: str) -> None:
    """Every bootstrap address must parse as a multiaddr ending in ``/p2p/PEERID`` (what a node prints)."""
    if transport == "memory" or not peers:
        return
    try:
        from multiaddr import Multiaddr
    except ImportError:  # a transport without the multiaddr package: check the shape only
        Multiaddr = None
    example = "/ip4/1.2.3.4/tcp/31337/p2p/12D3KooW..."
    for peer in peers:
        if Multiaddr is not None:
            try:
                Multiaddr(peer)
            except Exception as e:
                raise ConfigError(f"--peers {peer!r} is not a multiaddr ({e}); expected e.g. {example}") from None
        elif not _MADDR_RE.match(peer):
            raise ConfigError(f"--peers {peer!r} is not a multiaddr; expected e.g. {example}")
        if "/p2p/" not in peer:
            raise ConfigError(
                f"--peers {peer!r} has no /p2p/PEERID part; copy the whole 'listening on' address of that node, "
                f"e.g. {example}"
            )


def check_trackers(report_to: Sequence[str]) -> None:
    """Every tracker in ``report_to`` has its package installed (found, not imported: that stays instant)."""
    from node.telemetry.trackers import PACKAGES

    for name in report_to:
        package = PACKAGES[name]
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):  # a broken or half-removed install
            found = False
        if not found:
            raise ConfigError(
                f"report_to includes {name} but the {package} package is not installed; run: pip install {package} "
                f'(or pip install -e ".[{name}]" in a clone), or remove {name} from report_to'
            )

"""A minimal read-only HTTP/1.1 server (stdlib asyncio) for the observer's page and its JSON endpoint.

Routes: ``GET /`` the page, ``GET /app.js`` and ``GET /style.css`` its assets (package data in ``node/web``,
no CDN, no external fonts), ``GET /api/state`` the observer's state as JSON. Nothing else: no writes, no
directory listing, no file paths from the request. Every response forbids inline and foreign scripts
(Content-Security-Policy), and the page inserts peer text with ``textContent`` only.

Knows nothing about swarms: it serves whatever the ``state`` callable returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Callable
from importlib import resources
from typing import Any

logger = logging.getLogger(__name__)

ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
MAX_REQUEST_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0


def asset(name: str) -> bytes:
    """One file of the page (package data)."""
    return resources.files("node.observer").joinpath("web", name).read_bytes()


def _finite(value: Any) -> Any:
    # JSON has no NaN/Infinity: a browser's JSON.parse rejects them.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class ObserverServer:
    """Serves the page and ``/api/state``; create with :meth:`start`, stop with :meth:`close`."""

    def __init__(self, state: Callable[[], dict[str, Any]]):
        self.state = state
        self._server: asyncio.Server | None = None
        self._assets = {path: (asset(name), ctype) for path, (name, ctype) in ASSETS.items()}

    @classmethod
    async def start(cls, state: Callable[[], dict[str, Any]], host: str = "127.0.0.1", port: int = 8080):
        self = cls(state)
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_REQUEST_BYTES)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            # Off the loop: building the state waits for the observer's lock and encodes JSON.
            status, body, ctype, method = await asyncio.to_thread(self._route, head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        except Exception:
            logger.exception("observer page request failed")
            status, body, ctype, method = 500, b"internal error\n", "text/plain; charset=utf-8", "GET"
        headers = {
            "Content-Type": ctype,
            "Content-Length": str(len(body)),
            "Cache-Control": "no-store",
            "Connection": "close",
            **SECURITY_HEADERS,
        }
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Error"}[status]
        out = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        with contextlib.suppress(ConnectionError):
            writer.write(out.encode("latin-1") + (b"" if method == "HEAD" else body))
            await writer.drain()
            writer.close()

    def _route(self, head: bytes) -> tuple[int, bytes, str, str]:
        text = "text/plain; charset=utf-8"
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, b"bad request\n", text, "GET"
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, b"read-only\n", text, method
        if target == "/api/state":
            body = json.dumps(_finite(self.state()), separators=(",", ":"), allow_nan=False).encode()
            return 200, body, "application/json", method
        found = self._assets.get(target)
        if found is None:
            return 404, b"not found\n", text, method
        return 200, found[0], found[1], method

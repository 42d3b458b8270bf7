"""``swarm-node watch`` in a real browser: an observer of two real ``swarm-node join`` processes over hivemind.

Headless Chromium (Debian's ``chromium``; the README's test command installs it) loads the page: the DOM shows
both peers and a non-empty verified series, a hostile peer's ``<script>`` completion shows as text, and a
screenshot lands in the test's temporary directory. The verified reward the page shows for a node matches the
node's own rollouts.jsonl within sampling error, and the observer process never maps libtorch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import psutil
import pytest

from node.eval import read_results
from node.telemetry.metrics import read_jsonl
from protocol.identity import Identity
from swarm.pool import SOLVED
from tests.integration.procs import FAST_JOIN

pytestmark = [pytest.mark.network]

PEER_ID = re.compile(r"peer id (\S+)")  # printed once a node's identity exists (the id peers dial)
SERVING = re.compile(r"serving on (http://127\.0\.0\.1:\d+/)")
HOSTILE_TEXT = "<script>document.title='pwned'</script><answer>-7</answer>"
CHAIN = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail(
            "Chromium is not installed; the browser tests need Debian's chromium package: "
            "apt-get update && apt-get install -y chromium (the README's test command does this)"
        )
    return exe


def run_chromium(url: str, tmp: Path, *extra: str, timeout: float = 120) -> str:
    """Run headless Chromium once on ``url``; returns stdout. The browser and its helpers are ended by pid."""
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp)
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=6000",
        *extra,
        url,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kids = []
        with contextlib.suppress(psutil.NoSuchProcess):
            kids = psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for k in kids:
            with contextlib.suppress(psutil.NoSuchProcess):
                k.kill()
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}): {err[-2000:]}"
    return out


class DomIndex(HTMLParser):
    """What the test needs from a dumped DOM: peer rows, verified cells, polylines, completion texts."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self.polylines: list[dict[str, str]] = []
        self.pre_texts: list[str] = []
        self.script_srcs: list[str | None] = []
        self._row: str | None = None
        self._cell: str | None = None
        self._in_pre = False

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and "data-peer" in a:
            self._row = a["data-peer"]
            self.rows[self._row] = {}
        elif tag == "td" and self._row and ("verified" in a.get("class", "") or "hint" in a.get("class", "")):
            self._cell = "verified" if "verified" in a["class"] else "hint"
            self.rows[self._row][self._cell] = ""
            self.rows[self._row]["completions"] = a.get("data-completions", self.rows[self._row].get("completions"))
        elif tag == "polyline":
            self.polylines.append(a)
        elif tag == "pre":
            self._in_pre = True
            self.pre_texts.append("")
        elif tag == "script":
            self.script_srcs.append(a.get("src"))

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None
        elif tag == "td":
            self._cell = None
        elif tag == "pre":
            self._in_pre = False

    def handle_data(self, data):
        if self._row and self._cell:
            self.rows[self._row][self._cell] += data
        if self._in_pre:
            self.pre_texts[-1] += data


def get_state(url: str) -> dict:
    with urllib.request.urlopen(url + "api/state", timeout=60) as r:
        return json.loads(r.read())


async def publish_hostile(maddr: str) -> str:
    """A real identity publishes a signed record whose completion is markup and whose hints lie."""
    from protocol.channel import open_channel
    from protocol.identity import Identity
    from protocol.transport.config import HivemindTransportConfig, ProtocolConfig
    from protocol.types import Completion, Group, RolloutBatch, TaskRef
    from swarm.evals import EvalSummary

    ident = Identity.generate()
    channel = await open_channel(
        HivemindTransportConfig(initial_peers=[maddr], request_timeout_s=5), ProtocolConfig(), "rl-swarm-demo", ident
    )
    try:
        comps = tuple(Completion(HOSTILE_TEXT, 12, reward_hint=1.0) for _ in range(8))
        batch = RolloutBatch("<b>evil-model</b>", 0, "tok", (Group(TaskRef("chain_sum", CHAIN, 0, 3), comps),))
        await channel.publish("rollouts", batch)
        line = {"step": 7, "accuracy": 0.625, "greedy_accuracy": 0.75, "families": {}}
        await channel.publish("eval", EvalSummary.from_eval_line(line, model="m", policy_version=7))
        await asyncio.sleep(2)  # let the store reach the DHT before our node leaves
    finally:
        await channel.close()
    return ident.peer_id


def published_rewards(run_dir: Path) -> list[float]:
    """A node's own rewards of the groups it publishes: informative ones (not all rewards equal) and all-right ones
    (``sapo.publish_solved``, the default)."""
    out: list[float] = []
    for row in read_jsonl(run_dir / "rollouts.jsonl"):
        rewards = [float(r) for r in row["rewards"]]
        if max(rewards) != min(rewards) or min(rewards) >= SOLVED:
            out.extend(rewards)
    return out


def maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.timeout(600)
def test_observer_page_in_chromium_shows_verified_peers(node_procs, tmp_path):
    chromium()  # fail first, with the clear message, if the browser is missing
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = node_procs("a", "join", "--run-dir", str(a_dir), *FAST_JOIN)
    maddr = a.multiaddr()
    b = node_procs("b", "join", "--peers", maddr, "--run-dir", str(b_dir), *FAST_JOIN)
    w = node_procs("w", "watch", "--peers", maddr, "--port", "0")
    url = w.wait_for(SERVING, 120).group(1)
    a.wait_for(PEER_ID, 60), b.wait_for(PEER_ID, 60)
    # records are signed by the node's Ed25519 identity: the observer lists peers by that id
    a_id, b_id = (Identity.load(d / "identity.key").peer_id for d in (a_dir, b_dir))
    hostile_id = asyncio.run(publish_hostile(maddr))

    deadline = time.monotonic() + 300
    while True:
        st = get_state(url)
        peers = {p["peer"]: p for p in st["peers"]}
        done = all(peers.get(p, {}).get("completions", 0) >= 32 for p in (a_id, b_id))
        done = done and peers.get(hostile_id, {}).get("eval") is not None
        # the nodes publish their own held-out evaluations (the one before their first step, at least)
        done = done and all(peers.get(p, {}).get("eval") is not None for p in (a_id, b_id))
        if done:
            break
        for p in (a, b, w):
            assert p.proc.poll() is None, f"a process exited early: {p.tail()}"
        assert time.monotonic() < deadline, f"observer did not see both nodes and the hostile peer: {peers.keys()}"
        time.sleep(2)
    a.signal(signal.SIGTERM)
    b.signal(signal.SIGTERM)
    assert a.wait(timeout=120) == 0 and b.wait(timeout=120) == 0
    for pid, run_dir in ((a_id, a_dir), (b_id, b_dir)):  # what a node published is what it measured
        shown = peers[pid]["eval"]
        own = {e["step"]: e["accuracy"] for e in read_results(run_dir)}
        assert shown["accuracy"] == own[shown["step"]], (shown, own)

    # The observer validated and re-scored in a process that never loaded torch.
    assert not maps_torch(w.pid), "swarm-node watch mapped libtorch"

    dom = run_chromium(url, tmp_path, "--dump-dom")
    idx = DomIndex()
    idx.feed(dom)
    assert {a_id, b_id, hostile_id} <= set(idx.rows), f"peers in the DOM: {list(idx.rows)}"
    for pid in (a_id, b_id):
        lines = [p for p in idx.polylines if p.get("data-peer") == pid and p.get("data-kind") == "verified"]
        assert lines and int(lines[0]["data-n"]) >= 1 and lines[0]["points"].strip()
    # Markup from a peer is text: it is in a <pre> as characters, and the page ran no script of its own.
    assert HOSTILE_TEXT in idx.pre_texts
    assert idx.script_srcs == ["/app.js"]
    assert "<title>pwned" not in dom and "&lt;script&gt;document.title" in dom
    assert idx.rows[hostile_id]["verified"] == "0.000" and idx.rows[hostile_id]["hint"] == "1.000"
    assert re.search(r'<td class="flag"[^>]*>GAP</td>', dom), "the lying peer's gap is not flagged"
    # Its signed eval record went through the nodes' DHT and shows as (self-reported) held-out accuracy.
    assert re.search(r"<td[^>]*>[0-9a-f]{10}</td><td[^>]*>7</td><td[^>]*>0\.625</td><td[^>]*>0\.750</td>", dom)

    shot = tmp_path / "observer.png"
    run_chromium(url, tmp_path, f"--screenshot={shot}", "--window-size=1280,2200")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

    # The page's verified reward of each node matches the node's own rewards of what it published.
    for pid, run_dir in ((a_id, a_dir), (b_id, b_dir)):
        page = float(idx.rows[pid]["verified"])
        n = int(idx.rows[pid]["completions"])
        own = published_rewards(run_dir)
        assert n >= 32 and len(own) >= n, (n, len(own))
        mean = sum(own) / len(own)
        se = math.sqrt(max(mean * (1 - mean), 0.01) / n)
        assert abs(page - mean) <= 4 * se + 0.0005, (page, mean, n, len(own))
    # And item by item: each recent completion the page lists was scored exactly as its node scored it.
    matched = 0
    for item in get_state(url)["recent"]:
        run_dir = {a_id: a_dir, b_id: b_dir}.get(item["peer"])
        if run_dir is None:
            continue
        own = [
            r["rewards"][0]
            for r in read_jsonl(run_dir / "rollouts.jsonl")
            if r["task"]["index"] == item["index"] and r["completions"][0].startswith(item["text"])
        ]
        assert own and item["verified"] in own, (item, own)
        matched += 1
    assert matched >= 5

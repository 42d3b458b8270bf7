"""Bring your own environment: the two examples, installed with pip, train in a real two-node swarm.

``examples/countdown_task`` (a task plug-in registered by entry point) and ``examples/vf_sums`` (a verifiers
environment) are installed with ``pip install --target`` into a folder of their own, which every process gets on its
``PYTHONPATH`` (the test leaves the environment it runs in as it was). Two real ``swarm-node join`` processes over real
hivemind DHTs on 127.0.0.1 train the built-in tiny model on both families; each re-scores the other's groups with its
own copy of the plug-ins and trains on them. ``swarm-node watch`` beside them re-scores the same groups on its page.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from node.telemetry.metrics import read_jsonl
from tests.integration.procs import FAST_JOIN, ROOT

pytestmark = [pytest.mark.network]

FAMILIES = ("countdown_numbers@1", "verifiers:vf_sums@0.1.0")
SERVING = r"serving on (http://127\.0\.0\.1:\d+/)"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both example packages installed by pip into a folder of their own (no build isolation: offline)."""
    site = tmp_path_factory.mktemp("plugins")
    src = tmp_path_factory.mktemp("plugin-src")  # setuptools builds in the source folder: copies keep the tree clean
    for name in ("countdown_task", "vf_sums"):
        shutil.copytree(ROOT / "examples" / name, src / name, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(site),
         str(src / "countdown_task"), str(src / "vf_sums")],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    assert (site / "countdown_task").is_dir() and (site / "vf_sums").is_dir()
    return site


def _by_family(run_dir: Path) -> Counter:
    total: Counter = Counter()
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        total.update(row.get("external_by_family") or {})
    return total


@pytest.mark.timeout(900)
def test_two_nodes_train_on_each_others_plugin_groups(node_procs, tmp_path: Path, plugin_site: Path) -> None:
    config = tmp_path / "plugins.yaml"
    config.write_text(
        "tasks:\n"
        "  families:\n"
        "    - {name: countdown_numbers, config: {numbers: 3}}\n"
        '    - {name: "verifiers:vf_sums", config: {rows: 300}}\n'
    )
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    common = ["--config", str(config), *FAST_JOIN]
    a = node_procs("a", "join", "--run-dir", str(a_dir), *common, env=env)
    maddr = a.multiaddr(timeout=300)
    b = node_procs("b", "join", "--peers", maddr, "--run-dir", str(b_dir), *common, env=env)
    watch = node_procs("watch", "watch", "--peers", maddr, "--port", "0", env=env)
    url = watch.wait_for(SERVING, 120).group(1)

    deadline = time.monotonic() + 600
    while True:
        seen = {d.name: _by_family(d) for d in (a_dir, b_dir) if (d / "metrics.jsonl").exists()}
        if len(seen) == 2 and all(seen[n][f] > 0 for n in seen for f in FAMILIES):
            break
        for p in (a, b, watch):
            assert p.proc.poll() is None, f"a process exited early: {p.tail()}"
        assert time.monotonic() < deadline, f"not both nodes trained on both families of the other: {seen}"
        time.sleep(2)
    # the observer re-scores the same groups with its own copy of the plug-ins
    deadline = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(url + "api/state", timeout=60) as r:
            state = json.loads(r.read())
        if all(state["families"].get(f, {}).get("n", 0) > 0 for f in FAMILIES):
            break
        assert time.monotonic() < deadline, f"the observer did not score both families: {state['families']}"
        time.sleep(2)
    for p in (a, b):
        p.signal(signal.SIGTERM)
    for p in (a, b):
        assert p.wait(timeout=120) == 0, p.tail()

    assert not state["refusals"]["tasks"], state["refusals"]
    for f in FAMILIES:
        assert 0.0 <= state["families"][f]["verified"] <= 1.0
    for d in (a_dir, b_dir):
        rows = read_jsonl(d / "metrics.jsonl")
        assert rows[-1]["rejected"] == 0, rows[-1]["rejected_by_reason"]
        assert rows[-1]["policy_version"] >= 1
        own = [json.loads(line)["task"]["family"] for line in (d / "rollouts.jsonl").read_text().splitlines()]
        assert set(own) == set(FAMILIES), Counter(own)

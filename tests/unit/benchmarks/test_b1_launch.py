"""B1's ``--launch fork``: peers forked from one zygote that imported the worker's modules, each still its own
process with its own stdin, stdout and log; a peer that dies before READY is reported, not waited on forever."""

import os
import textwrap
from pathlib import Path

import pytest

from benchmarks.systems import gossip as b1_common
from benchmarks.systems import launch

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from benchmarks.systems import gossip as b1_common, launch

    def run_worker(wargs):
        if wargs["index"] == {crash}:
            raise RuntimeError("peer {crash} fails on purpose")
        print("READY", "/addr/" + str(wargs["index"]), flush=True)
        go = sys.stdin.readline().strip()
        print("a line for the log", file=sys.stderr)
        Path(wargs["outfile"]).write_text(json.dumps({{
            "pid": os.getpid(), "ppid": os.getppid(), "go": go, "boot": wargs["bootstrap"],
            # imported by the zygote only: a peer that has it was forked from the zygote
            "preloaded": "xml.dom.minidom" in sys.modules,
        }}))

    opts = b1_common.parser("test", poll_s=1.0, modes="x").parse_args()
    launch.worker_main(opts, ("xml.dom.minidom",), run_worker)
    """
)


def _script(tmp_path: Path, crash: int = -1) -> str:
    path = tmp_path / "fake_b1.py"
    path.write_text(SCRIPT.format(root=str(ROOT), crash=crash))
    return str(path)


def _opts():
    return b1_common.parser("test", poll_s=1.0, modes="x").parse_args(
        ["--launch", "fork", "--steps", "1", "--interval", "0", "--settle-s", "0"]
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(60)
def test_forked_peers_are_separate_processes_of_the_zygote(tmp_path):
    results = b1_common.run_swarm(_script(tmp_path), "x", 3, _opts(), tmp_path)
    assert len(results) == 3
    pids = {r["pid"] for r in results}
    assert len(pids) == 3 and os.getpid() not in pids
    parents = {r["ppid"] for r in results}
    assert len(parents) == 1 and os.getpid() not in parents  # all forked by one zygote, not by this process
    assert all(r["preloaded"] for r in results)
    assert all(r["go"].startswith("GO ") for r in results)
    assert [r["boot"] for r in results] == [None, "/addr/0", "/addr/0"]
    assert "a line for the log" in (tmp_path / "x_3_2.log").read_text()
    assert all(_gone(p) for p in pids | parents)  # peers reaped and the zygote gone


@pytest.mark.timeout(60)
@pytest.mark.parametrize("crash", [0, 1])
def test_a_forked_peer_that_dies_before_ready_is_reported(tmp_path, crash):
    with pytest.raises(RuntimeError, match=f"peer {crash} did not start"):
        b1_common.run_swarm(_script(tmp_path, crash=crash), "x", 3, _opts(), tmp_path)
    assert f"peer {crash} fails on purpose" in (tmp_path / f"x_3_{crash}.log").read_text()


def test_exec_launch_is_still_the_default():
    assert b1_common.parser("test", poll_s=1.0, modes="x").parse_args([]).launch == "exec"


@pytest.mark.timeout(60)
def test_the_zygotes_pss_leaves_out_its_peers(tmp_path):
    zygote = launch.Zygote(_script(tmp_path), tmp_path / "zygote.log")
    peers = []
    try:
        for i in range(2):
            with (tmp_path / f"{i}.log").open("w") as log:
                wargs = {"index": i, "bootstrap": None, "outfile": str(tmp_path / f"{i}.json")}
                peers.append(zygote.spawn(wargs, log))
        assert all(p.stdout.readline().startswith("READY") for p in peers)
        own, tree = zygote.pss_bytes(), launch.pss_tree_bytes(zygote.proc.pid)
        peer = launch.pss_tree_bytes(peers[0].pid)
        assert own > 0 and peer > 0
        assert own < tree - peer  # the peers' own memory is theirs, not the zygote's
    finally:
        for p in peers:
            p.stdin.write("GO 0\n")
            p.stdin.flush()
            p.wait(30)
            p.close()
        zygote.close()

"""node.heap: freed heap memory goes back to the OS after a learner update, and the malloc arenas are capped, where
the C library can do it; elsewhere every call is a no-op. The node's config decides both."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

import node.heap
from node.config import MALLOC_ARENA_MAX_DEFAULT, NodeConfig, RuntimeConfig
from node.heap import arena_count, limit_arenas, release_free_memory, resident_mb

GLIBC = platform.libc_ver()[0] == "glibc"

# Six threads alive together each allocate: without a cap glibc gives each its own arena.
THREADS = """
import threading
from node.heap import arena_count, limit_arenas
cap = {cap}
if cap:
    assert limit_arenas(cap)
barrier = threading.Barrier(6)
def work():
    first = [bytearray(1000) for _ in range(10)]
    barrier.wait()
    second = [bytearray(1000) for _ in range(10)]
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(arena_count())
"""


def _arenas_with_cap(cap: int) -> int:
    code = textwrap.dedent(THREADS.format(cap=cap))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return int(out.stdout.strip())


def test_release_free_memory_works_on_glibc_and_is_a_no_op_elsewhere() -> None:
    bulk = [bytearray(1 << 20) for _ in range(64)]  # 64 MB from the heap, then freed
    del bulk
    assert release_free_memory() is GLIBC


@pytest.mark.skipif(not GLIBC, reason="malloc arenas are glibc's")
def test_the_arena_cap_takes_effect_for_threads_made_after_it() -> None:
    assert _arenas_with_cap(0) > 2  # glibc's default: an arena per thread, up to 8 per core
    assert _arenas_with_cap(2) == 2
    assert _arenas_with_cap(1) == 1


def test_without_glibc_every_call_is_a_clean_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node.heap, "_libc", lambda: None)  # what _libc finds on macOS or musl
    assert limit_arenas(2) is False
    assert arena_count() is None
    assert release_free_memory() is False


@pytest.mark.skipif(platform.system() != "Linux", reason="/proc/self/statm is Linux's")
def test_resident_memory_sees_an_allocation_and_its_anonymous_part() -> None:
    before = resident_mb()
    assert before is not None and 0 < before[1] < before[0]
    bulk = bytearray(64 << 20)
    bulk[::4096] = b"x" * len(bulk[::4096])  # touch every page: 64 MB resident, anonymous
    after = resident_mb()
    assert after is not None and after[1] - before[1] > 60 and after[0] - before[0] > 60
    del bulk


def test_an_arena_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        limit_arenas(0)


def test_the_runtime_config_holds_the_allocator_settings_with_bounds() -> None:
    cfg = RuntimeConfig()
    assert cfg.malloc_arena_max == MALLOC_ARENA_MAX_DEFAULT >= 1 and cfg.malloc_trim_every == 1
    assert RuntimeConfig(malloc_arena_max=0, malloc_trim_every=0).malloc_arena_max == 0  # glibc's default, no trim
    for bad in ({"malloc_arena_max": -1}, {"malloc_trim_every": -1}, {"malloc_arena_max": 5000}):
        with pytest.raises(ValidationError):
            RuntimeConfig(**bad)


def _learn_steps(monkeypatch: pytest.MonkeyPatch, every: int, steps: int) -> list[int]:
    """The steps after which ``Node.learn`` gave memory back, over ``steps`` steps with ``malloc_trim_every``."""
    import node.runtime as runtime

    trimmed: list[int] = []
    fake = SimpleNamespace(
        cfg=NodeConfig(runtime=RuntimeConfig(malloc_trim_every=every)),
        learner=SimpleNamespace(step=lambda samples: {"loss": 0.0}, policy_version=1),
        phase=SimpleNamespace(train=lambda: {}),
        engine=SimpleNamespace(set_policy_version=lambda v: None),
        step=0,
    )
    monkeypatch.setattr(runtime, "release_free_memory", lambda: trimmed.append(fake.step) or True)
    for k in range(steps):
        fake.step = k
        runtime.Node.learn(fake, SimpleNamespace(samples=[object()]))
    return trimmed


def test_the_step_loop_trims_every_nth_update_or_never(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _learn_steps(monkeypatch, 1, 4) == [0, 1, 2, 3]
    assert _learn_steps(monkeypatch, 3, 9) == [2, 5, 8]  # after the 3rd, 6th and 9th update
    assert _learn_steps(monkeypatch, 0, 5) == []


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("setting", "expected"), [("2", [2]), ("0", [])])
def test_join_caps_the_arenas_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path, setting: str, expected: list[int]
) -> None:
    import node.cli.preflight as preflight
    from node.cli.join import run_join

    capped: list[int] = []
    monkeypatch.setattr(node.heap, "limit_arenas", lambda n: capped.append(n) or True)

    def stop(name: str) -> None:  # the first check after the cap: nothing has started yet
        raise _Stop

    monkeypatch.setattr(preflight, "check_model_name", stop)
    with pytest.raises(_Stop):
        run_join(
            run_dir=tmp_path / "run",
            config_path=None,
            overrides=[f"runtime.malloc_arena_max={setting}"],
            peers=[],
            host=None,
            port=None,
            identity_path=None,
            max_steps=1,
            resume=False,
        )
    assert capped == expected

"""The C heap of a node's process (glibc only): fewer malloc arenas, and freed memory back to the OS after updates.

A learner update of a real model allocates gigabytes of short-lived activation tensors. glibc's allocator keeps
what they free in its heaps, and its dynamic mmap threshold moves up after large frees, so later large tensors
come from those heaps too, and they fragment: a SmolLM2-135M node (vLLM engine, 8 prompts x 8) grew from 6.6 GB to
9.6 GB in three steps and a 16 x 8 node was killed by the kernel at 23 GB in its fifth step. Setting the mmap
threshold fixed (``MALLOC_MMAP_THRESHOLD_``) kept it at 4.4 GB between steps but slowed generation by about a
quarter; ``malloc_trim(0)`` after each update gives the freed pages back without changing how memory is allocated.

glibc also gives each thread that allocates its own arena (up to 8 per core), each a heap that keeps what it frees.
A node allocates from the event loop, the ``asyncio.to_thread`` workers (generation, the update), torch's threads
and hivemind's: a tiny-model node had 9 heaps. ``limit_arenas`` caps them from inside the process, as
``MALLOC_ARENA_MAX`` does from the environment (threads made after the call share the capped arenas; 2 or 3 heaps
then). Measured in the multi-process soak (``benchmarks/results/soak_multiproc_alloc.md``): without the trim the
cap kept 50-70 MB less anonymous memory, with it the two are within 10 MB; neither narrows the swing between
samples, which is the step's own working set (``resident_mb``). Elsewhere (macOS, musl) every call is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def resident_mb() -> tuple[float, float] | None:
    """This process's resident memory and its anonymous part (less file-backed pages), in MiB, from
    ``/proc/self/statm``; None where there is no such file (not Linux). Read between steps, after the update's
    ``malloc_trim``, it leaves out the step's own working set, which a sample at any moment catches at a random
    phase: a tiny-model node's anonymous RSS rises some 80 MB through a step and falls back at its trim."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return None
    page = os.sysconf("SC_PAGE_SIZE") / 2**20
    return int(fields[1]) * page, (int(fields[1]) - int(fields[2])) * page


#: ``mallopt``'s parameter for the arena cap (``M_ARENA_MAX`` in glibc's ``malloc.h``).
M_ARENA_MAX = -8


def limit_arenas(n: int) -> bool:
    """Cap glibc's malloc arenas at ``n`` (``mallopt(M_ARENA_MAX, n)``) for every arena made from now on; True
    when glibc accepted it, False where there is no such call (a no-op)."""
    if n < 1:
        raise ValueError(f"arena cap must be at least 1, not {n}")
    libc = _libc()
    return libc is not None and libc.mallopt(M_ARENA_MAX, n) == 1


def arena_count() -> int | None:
    """How many arenas glibc's allocator has made in this process (the heaps ``malloc_info`` lists); None where
    there is no glibc. Tests use it to see that ``limit_arenas`` took effect."""
    libc = _libc()
    if libc is None or not hasattr(libc, "open_memstream"):
        return None
    libc.open_memstream.restype = ctypes.c_void_p
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(buf), ctypes.byref(size)))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    text = ctypes.string_at(buf, size.value).decode()
    libc.free(buf)
    return text.count("<heap nr=")


def release_free_memory() -> bool:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim(0)``); False where there is no such call
    (macOS, musl), where it is a no-op."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True

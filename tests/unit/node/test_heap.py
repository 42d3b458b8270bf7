"""node.heap: freed heap memory goes back to the OS after a learner update, where the C library can do it."""

import platform

from node.heap import release_free_memory


def test_release_free_memory_works_on_glibc_and_is_a_no_op_elsewhere() -> None:
    bulk = [bytearray(1 << 20) for _ in range(64)]  # 64 MB from the heap, then freed
    del bulk
    assert release_free_memory() is (platform.libc_ver()[0] == "glibc")

"""Allocator settings for the sweep's many short-lived numpy columns (glibc only).

A sweep allocates and frees a few hundred float64 / int64 columns of 20k-200k rows (160 kB -
1.6 MB each). glibc's malloc serves blocks above its mmap threshold (128 kB at start, raised
dynamically up to the largest block freed) with fresh `mmap` pages and gives freed heap top
back to the kernel above its trim threshold (twice the mmap threshold): each column then pays
page faults and zeroing on first touch, which measured about a third of a cold GPT-3 175B sweep's
CPU time (docs/sweep.md, "Allocator"). `retain_freed_memory` sets, once per process,
`M_MMAP_THRESHOLD` = 32 MiB (blocks up to that come from the heap; glibc's own dynamic
threshold stops at 32 MiB on 64-bit, DEFAULT_MMAP_THRESHOLD_MAX) and `M_TRIM_THRESHOLD` =
128 MiB (up to that much freed heap is kept for reuse), with glibc's `mallopt` (man 3 mallopt; glibc malloc/malloc.c, `do_set_mmap_threshold`,
`do_set_trim_threshold`). Values are unchanged by construction: only where memory comes from.

Effect on the process: freed memory up to 128 MiB stays mapped instead of going back to the
kernel; resident memory is otherwise bounded by the peak it already had. The `MALLOC_*_`
environment variables do the same but glibc reads them only at process start, hence the
runtime call. Skipped (returns False) when the C library has no `mallopt` (macOS, Windows),
when it is not glibc, or when the environment variable ZPLAN_NO_MALLOPT is set to anything
non-empty (to measure without it, or for a host application that manages malloc itself).
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter numbers (malloc.h)."""
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024

_applied: bool | None = None


def retain_freed_memory() -> bool:
    """Apply the two mallopt settings once per process; True when they are in effect."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get("ZPLAN_NO_MALLOPT"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # TypeError: CDLL(None) off POSIX
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)

"""The memory the lake's processes allocate from: the system allocator, which keeps what they free for reuse.

- :func:`use_system_allocator`: pyarrow's default pool becomes the system
  allocator (glibc's malloc) instead of this build's mimalloc, unless
  ``ARROW_DEFAULT_MEMORY_POOL`` (Arrow's "Memory Management" documentation)
  names one. The speed layer's tasks allocate a few large, short-lived
  buffers per chunk of the log, and mimalloc maps fresh pages for them
  again and again, each a page fault the kernel zeroes.
- :func:`keep_freed_memory`: malloc serves large blocks from its heap and
  keeps them when freed (``mallopt``, glibc's "Memory Allocation Tunables"),
  with every thread on the main arena, so a stream driver that rebuilds its
  open minute's windows every second reuses the same memory instead of
  faulting it in again; unless glibc's own variables tune malloc.
- :func:`release_freed_memory`: the price of keeping freed memory is that a
  process keeps its high-water mark, so a long-running process gives it back
  after its rare large steps (the stream: after every compaction round).

The ``lake`` process sets the first two first thing
(:func:`metrics_lake.app.cli.main`), and so does Spark's Python worker daemon
before it forks (``metrics_lake.spark.worker_daemon``): the speed layer's
tasks run there. What each choice was measured to save, and against what, is
on the documentation's performance page ("Memory allocation").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import pyarrow as pa

__all__ = ["MALLOC_ENV", "POOL_ENV", "keep_freed_memory", "release_freed_memory", "use_system_allocator"]

#: Arrow's own environment variable for its default pool (``system``, ``jemalloc`` or ``mimalloc``).
POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"

#: glibc's own variables that tune malloc; a process started with one (or with ``glibc.malloc.*`` in
#: ``GLIBC_TUNABLES``) keeps the user's choice.
MALLOC_ENV = (
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
)

# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
#: Free memory at the top of the heap malloc keeps instead of returning it (bytes; the largest value mallopt takes).
_KEEP_BYTES = 2**31 - 1


def use_system_allocator() -> None:
    """Make the system allocator pyarrow's default pool in this process, unless ``ARROW_DEFAULT_MEMORY_POOL`` is set.

    Call it before the process allocates much: buffers already allocated
    stay in the pool they came from (both pools are process-wide and
    thread-safe). Affects every pyarrow call that does not name a pool
    (reads, compute, Parquet writes). Then :func:`keep_freed_memory`.
    """
    if not os.environ.get(POOL_ENV):
        pa.set_memory_pool(pa.system_memory_pool())
    keep_freed_memory()


def keep_freed_memory() -> bool:
    """Make glibc's malloc serve large blocks from its heap and keep freed memory for reuse (module docstring).

    ``mallopt(M_MMAP_MAX, 0)``: no block gets a mapping of its own (a
    thread's arena would still map a block larger than its 64 MiB heap);
    ``mallopt(M_ARENA_MAX, 1)``: so threads allocate from the main arena too;
    ``mallopt(M_TRIM_THRESHOLD, 2 GiB - 1)``: free memory at the top of the
    heap is kept up to that much. Affects later allocations (and threads
    that have not allocated yet) only. Does
    nothing, and returns False, on a C library without ``mallopt`` (not
    glibc) or if the environment already tunes malloc (:data:`MALLOC_ENV`);
    True once set.
    """
    tuned = any(os.environ.get(name) for name in MALLOC_ENV) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")
    if not sys.platform.startswith("linux") or tuned:
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # musl has no mallopt
        return False
    settings = ((_M_MMAP_MAX, 0), (_M_ARENA_MAX, 1), (_M_TRIM_THRESHOLD, _KEEP_BYTES))
    return all(mallopt(parameter, value) == 1 for parameter, value in settings)


def release_freed_memory() -> bool:
    """Give the memory malloc keeps free back to the operating system (``malloc_trim(0)``, glibc's malloc(3)).

    For a long-running process after work it does seldom (a compaction
    round): :func:`keep_freed_memory` keeps every freed block for the next
    batch, so without this the process keeps the high-water mark of its
    rarest, largest step for good. Costs one page fault per page the next
    batch uses again. Returns False where there is no ``malloc_trim`` (not
    glibc), else whether memory was released.
    """
    if not sys.platform.startswith("linux"):
        return False
    trim = getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)
    return bool(trim(0)) if trim is not None else False

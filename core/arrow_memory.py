"""The memory the lake's processes allocate from: the system allocator, which keeps what they free for reuse.

pyarrow's default pool in this build is mimalloc. The speed layer's tasks
allocate a few large, short-lived buffers per chunk of the log (columns of
millions of rows, copied by filters and casts, then written to Parquet),
and mimalloc maps fresh pages for them again and again, each one a page
fault the kernel zeroes. Measured here (one log partition of 3 M events
through :func:`metrics_lake.core.speed.chunk_processing.process_partition`, a
new process each time, three alternating runs): the first partition took
1.8-2.1 s with the system allocator and 2.9-3.5 s with mimalloc (jemalloc
2.1 s), with 0.6-1.0 s instead of 1.7-2.4 s of system time; ``lake produce
--from-file`` of 12 M events 6.7 s instead of 6.8-7.2 s, with 80 MiB less
peak RSS. The pool is Arrow's to choose (``ARROW_DEFAULT_MEMORY_POOL``,
Arrow's "Memory Management" documentation); a user's choice there wins.

The system allocator, glibc's malloc, itself maps every block over its
mmap threshold (at most 32 MiB) fresh and unmaps it on free, so a stream
driver that rebuilds its open minute's windows every second (columns of
100-300 MB at 200,000 series) faults in and zeroes the same amount of
memory every batch. :func:`keep_freed_memory` makes malloc serve those
blocks from its heap and keep them when freed (``mallopt``, glibc's
"Memory Allocation Tunables"). Measured with ``bench/steady_load.py
--rates 200000 --seconds 60``: windows lag p99 2.8-3.2 s in three runs with
it, 3.0-4.7 s in four without (2.4-3.4 s with the same tunables set through
``GLIBC_TUNABLES``; the same speed layer without Spark 1.6-1.8 s instead of
1.9-3.3 s). Those runs measured the last 45 s of each 60 s run, a different
part of the minute each time; the benchmark now measures whole minutes, so
its figures since then are not comparable with these. The price is that a process keeps its high-water mark of
memory: the in-process speed layer's peak RSS 1.3-1.7 GiB instead of
0.5-0.7 GiB. So a long-running process gives the kept memory back after its
rare large steps (:func:`release_freed_memory`: the stream, after every
compaction round), or it would keep the largest of them resident for good.

Threads get arenas of their own from glibc, heaps of at most 64 MiB, and a
thread's arena still maps every larger block fresh. The stream's driver
merges and writes a large open minute on a thread per core
(:func:`metrics_lake.core.speed.window_upserts._merge_and_write_windows`), so
:func:`keep_freed_memory` also keeps every thread on the main arena
(``M_ARENA_MAX`` 1). Measured in process, 200,000 series, the windows
upsert of a minute's last 25 one-second batches: 0.36-0.54 s with two
outliers at 0.63 s, against 0.41-0.48 s with six outliers at 0.70-1.0 s and
0.5-0.7 s of system time each with an arena per thread. Few, large blocks
are allocated per batch, so the threads seldom wait for the arena's lock.

The ``lake`` process sets both first thing (:func:`metrics_lake.app.cli.main`),
and so does Spark's Python worker daemon before it forks
(``metrics_lake.spark.worker_daemon``): the speed layer's tasks run there.
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

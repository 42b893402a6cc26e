"""The memory the lake's processes allocate from: the system allocator, which keeps what they free for reuse.

- :func:`default_to_system_allocator`: Arrow's C++ default pool becomes the
  system allocator (glibc's malloc) instead of this build's mimalloc, by
  ``ARROW_DEFAULT_MEMORY_POOL=system`` (Arrow's "Memory Management"
  documentation), unless the variable names another pool. Arrow reads it
  once, when pyarrow is imported, so this comes first, before any import of
  pyarrow; processes started from this one (Spark's JVM and its Python
  workers) inherit it.
- :func:`use_system_allocator`: the same for the pool pyarrow's Python calls
  default to, where the variable came too late (pyarrow already imported).
  The speed layer's tasks allocate a few large, short-lived buffers per
  chunk of the log, and mimalloc maps fresh pages for them again and again,
  each a page fault the kernel zeroes.
- :func:`keep_freed_memory`: malloc serves large blocks from its heap and
  keeps them when freed (``mallopt``, glibc's "Memory Allocation Tunables"),
  with every thread on the main arena, so a stream driver that rebuilds its
  open minute's windows every second reuses the same memory instead of
  faulting it in again; unless glibc's own variables tune malloc.
- :func:`release_freed_memory`: the price of keeping freed memory is that a
  process keeps its high-water mark, so a long-running process gives it back
  after its rare large steps (the stream: after every compaction round).
- :class:`FreedMemoryBudget`: and between them, whenever its resident size
  has grown a set amount past its low (the stream after each batch, the
  gateway every second), so that it swings by at most that much instead of
  by whatever its largest step since the last round kept.
- :func:`memory_usage`: what the process's allocators hold, in use and free,
  so that a resident size that grows can be told apart: live data, or freed
  memory the allocator keeps.

Why both pools: ``pyarrow.set_memory_pool`` changes only the pool of
pyarrow's Python calls. Arrow's C++ code allocates from its own default
(Parquet's reader and writer properties, for one), which only the variable
chooses: in a ``lake stream`` driver that set the Python pool alone, mimalloc
still held 48 MiB and its mapping 136 MiB resident after 11 minutes
(2026-11-28, ``bench/soak.py``).

The ``lake`` process calls :func:`default_to_system_allocator` before it
imports anything else (:mod:`metrics_lake.app.entry`), then the next two
(:func:`metrics_lake.app.cli.main`), and so does Spark's Python worker
daemon before it forks (``metrics_lake.spark.worker_daemon``): the speed
layer's tasks run there. This module imports pyarrow only when a function
needs it. What each choice was measured to save, and against what, is on
the documentation's performance page ("Memory allocation").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import threading
from dataclasses import dataclass

import psutil

__all__ = [
    "MALLOC_ENV",
    "POOL_ENV",
    "FreedMemoryBudget",
    "MemoryUsage",
    "default_to_system_allocator",
    "keep_freed_memory",
    "memory_usage",
    "release_freed_memory",
    "use_system_allocator",
]

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


@functools.cache
def _libc_function(name: str):
    """The C library's function ``name`` (a ctypes function), or None off Linux or where it has none (musl: no
    ``mallopt``; glibc before 2.33: no ``mallinfo2``). Looked up once: ``find_library`` runs ``ldconfig``, about
    2.5 ms, and :func:`memory_usage` is called at every scrape."""
    if not sys.platform.startswith("linux"):
        return None
    return getattr(ctypes.CDLL(ctypes.util.find_library("c")), name, None)


def default_to_system_allocator() -> bool:
    """Make the system allocator Arrow's C++ default pool in this process and those it starts (module docstring).

    Sets ``ARROW_DEFAULT_MEMORY_POOL=system`` unless the variable is set
    (the user's choice wins). Must run before pyarrow is imported: returns
    False, changing nothing, if it already is or the variable is set; True
    once set.
    """
    if "pyarrow" in sys.modules or os.environ.get(POOL_ENV):
        return False
    os.environ[POOL_ENV] = "system"
    return True


def use_system_allocator() -> None:
    """Make the system allocator pyarrow's default pool in this process, unless ``ARROW_DEFAULT_MEMORY_POOL`` is set.

    Call it before the process allocates much: buffers already allocated
    stay in the pool they came from (both pools are process-wide and
    thread-safe). Affects every pyarrow call that does not name a pool
    (reads, compute, Parquet writes). Then :func:`keep_freed_memory`.
    """
    import pyarrow as pa

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
    mallopt = _libc_function("mallopt")
    if mallopt is None or tuned:
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
    global _releases
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    with _releases_lock:
        _releases += 1
    return bool(trim(0))


_releases = 0  # calls of release_freed_memory in this process, for MemoryUsage
_releases_lock = threading.Lock()


class FreedMemoryBudget:
    """Gives back the memory malloc keeps free once the process's resident size has grown ``keep_bytes`` past its low.

    :meth:`check` (cheap: one read of ``/proc/self/statm`` through psutil)
    compares the resident size with the lowest it has seen since the last
    release; at ``keep_bytes`` or more above it, it calls
    :func:`release_freed_memory` and the resident size after that becomes
    the new low. So a process that keeps freed blocks for reuse
    (:func:`keep_freed_memory`) swings by about ``keep_bytes`` between its
    batches' peaks and its trims, instead of keeping whatever its largest
    step since its last rare trim left free; and live data that grows
    raises the low with it (one release per ``keep_bytes`` of growth, not
    one per check). ``keep_bytes`` 0: release at every check.

    Why the resident size and not ``mallinfo2``'s free bytes: pages
    ``malloc_trim`` gave back stay in malloc's free lists and are still
    counted free, so that figure would not fall after a release. Memory of
    other allocators (delta-rs's jemalloc) moves the resident size too; a
    release that cannot give it back costs one trim and raises the low.
    Thread-safe. Raises ``ValueError`` for a negative ``keep_bytes``.
    """

    def __init__(self, keep_bytes: int) -> None:
        if keep_bytes < 0:
            raise ValueError(f"keep_bytes must be >= 0, got {keep_bytes}")  # programming error
        self.keep_bytes = keep_bytes
        self._low: int | None = None
        self._lock = threading.Lock()
        self._process = psutil.Process()

    def check(self) -> bool:
        """Release freed memory if the resident size is ``keep_bytes`` or more above its low (class docstring);
        returns whether it did."""
        with self._lock:
            resident = self._process.memory_info().rss
            if self._low is None or resident < self._low:
                self._low = resident
            if resident - self._low < self.keep_bytes:
                return False
            release_freed_memory()
            self._low = self._process.memory_info().rss
            return True


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc 2.33+): every field a ``size_t`` of bytes (or a count)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


@dataclass(frozen=True)
class MemoryUsage:
    """What a process's allocators hold, in bytes.

    ``malloc_in_use``: glibc malloc's allocated bytes, every arena, mapped blocks included (``mallinfo2``'s
    ``uordblks + hblkhd``): live native data (pyarrow's buffers in the system pool, numpy arrays, CPython's
    objects over 512 bytes; not its small-object arenas, which it maps itself); ``malloc_free``: free bytes
    malloc keeps in its arenas (``fordblks``; resident only as far as they were touched and not trimmed);
    ``arrow_allocated``: bytes pyarrow's default pool has handed out and not yet freed (a part of
    ``malloc_in_use`` when that pool is the system allocator). ``None`` where the C library has no
    ``mallinfo2`` (not glibc 2.33+). ``releases``: times this process has given malloc's free memory back
    (:func:`release_freed_memory`).
    """

    malloc_in_use: int | None
    malloc_free: int | None
    arrow_allocated: int
    releases: int


def memory_usage() -> MemoryUsage:
    """The process's :class:`MemoryUsage` now (``mallinfo2`` walks every arena under its lock: milliseconds with a
    large heap, so for a scrape, not for every batch)."""
    import pyarrow as pa

    mallinfo2 = _libc_function("mallinfo2")
    if mallinfo2 is None:
        return MemoryUsage(None, None, pa.total_allocated_bytes(), _releases)
    mallinfo2.restype = _MallInfo2  # the cached function object: setting it again is the same
    info = mallinfo2()
    return MemoryUsage(info.uordblks + info.hblkhd, info.fordblks, pa.total_allocated_bytes(), _releases)

"""The Arrow memory pool the lake's processes allocate from: the system allocator.

pyarrow's default pool in this build is mimalloc. The speed layer's tasks
allocate a few large, short-lived buffers per chunk of the log (columns of
millions of rows, copied by filters and casts, then written to Parquet),
and mimalloc maps fresh pages for them again and again, each one a page
fault the kernel zeroes. Measured here (one log partition of 3 M events
through :func:`metrics_lake.core.speed.micro_batch.process_partition`, a
new process each time, three alternating runs): the first partition took
1.8-2.1 s with the system allocator and 2.9-3.5 s with mimalloc (jemalloc
2.1 s), with 0.6-1.0 s instead of 1.7-2.4 s of system time; ``lake produce
--from-file`` of 12 M events 6.7 s instead of 6.8-7.2 s, with 80 MiB less
peak RSS. The pool is Arrow's to choose (``ARROW_DEFAULT_MEMORY_POOL``,
Arrow's "Memory Management" documentation); a user's choice there wins.

The ``lake`` process switches first thing (:func:`metrics_lake.app.cli.main`),
and so does Spark's Python worker daemon before it forks
(``metrics_lake.spark.worker_daemon``): the speed layer's tasks run there.
"""

from __future__ import annotations

import os

import pyarrow as pa

__all__ = ["POOL_ENV", "use_system_allocator"]

#: Arrow's own environment variable for its default pool (``system``, ``jemalloc`` or ``mimalloc``).
POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def use_system_allocator() -> None:
    """Make the system allocator pyarrow's default pool in this process, unless ``ARROW_DEFAULT_MEMORY_POOL`` is set.

    Call it before the process allocates much: buffers already allocated
    stay in the pool they came from (both pools are process-wide and
    thread-safe). Affects every pyarrow call that does not name a pool
    (reads, compute, Parquet writes).
    """
    if not os.environ.get(POOL_ENV):
        pa.set_memory_pool(pa.system_memory_pool())

"""Spark's Python worker daemon, with the lake's modules imported before it forks workers.

Spark starts Python workers by forking them from a daemon process
(``pyspark.daemon``); ``spark.python.daemon.module`` may name another module
to run as that daemon (Spark configuration "Python worker daemon"). This one
imports pyarrow, numpy, pandas, delta-rs and the lake modules the tasks use, then
runs pyspark's daemon, so each forked worker starts with them already
loaded: a new worker's first task no longer spends about a second importing
(measured: 0.7 s of "init" per worker with the plain daemon).

It then freezes those modules' objects out of the garbage collector
(``gc.freeze``, which Python's documentation recommends right before a
fork): a worker's full collection no longer walks the 100,000-odd objects
it inherited, nor writes to their pages (copy-on-write). Measured with
``perf`` on ``bench/same_file.py``'s import into a running stream: the
collector's share of the two workers fell from 1.1 % of all CPU samples to
none, and the workers' CPU from 13.2 to 12.4 s.

The daemons of Spark's Python data-source planners run this module too
(``spark/python_launcher.sh``), without the imports: their workers only
plan, and Spark starts three such daemons per session. In every daemon, a
worker whose socket Spark closed ends quietly (:func:`worker`).
"""

from __future__ import annotations

import gc
import sys

from pyspark import daemon

#: The worker module of Spark's task workers (the daemon's argument); planners' daemons name their own.
TASK_WORKER = "pyspark.worker"

_pyspark_worker = daemon.worker


def worker(sock, authenticated: bool) -> int:
    """Run one forked worker as pyspark's ``daemon.worker`` does; its exit code (0: the worker may be reused).

    A ``BrokenPipeError`` or ``ConnectionResetError`` means Spark closed the
    worker's socket: it closes an idle pooled worker's after a minute
    (``PythonWorkerFactory``), and stops a session's workers. The worker then
    reads the end of its input, fails to report that, and pyspark's daemon
    printed the error's traceback to the driver's stderr (Spark sets
    ``PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE``): three of them a minute
    into every ``lake stream``, one per planner. Here the worker returns 1,
    which ends it just the same, without the traceback: nobody is left to
    tell, and the JVM reports its own side of a real failure.
    """
    try:
        return _pyspark_worker(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError):
        return 1


def _import_task_modules() -> None:
    """Import what task workers use, once, in the daemon: every forked worker inherits it."""
    import deltalake  # noqa: F401
    import numpy  # noqa: F401
    import pandas  # noqa: F401 - pyarrow imports it on first use (pa.array, pyarrow.dataset): 0.2-0.3 s a worker
    import pyarrow  # noqa: F401
    import pyarrow.dataset  # noqa: F401 - reads the tables' files
    import pyarrow.parquet  # noqa: F401

    import metrics_lake.core.kernels.windows  # noqa: F401
    import metrics_lake.core.speed.micro_batch  # noqa: F401
    import metrics_lake.spark.datasources.delta_reader  # noqa: F401
    import metrics_lake.spark.datasources.log_source  # noqa: F401
    from metrics_lake.core.arrow_memory import use_system_allocator

    use_system_allocator()  # forked workers inherit the pools (metrics_lake.core.arrow_memory)


if __name__ == "__main__":
    from metrics_lake.core.arrow_memory import default_to_system_allocator

    default_to_system_allocator()  # before pyarrow is imported: Arrow's C++ pool too (metrics_lake.core.arrow_memory)
    if sys.argv[1:2] in ([], [TASK_WORKER]):
        _import_task_modules()
        gc.freeze()  # after every import, right before the forks
    daemon.worker = worker  # manager() looks the function up for each fork
    daemon.manager()

"""Spark's runner of a Python streaming source, ending without a traceback when Spark closes its socket.

A streaming query over a Python data source (the log's, :mod:`metrics_lake.spark.datasources.log_source`)
asks a process of its own, ``pyspark.sql.streaming.python_streaming_source_runner``, for
offsets, partitions and commits over a socket. Stopping the query closes that socket. A
runner caught answering a call then fails to write the answer, fails again reporting that
failure, and its module-level code let the error out: three chained ``BrokenPipeError``
tracebacks on the driver's stderr after "stopped on signal, between micro-batches" (seen
under load with ``lake stream --trigger 0.01``, a call always under way).

``spark/python_launcher.sh`` runs that module through this one, which runs it unchanged and
ends it quietly on those two errors (exit 1, as the runner's own ``sys.exit(-1)`` after a
failure): nobody is left to tell, and the JVM reports its own side of a real failure. Like
:func:`metrics_lake.spark.worker_daemon.worker` for Spark's forked workers.
"""

from __future__ import annotations

import runpy
import sys

#: The module Spark runs for a Python streaming source.
RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def main(module: str = RUNNER) -> int:
    """Run ``module`` as ``__main__``; its exit code, or 1 if it ended because Spark closed its socket."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except (BrokenPipeError, ConnectionResetError):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
"""

from __future__ import annotations

import gc

import deltalake  # noqa: F401
import numpy  # noqa: F401
import pandas  # noqa: F401 - pyarrow imports it on first use (pa.array, pyarrow.dataset): 0.2-0.3 s in each new worker
import pyarrow  # noqa: F401
import pyarrow.dataset  # noqa: F401 - reads the tables' files
import pyarrow.parquet  # noqa: F401
from pyspark import daemon

import metrics_lake.core.kernels.windows  # noqa: F401
import metrics_lake.core.speed.micro_batch  # noqa: F401
import metrics_lake.spark.datasources.delta_reader  # noqa: F401
import metrics_lake.spark.datasources.log_source  # noqa: F401
from metrics_lake.core.arrow_memory import use_system_allocator

if __name__ == "__main__":
    use_system_allocator()  # forked workers inherit the pool (metrics_lake.core.arrow_memory)
    gc.freeze()  # after every import, right before the forks
    daemon.manager()

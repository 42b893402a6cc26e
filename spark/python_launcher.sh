#!/bin/sh
# The interpreter Spark starts the lake's Python processes with (PYSPARK_PYTHON, which
# metrics_lake.spark.session points here): the lake's own Python, LAKE_SPARK_PYTHON. Spark's
# Python data-source planners run their workers under "-m pyspark.daemon" whatever
# spark.python.daemon.module says; those run as the lake's daemon module instead
# (spark/worker_daemon.py), which ends a worker whose socket Spark closed without a traceback.
python="${LAKE_SPARK_PYTHON:?LAKE_SPARK_PYTHON is not set: metrics_lake.spark.session sets it with PYSPARK_PYTHON}"
# "-m" and "-c" put the working directory (the driver's, where the user ran `lake`) first on sys.path: a grp.py or
# queue.py there would stand in for the standard library's module in every Spark worker. Python 3.11+ leaves it out.
export PYTHONSAFEPATH=1
if [ "$1" = "-m" ] && [ "$2" = "pyspark.daemon" ]; then
    shift 2
    exec "$python" -m metrics_lake.spark.worker_daemon "$@"
fi
# A streaming query's Python source runs in a process of its own: as spark/source_runner.py, which ends it without a
# traceback when the query stops while it answers a call.
if [ "$1" = "-m" ] && [ "$2" = "pyspark.sql.streaming.python_streaming_source_runner" ]; then
    shift 2
    exec "$python" -m metrics_lake.spark.source_runner "$@"
fi
exec "$python" "$@"

"""The Python side of the lake's native Spark tables: delta-rs names a snapshot's files for the JVM.

``metricslake.spark.LakeCatalog`` (``spark/jvm/``) asks, through py4j's
callback server, for the Parquet files of a lake table's Delta snapshot each
time a query loads the table, and again when its scan lists files with the
query's filters; :class:`SnapshotResolver` answers from the Delta log
(:func:`~metrics_lake.core.tables.snapshots.snapshot_files`), pruning by
partition values and Delta min/max statistics
(:mod:`metrics_lake.core.tables.pruning`). Spark's own Parquet reader then
reads the files, on the driver's executors, without Python.

Answers are JSON (see ``SnapshotResolver.java``); a failure is an answer
too, ``{"error": "metrics_lake.lake_schemas.errors.InputError: ..."}``,
which the JVM raises as an ``IllegalArgumentException`` with that message:
one line for a client of ``lake sql-server``, and the CLI rebuilds the
lake error from it (:mod:`metrics_lake.app.cli.boundary`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os

from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import table_folder, table_layout
from metrics_lake.core.tables.pruning import Predicate, supported
from metrics_lake.core.tables.snapshots import snapshot_files
from metrics_lake.core.tables.time_travel import check_files_present, open_as_of
from metrics_lake.lake_schemas.errors import LakeError
from metrics_lake.lake_schemas.types import utc_time
from metrics_lake.spark.datasources.delta_reader import SCAN_REPORT_ENV, report_scan

__all__ = ["SnapshotResolver", "decode_predicates", "install"]

#: JSON value types the JVM sends, and the Python value each becomes.
_DECODERS = {
    "string": str,
    "int": int,
    "float": float,
    "bool": bool,
    "date": dt.date.fromisoformat,
    "timestamp_us": utc_time,
}


def decode_predicates(encoded: str) -> list[Predicate]:
    """``[[column, op, [[type, value], ...]], ...]`` (JSON, from ``LakeFileIndex.java``) as predicates.

    ``op`` is one of ``=``, ``>``, ``>=``, ``<``, ``<=`` (one value), ``in``
    (any number) and ``is_null``/``is_not_null`` (none).
    """
    predicates = []
    for column, op, typed in json.loads(encoded):
        values = tuple(_DECODERS[kind](value) for kind, value in typed)
        value = values if op == "in" else values[0] if values else None
        predicates.append(Predicate(column, op, value))
    return predicates


class SnapshotResolver:
    """Answers ``metricslake.spark.SnapshotResolver.resolve`` for the lake in ``store`` (a local lake)."""

    class Java:
        implements = ["metricslake.spark.SnapshotResolver"]

    def __init__(self, store: Store) -> None:
        self.store = store

    def resolve(self, table: str, version: str, timestamp: str, predicates: str, scan: bool) -> str:
        """JSON ``{"version": n, "folder": f, "files": [[path, bytes, mtime ms], ...]}``: the files that may match.

        ``version``/``timestamp``: time travel, ``""`` for the latest. With
        ``scan`` and ``LAKE_SCAN_REPORT=1``, prints the files read of the
        files in the snapshot on stderr. Never raises: a failure is
        ``{"error": "<error class>: <message>"}``.
        """
        try:
            return json.dumps(self._resolve(table, version, timestamp, predicates, scan))
        except LakeError as error:
            return json.dumps({"error": f"{type(error).__module__}.{type(error).__name__}: {error}"})
        except Exception as error:  # a bug: still an answer, or the query would wait on a dead callback
            logging.getLogger(__name__).exception("resolving %s failed", table)
            return json.dumps({"error": f"resolving lake table {table} failed: {type(error).__name__}: {error}"})

    def _resolve(self, table: str, version: str, timestamp: str, encoded: str, scan: bool) -> dict:
        schema, _ = table_layout(self.store, table)
        predicates = [p for p in decode_predicates(encoded) if supported(schema, p)]
        snapshot = open_as_of(self.store, table, int(version) if version else None, timestamp or None)
        kept = snapshot_files(self.store, table, snapshot, None, predicates)
        if (version or timestamp) and not scan:
            check_files_present(self.store, table, snapshot, [f.relative for f in kept])
        if scan and os.environ.get(SCAN_REPORT_ENV) == "1":
            everything = snapshot_files(self.store, table, snapshot) if predicates else kept
            report_scan(table, snapshot.version(), everything, kept, predicates)
        _, folder = table_folder(self.store, table)
        return {"version": snapshot.version(), "folder": folder, "files": [[f.path, f.size, 0] for f in kept]}


def install(spark, store: Store) -> None:
    """Answer ``spark``'s JVM with a :class:`SnapshotResolver` for ``store``, through py4j's callback server.

    The resolver serves every session of the application (Spark Connect's
    and the Thrift server's too); installing again replaces it.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    resolver = SnapshotResolver(store)
    _INSTALLED[id(gateway)] = resolver  # the JVM holds it through py4j only: keep a reference here
    spark._jvm.metricslake.spark.LakeSource.setResolver(resolver)


_INSTALLED: dict[int, SnapshotResolver] = {}

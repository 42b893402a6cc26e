"""The lake's tables in a Spark session's catalog, and time travel in SQL.

Every table of the lake becomes a table of Spark's session catalog
(``default.<table>``): it appears in ``SHOW TABLES`` and in JDBC metadata,
joins with anything else in the session, and each query reads the table's
latest snapshot, resolved when the query is analysed.

On a local lake the tables are read by Spark's own vectorised Parquet scan:
their provider is ``metricslake.spark.LakeSource`` and the session catalog,
``metricslake.spark.LakeCatalog`` (``spark/jvm/``, built by
:mod:`metrics_lake.spark.lake_jar`), loads each as the files of its Delta
snapshot, which delta-rs names (:mod:`metrics_lake.spark.snapshot_resolver`).
Spark prunes columns, partitions and row groups itself, files by their Delta
statistics through the resolver, and answers ``t VERSION AS OF 12`` and ``t
TIMESTAMP AS OF '2026-11-20 10:00'`` natively. On S3, where Spark has no
file system (no ``hadoop-aws``), each table is read by its own Python format
``lake_<table>`` (:func:`metrics_lake.spark.datasources.delta_reader.table_source`).

Time travel for every table, either kind: :func:`rewrite_time_travel`
rewrites ``VERSION``/``TIMESTAMP AS OF`` into table options, ``t WITH
('version' = '12')``, which both readers take; the options form works as it
is in ``lake sql`` and through ``lake sql-server``, and the ``AS OF`` form
works there natively on a local lake.

Catalog entries of the in-memory catalog live in the application's shared
state, so sessions that Spark Connect and the Thrift server create see
them; the formats are per session, so :func:`register_lake_tables` also
adds them to the formats every new session starts with.
"""

from __future__ import annotations

import re

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import list_tables, table_layout
from metrics_lake.core.tables.time_travel import parse_timestamp
from metrics_lake.lake_schemas.errors import LakeError
from metrics_lake.spark.session import LAKE_CATALOG

__all__ = ["register_lake_tables", "rewrite_time_travel"]

_VERSION = r"(?:FOR\s+SYSTEM_VERSION|VERSION)\s+AS\s+OF\s+(\d+)"
_TIMESTAMP = r"(?:FOR\s+SYSTEM_TIME|TIMESTAMP)\s+AS\s+OF\s+(?:TIMESTAMP\s*)?'([^']*)'"


def rewrite_time_travel(query: str, tables: list[str]) -> str:
    """``query`` with each ``<table> VERSION AS OF n`` / ``TIMESTAMP AS OF '...'`` of a lake table as table options.

    ``tables``: the lake's table names (others are left to Spark). Raises
    :class:`~metrics_lake.lake_schemas.errors.InputError` for a timestamp
    that is not an ISO time.
    """
    if not tables:
        return query
    names = "|".join(re.escape(t) for t in sorted(tables, key=len, reverse=True))

    def version(match: re.Match) -> str:
        return f"{match.group(1)} WITH ('version' = '{int(match.group(2))}')"

    def timestamp(match: re.Match) -> str:
        parse_timestamp(match.group(2))  # a malformed time fails here, in one line, before Spark plans anything
        return f"{match.group(1)} WITH ('timestamp' = '{match.group(2)}')"

    query = re.sub(rf"\b({names})\s+{_VERSION}", version, query, flags=re.IGNORECASE)
    return re.sub(rf"\b({names})\s+{_TIMESTAMP}", timestamp, query, flags=re.IGNORECASE)


def _share_formats(spark, names: list[str]) -> None:
    """Add the session's formats ``names`` to those every new session of this application starts with.

    Spark keeps Python data sources registered at run time per session
    (``DataSourceManager``); new sessions start from a static map that
    Spark otherwise fills only from installed ``pyspark_*`` packages. The
    map is set through py4j (Spark 4.2's ``DataSourceManager$.dataSourceBuilders``),
    checked by tests/spark/test_catalog.py.
    """
    jvm = spark._jvm
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    companion = getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$").__getattr__("MODULE$")
    current = companion.dataSourceBuilders()
    builders = (
        current.get()
        if current.isDefined()
        else getattr(jvm.scala.collection.immutable, "Map$").__getattr__("MODULE$").empty()
    )
    for name in names:
        builders = builders.updated(name, manager.lookupDataSource(name))
    getattr(companion, "dataSourceBuilders_$eq")(jvm.scala.Some(builders))


def register_lake_tables(spark, settings: LakeSettings, *, shared: bool = False) -> list[str]:
    """Make every existing lake table a table of ``spark``'s catalog (module docstring); returns their names.

    A table already in the catalog is left as it is. With ``shared``,
    sessions created later in this application (Spark Connect, the Thrift
    server) can read them too (the native tables always can: their catalog
    entries and the resolver belong to the application). Raises
    :class:`~metrics_lake.lake_schemas.errors.LakeError` if ``spark`` was
    built for the other kind of lake (local or S3): its session catalog
    decides how tables are read.
    """
    store = open_store(settings)
    names = list_tables(store)
    native = spark.conf.get("spark.sql.catalog.spark_catalog", "") == LAKE_CATALOG
    if native == settings.is_s3:
        built_for = "a local" if native else "an S3"
        raise LakeError(f"this Spark session was built for {built_for} lake; build one for {settings.root}")
    existing = {row.tableName for row in spark.sql("SHOW TABLES IN default").collect() if not row.isTemporary}
    if native:
        from metrics_lake.lake_schemas.types import spark_schema
        from metrics_lake.spark.snapshot_resolver import install

        install(spark, store)
        for name in names:
            if name not in existing:
                columns = spark_schema(table_layout(store, name)[0]).toDDL()
                spark.sql(
                    f"CREATE TABLE default.`{name}` ({columns}) USING metricslake.spark.LakeSource "
                    f"OPTIONS (table '{name}')"
                )
        return names
    from metrics_lake.spark.datasources.delta_reader import table_source

    for name in names:
        spark.dataSource.register(table_source(settings.root, name))
    if shared and names:
        _share_formats(spark, [f"lake_{name}" for name in names])
    for name in names:
        if name not in existing:
            spark.sql(f"CREATE TABLE default.`{name}` USING lake_{name}")
    return names

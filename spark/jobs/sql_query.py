"""``lake sql``: run Spark SQL over the lake's Delta tables.

Every lake table is a table of the session's catalog
(:mod:`metrics_lake.spark.catalog`) read at its latest snapshot when the
query is planned; ``VERSION AS OF`` / ``TIMESTAMP AS OF`` and ``--version``
read an older one. A table the query does not use is never read.
"""

from __future__ import annotations

import re

from metrics_lake.core.config import LakeSettings
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.spark.catalog import register_lake_tables, rewrite_time_travel


def referenced_tables(query: str, tables: list[str]) -> list[str]:
    """Names from ``tables`` that occur as whole words in ``query`` (case-insensitive)."""
    return [name for name in tables if re.search(rf"\b{re.escape(name)}\b", query, re.IGNORECASE)]


def parse_versions(specs: list[str]) -> dict[str | None, int]:
    """Parse ``--version`` values: ``N`` (every referenced table) or ``TABLE=N``.

    Raises :class:`~metrics_lake.lake_schemas.errors.InputError` naming a malformed spec.
    """
    versions: dict[str | None, int] = {}
    for spec in specs:
        table, _, number = spec.rpartition("=")
        if not number.isdigit():
            raise InputError(f"--version {spec!r}: expected N or TABLE=N with N a version number >= 0")
        versions[table or None] = int(number)
    return versions


def register_views(spark, settings: LakeSettings, query: str, versions: dict[str | None, int]) -> list[str]:
    """Make the lake's tables catalog tables (:mod:`metrics_lake.spark.catalog`); returns the names ``query`` uses.

    ``--version`` pins a table (or, with key None, every table the query
    names) with a temporary view of that version, which shadows the catalog
    table of the same name. Raises
    :class:`~metrics_lake.lake_schemas.errors.InputError` if ``--version``
    names a table that does not exist.
    """
    existing = register_lake_tables(spark, settings)
    unknown = sorted(name for name in versions if name is not None and name not in existing)
    if unknown:
        raise InputError(f"--version names unknown table(s) {unknown}; tables: {existing}")
    names = referenced_tables(query, existing)
    for name in existing:
        version = versions.get(name, versions.get(None)) if name in names else None
        if version is None:
            spark.catalog.dropTempView(name)  # an earlier query's pin in this session
        else:
            spark.sql(
                f"CREATE OR REPLACE TEMPORARY VIEW `{name}` AS "
                f"SELECT * FROM default.`{name}` WITH ('version' = '{version}')"
            )
    return names


def run_sql(spark, settings: LakeSettings, query: str, versions: dict[str | None, int] | None = None):
    """Register the lake's tables, rewrite ``VERSION``/``TIMESTAMP AS OF`` of lake tables, return the DataFrame."""
    names = register_views(spark, settings, query, versions or {})
    return spark.sql(rewrite_time_travel(query, names))

"""``lake sql``: run Spark SQL over the lake's Delta tables.

Every table a query names is registered as a temporary view over its current
Delta snapshot (format ``lakedelta``), or over an older version for time
travel. Only the tables a query mentions are opened, so a query never pays
for, or fails on, tables it does not use.
"""

from __future__ import annotations

import re

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import list_tables
from metrics_lake.lake_schemas.errors import InputError


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
    """Create a temp view per table ``query`` references; returns their names.

    Raises :class:`~metrics_lake.lake_schemas.errors.InputError` if ``--version`` names a table that does not exist.
    """
    existing = list_tables(open_store(settings))
    unknown = sorted(name for name in versions if name is not None and name not in existing)
    if unknown:
        raise InputError(f"--version names unknown table(s) {unknown}; tables: {existing}")
    names = referenced_tables(query, existing)
    for name in names:
        reader = spark.read.format("lakedelta").option("root", settings.root).option("table", name)
        version = versions.get(name, versions.get(None))
        if version is not None:
            reader = reader.option("version", str(version))
        reader.load().createOrReplaceTempView(name)
    return names


def run_sql(spark, settings: LakeSettings, query: str, versions: dict[str | None, int] | None = None):
    """Register the views ``query`` needs and return its DataFrame."""
    register_views(spark, settings, query, versions or {})
    return spark.sql(query)

"""Arrow types shared by every schema, and the derivation of Spark schemas from them.

Units: every timestamp is UTC. Event time in the log is millisecond precision
(:data:`UTC_MS`); Delta tables store microseconds (:data:`UTC_US`) because
that is the Delta protocol's ``timestamp`` type (Delta PROTOCOL.md,
"Primitive Types").
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["TAGS", "UTC_MS", "UTC_US", "spark_schema"]

UTC_MS = pa.timestamp("ms", tz="UTC")
UTC_US = pa.timestamp("us", tz="UTC")
TAGS = pa.map_(pa.string(), pa.string())


def spark_schema(schema: pa.Schema):
    """Derive a Spark ``StructType`` from a pyarrow schema declared in this package.

    Timestamps with a zone become Spark ``TIMESTAMP`` (UTC instants), not
    ``TIMESTAMP_NTZ``. Imports pyspark lazily so non-Spark users (agents,
    the log) never pay for it.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)

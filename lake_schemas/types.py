"""Arrow types shared by every schema, and the derivation of Spark schemas from them.

Units: every timestamp is UTC. Event time in the log is millisecond precision
(:data:`UTC_MS`); Delta tables store microseconds (:data:`UTC_US`) because
that is the Delta protocol's ``timestamp`` type (Delta PROTOCOL.md,
"Primitive Types").
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["TAGS", "UTC_MS", "UTC_US", "spark_schema", "utc_dates", "utc_time"]

UTC_MS = pa.timestamp("ms", tz="UTC")
UTC_US = pa.timestamp("us", tz="UTC")
TAGS = pa.map_(pa.string(), pa.string())


def utc_time(epoch_us: int) -> dt.datetime:
    """The UTC instant (an aware ``datetime``, µs precision) ``epoch_us`` microseconds after 1970-01-01T00:00Z.

    Exact integer arithmetic: ``datetime.fromtimestamp`` goes through a float of seconds.
    """
    return _EPOCH + dt.timedelta(microseconds=epoch_us)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def utc_dates(timestamps: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The UTC calendar date (``date32``) of each timestamp (any unit, with or without a zone; nulls stay null).

    A timestamp's value is a UTC instant whatever its zone (Arrow's
    ``Schema.fbs``), so its UTC date is the date of the same value read
    without a zone: a cast that floors to days. Arrow's cast of a zoned
    timestamp to a date converts every value through the zone's rules
    first: 8.8 ms for 500,000 ``UTC_MS`` values, against 0.6 ms this way.
    """
    return pc.cast(timestamps.cast(pa.timestamp(timestamps.type.unit)), pa.date32())


def spark_schema(schema: pa.Schema):
    """Derive a Spark ``StructType`` from a pyarrow schema declared in this package.

    Timestamps with a zone become Spark ``TIMESTAMP`` (UTC instants), not
    ``TIMESTAMP_NTZ``. Imports pyspark lazily so non-Spark users (agents,
    the log) never pay for it.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)

"""utc_dates: the UTC calendar day of a timestamp, whatever its unit and zone."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from metrics_lake.lake_schemas.types import utc_dates


@pytest.mark.parametrize("unit", ["ms", "us"])
@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo", "America/Los_Angeles", None])
def test_the_date_is_the_utc_day_of_the_instant_whatever_the_zone(unit, zone):
    per_ms = {"ms": 1, "us": 1000}[unit]
    ms = [0, -1, 86_399_999, 86_400_000, -86_400_001, 1_763_596_799_999, 1_763_596_800_000 + 3_600_000 * 20, None]
    values = pa.array([None if v is None else v * per_ms for v in ms], pa.timestamp(unit, tz=zone))
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    expected = [None if v is None else (epoch + dt.timedelta(milliseconds=v)).date() for v in ms]
    assert utc_dates(values).to_pylist() == expected  # Tokyo's 05:00 on the 21st is still the 20th in UTC
    chunked = utc_dates(pa.chunked_array([values[:3], values[3:]]))
    assert chunked.type == pa.date32() and chunked.to_pylist() == expected

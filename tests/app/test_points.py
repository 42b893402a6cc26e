"""Points from other protocols into log records: the contract checked vectorised, reasons as the JSON path's."""

from __future__ import annotations

import json
import math

from metrics_lake.app.gateway.protocols.points import PointsBuilder
from metrics_lake.lake_schemas.contract import MAX_RAW_BYTES

T = 1_763_600_000_000


def test_points_keep_their_order_with_rejects_and_get_the_contract_reasons():
    builder = PointsBuilder()
    ok = builder.series("web-1", "cpu", (("core", "0"),))
    builder.add(ok, T, 1.5)
    builder.reject("garbage line", "invalid_payload", "line 2: not line protocol")
    builder.add(ok, T + 1, math.nan)
    builder.add(builder.series(None, "cpu", ()), T, 2.0)
    builder.add(builder.series("web-1", "Bad Name", ()), T, 3.0)
    builder.add(builder.series("w" * 129, "cpu", ()), T, 4.0)
    builder.add(ok, 1_000, 5.0)  # seconds sent as milliseconds
    builder.add(ok, T + 2, 6.0, raw="cpu,host=web-1 v=6")
    rows = builder.records().to_pylist()
    assert [r["reason"] and r["reason"].split(":")[0] for r in rows] == [
        None,
        "invalid_payload",
        "non_finite_value",
        "missing_field",
        "bad_metric_name",
        "bad_server",
        "bad_timestamp",
        None,
    ]
    assert rows[0] | {"ts": None} == {
        "ts": None,
        "server": "web-1",
        "metric": "cpu",
        "value": 1.5,
        "tags": [("core", "0")],
        "raw": None,
        "reason": None,
    }
    assert rows[1]["raw"] == "garbage line"
    assert json.loads(rows[2]["raw"].replace("NaN", "null")) == {
        "ts": T + 1,
        "server": "web-1",
        "metric": "cpu",
        "value": None,
        "tags": {"core": "0"},
    }
    assert rows[7]["raw"] is None and rows[7]["value"] == 6.0  # raw is kept for rejects only
    assert all(r["ts"] is None and r["value"] is None for r in rows if r["reason"])


def test_a_huge_raw_payload_is_cut_with_a_marker():
    builder = PointsBuilder()
    builder.reject("x" * (MAX_RAW_BYTES + 10), "invalid_payload", "too long")
    (row,) = builder.records().to_pylist()
    assert row["raw"].endswith("…[10 more bytes]")


def test_no_points_give_an_empty_table():
    assert PointsBuilder().records().num_rows == 0

"""`lake series`: a metric's series and its labels' top values by series count, beside the limit states."""

from __future__ import annotations

from collections import Counter

import pyarrow.compute as pc

from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed import cardinality_gate
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.tables import Table
from tests.app.conftest import one_line
from tests.core.speed.test_cardinality_limits import LIMITS, events
from tests.core.speed.test_micro_batch import batch, produce


def test_series_counts_servers_per_label_value_and_shows_the_admitted_series(lake, store):
    cardinality_gate._CACHE.clear()
    produce(SegmentLog(store), events(), partitions=2)
    batch(store, limits=LIMITS)
    bronze = open_table(store, Table.BRONZE_EVENTS).to_pyarrow_table()
    requests = bronze.filter(pc.equal(bronze.column("metric"), "app.requests"))
    servers = sorted(set(requests.column("server").to_pylist()))
    assert servers == ["bomb-1"]  # wide-1 sent too many tags: quarantined
    spread = bronze.filter(pc.equal(bronze.column("metric"), "app.spread"))
    admitted = Counter(spread.column("partition").to_pylist())
    assert sum(admitted.values()) == len(set(spread.column("server").to_pylist())) < 40

    result = lake("series", "--metric", "app.spread", "--hours", "24")
    assert f"app.spread: {sum(admitted.values())} series (servers)" in result.stderr
    for partition, count in admitted.items():
        assert f"partition {partition}: {count} series admitted of 6 " in result.stderr
    row = next(line for line in result.stdout.splitlines() if "region" in line)
    assert row.split("│")[1:5] == [" region ", " 1      ", " us    ", f" {sum(admitted.values()):<6} "]

    error = one_line(lake("series", "--metric", "no.such.metric", expect=2))
    assert "no windows of 'no.such.metric'" in error

"""Cardinality limits (core/kernels/cardinality.py) against an independent, record-by-record implementation."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from metrics_lake.core.kernels.cardinality import KEYS, SERIES, VALUE, CardinalityLimits, LimitState, admit
from metrics_lake.core.kernels.windows import series_codes
from metrics_lake.lake_schemas.log_records import with_dictionaries
from metrics_lake.lake_schemas.types import TAGS


def naive(records: list[dict], limits: CardinalityLimits, series: dict, values: dict) -> list[str | None]:
    """Record by record, in offset order: which limit refuses each record (None: admitted).

    ``series``/``values``: admitted keys per metric / tag name, updated in place. Every limit is judged on its
    own (a record refused by one still brings its series and values to the others), labels per event first.
    """
    verdicts = []
    for record in records:
        tags = record["tags"] or {}
        if limits.labels_per_event and len(tags) > limits.labels_per_event:
            verdicts.append("labels_per_event")
            continue
        verdict = None
        if limits.series_per_metric:
            known = series.setdefault(record["metric"], set())
            if record["server"] not in known:
                if len(known) < limits.series_per_metric:
                    known.add(record["server"])
                else:
                    verdict = "series_per_metric"
        if limits.values_per_label:
            for name, value in tags.items():
                known = values.setdefault(name, set())
                if value not in known:
                    if len(known) < limits.values_per_label:
                        known.add(value)
                    elif verdict is None:
                        verdict = "values_per_label"
        verdicts.append(verdict)
    return verdicts


def table(records: list[dict], first_offset: int, dictionaries: bool = False) -> pa.Table:
    """The records as a block; ``dictionaries``: ``metric``, ``server`` and the tags' names and values as the
    speed layer reads the log's segments, two chunks with dictionaries each (in their own orders)."""
    block = pa.table(
        {
            "offset": pa.array(range(first_offset, first_offset + len(records)), pa.int64()),
            "metric": [r["metric"] for r in records],
            "server": [r["server"] for r in records],
            "tags": pa.array([None if r["tags"] is None else list(r["tags"].items()) for r in records], TAGS),
        }
    )
    if not dictionaries:
        return block
    half = len(records) // 2
    coded = with_dictionaries(block.schema)
    # The first chunk's dictionaries in reverse order of appearance, the second's in order.
    backwards = pa.Table.from_pylist(block.slice(0, half).to_pylist()[::-1], coded)
    first = backwards.take(pa.array(range(half - 1, -1, -1), pa.int64()))
    return pa.concat_tables([first, block.slice(half).cast(coded)])


def verdict_of(reason: str | None) -> str | None:
    if reason is None:
        return None
    for name in ("labels_per_event", "series_per_metric", "values_per_label"):
        if f" {name}=" in reason or f"over {name}=" in reason:
            return name
    raise AssertionError(reason)


def random_records(rng: random.Random, n: int) -> list[dict]:
    records = []
    for _ in range(n):
        tags = None if rng.random() < 0.1 else {f"t{k}": f"v{rng.randrange(12)}" for k in range(rng.randrange(5))}
        records.append({"metric": f"m{rng.randrange(3)}", "server": f"s{rng.randrange(15)}", "tags": tags})
    return records


@pytest.mark.parametrize("dictionaries", [False, True], ids=["strings", "dictionaries"])
@pytest.mark.parametrize("seed", range(25))
def test_blocks_agree_with_record_by_record(seed, dictionaries):
    """Any split of a partition hour into blocks (batches) refuses exactly the records the sequential rule does,
    and the state's counts never pass a limit; the same whether the series' strings are plain or dictionaries."""
    rng = random.Random(seed)
    limits = CardinalityLimits(
        series_per_metric=rng.choice([0, 1, 4, 9]),
        values_per_label=rng.choice([0, 1, 3, 8]),
        labels_per_event=rng.choice([0, 2, 3]),
    )
    records = random_records(rng, rng.randrange(1, 400))
    expected = naive(records, limits, {}, {})
    state = LimitState(limits)
    got: list[str | None] = []
    cuts = sorted({0, len(records), *(rng.randrange(len(records)) for _ in range(rng.randrange(4)))})
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        block = table(records[lo:hi], lo, dictionaries)
        admission = admit(state, block)
        assert admission.refused.tolist() == [r is not None for r in admission.reasons.to_pylist()]
        assert admission.limits.to_pylist() == [verdict_of(r) for r in admission.reasons.to_pylist()]
        # The series codes it hands on (for the windows): those of every record, whenever the series limit saw all.
        labels_refused = limits.labels_per_event and "labels_per_event" in admission.limits.to_pylist()
        if limits.series_per_metric and not labels_refused:
            assert np.array_equal(admission.series, series_codes(block.column("metric"), block.column("server")))
        else:
            assert admission.series is None
        got += [verdict_of(r) for r in admission.reasons.to_pylist()]
        assert admission.keys.schema.equals(KEYS)  # the state keeps plain strings
        state.add(admission.keys, hi)
    assert got == expected
    for kind, limit in ((SERIES, limits.series_per_metric), (VALUE, limits.values_per_label)):
        if limit:
            assert all(count <= limit for count in state.counts(kind).values())


def test_reason_names_the_limit_its_value_and_the_key():
    limits = CardinalityLimits.local(series_per_metric=4, values_per_label=2, labels_per_event=2, partitions=2)
    assert (limits.series_per_metric, limits.values_per_label, limits.labels_per_event) == (2, 1, 2)
    records = [
        {"metric": "cpu", "server": "a", "tags": {"req": "1"}},
        {"metric": "cpu", "server": "b", "tags": {"req": "1"}},
        {"metric": "cpu", "server": "c", "tags": None},
        {"metric": "cpu", "server": "a", "tags": {"req": "2"}},
        {"metric": "cpu", "server": "a", "tags": {"x": "1", "y": "1", "z": "1"}},
    ]
    admission = admit(LimitState(limits), table(records, 100))
    assert admission.reasons.to_pylist() == [
        None,
        None,
        "cardinality_limit: metric 'cpu' is at series_per_metric=2 per partition of 2 this hour; "
        "server 'c' would be a new series",
        "cardinality_limit: label 'req' is at values_per_label=1 per partition of 2 this hour; value '2' is new",
        "cardinality_limit: 3 labels, over labels_per_event=2",
    ]
    assert admission.refused_by == {"labels_per_event": 1, "series_per_metric": 1, "values_per_label": 1}
    keys = admission.keys.sort_by([("kind", "ascending"), ("key", "ascending")]).to_pylist()
    assert keys == [
        {"kind": "series", "group": "cpu", "key": "a", "first_offset": 100},
        {"kind": "series", "group": "cpu", "key": "b", "first_offset": 101},
        {"kind": "value", "group": "req", "key": "1", "first_offset": 100},
    ]


def test_as_of_cuts_the_state_back_to_an_offset():
    limits = CardinalityLimits(series_per_metric=2)
    records = [{"metric": "m", "server": s, "tags": None} for s in "abcab"]
    state = LimitState(limits)
    state.add(admit(state, table(records, 0)).keys, 5)
    assert state.counts(SERIES) == {"m": 2}
    earlier = state.as_of(1)
    assert earlier.keys.to_pylist() == [{"kind": "series", "group": "m", "key": "a", "first_offset": 0}]
    # From offset 1 on, the records are judged as they were the first time.
    assert admit(earlier, table(records[1:], 1)).refused.tolist() == [False, True, False, False]


def test_no_limits_admits_everything_and_keeps_no_keys():
    records = [{"metric": "m", "server": f"s{i}", "tags": {"t": str(i)}} for i in range(50)]
    admission = admit(LimitState(CardinalityLimits()), table(records, 0))
    assert not admission.refused.any()
    assert admission.keys.num_rows == 0
    assert np.array_equal(admission.refused, np.zeros(50, bool))
    assert KEYS.equals(admission.keys.schema)

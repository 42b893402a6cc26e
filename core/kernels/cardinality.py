"""Cardinality limits on valid events: which events a partition admits, in log order, and why it refuses the others.

Three limits, after Grafana Mimir's (``max_global_series_per_metric``,
``max_label_names_per_series``, and a cap on the values of one label name:
the per-label guard Mimir's cardinality analysis points operators to):

``labels_per_event``
    an event with more tags than this is refused (no state);
``series_per_metric``
    a *series* is a (metric, server) pair: the key of the windows, stored
    queries and last-seen tables (tags are attributes of events, limited by the
    next limit, not series dimensions). Per metric, the first ``n`` distinct
    series in log order are admitted; an event of a later series is refused;
``values_per_label``
    per tag name, the first ``n`` distinct values in log order are admitted; an
    event carrying a later value of that name is refused.

Limits are enforced per log partition and per *limit hour* (the UTC hour of
the record's append time), so the state is bounded, needs no coordination
between partitions, and starts afresh every hour (as Mimir's active series
expire). A global limit ``n`` becomes ``ceil(n / partitions)`` per partition,
as Mimir divides a tenant's global limit among its ingesters; events are
spread over partitions by a hash of the server, so a metric's series are
spread evenly. 0 disables a limit.

**Determinism.** Whether an event is admitted depends only on the records
before it in the same partition and hour and on the hour's limits: so a
replayed batch, a recompute or a run after a lost checkpoint refuses exactly
the same events, whatever the batch boundaries. The limits are evaluated
independently (an event refused by one still introduces its series or values
to the others), which keeps each a vectorised "first ``n`` distinct keys"
and the counts easy to state: a metric has at most ``n`` series per
partition and hour, a label at most ``n`` values.

:class:`LimitState` is one partition-hour's admitted keys; :func:`admit`
judges a block of records against it and returns the keys it admits.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.kernels.selectors import map_entries
from metrics_lake.core.kernels.windows import series_codes, string_codes
from metrics_lake.lake_schemas.contract import LIMIT_REASON_CODE

__all__ = [
    "KEYS",
    "LIMIT_HOUR_US",
    "REASON_CODE",
    "SERIES",
    "VALUE",
    "Admission",
    "CardinalityLimits",
    "LimitState",
    "admit",
    "limit_hours",
    "refused_per_limit",
    "top_label_values",
]

#: Reason code of an event over a limit (``cardinality_limit: <which limit, its value, the key>``).
REASON_CODE = LIMIT_REASON_CODE
#: The limit hour: records are judged against the keys of their partition and append hour.
LIMIT_HOUR_US = 3_600 * 1_000_000
#: The ``kind`` of an admitted key: a series (group = metric, key = server) or a tag value (group = tag name).
SERIES, VALUE = "series", "value"
#: An admitted key: its kind, group (metric or tag name), key (server or tag value) and the offset of its first
#: record in the partition hour.
KEYS = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("group", pa.string()),
        pa.field("key", pa.string()),
        pa.field("first_offset", pa.int64()),
    ]
)
_SEP = "\x1f"  # joins group and key into one string to look up (unit separator: in no metric or server name)
#: The distinct (group, key) pairs of a block, as :func:`_first_n` looks them up.
_PAIRS = pa.schema([("group", pa.string()), ("key", pa.string())])


@dataclass(frozen=True)
class CardinalityLimits:
    """The limits one partition enforces (0: off). ``partitions`` and the global values are kept for reasons.

    Build with :meth:`local`; :meth:`to_json`/:meth:`from_json` record them with a partition hour's state, so
    an hour is judged by the limits it started with (:mod:`metrics_lake.core.speed.cardinality_gate`).
    """

    series_per_metric: int = 0
    values_per_label: int = 0
    labels_per_event: int = 0
    partitions: int = 1

    @classmethod
    def local(cls, *, series_per_metric: int, values_per_label: int, labels_per_event: int, partitions: int):
        """Global limits (per topic) as one partition's share: ``ceil(limit / partitions)``, at least 1."""
        return cls(
            series_per_metric=_share(series_per_metric, partitions),
            values_per_label=_share(values_per_label, partitions),
            labels_per_event=labels_per_event,
            partitions=partitions,
        )

    @property
    def enabled(self) -> bool:
        """Whether any limit is on."""
        return bool(self.series_per_metric or self.values_per_label or self.labels_per_event)

    def to_json(self) -> str:
        """The limits as JSON text."""
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CardinalityLimits:
        """Limits from :meth:`to_json` text."""
        return cls(**json.loads(text))

    def shown(self, value: int) -> str:
        """A local limit as reasons show it: ``37500 per partition of 4``."""
        return f"{value} per partition of {self.partitions}" if self.partitions > 1 else str(value)


def _share(limit: int, partitions: int) -> int:
    return 0 if limit <= 0 else max(1, math.ceil(limit / partitions))


@dataclass
class LimitState:
    """The keys one partition admitted in one limit hour (:data:`KEYS` rows), with the hour's limits.

    ``covered_to``: the state holds every key first seen before this offset
    (exclusive). Grows by :meth:`add`; :meth:`as_of` cuts it back to an
    earlier offset (a replayed range).
    """

    limits: CardinalityLimits
    keys: pa.Table = field(default_factory=KEYS.empty_table)
    covered_to: int = 0

    def __post_init__(self) -> None:
        self._lookup: dict[str, pa.Array] = {}
        self._counts: dict[str, dict[str, int]] = {}

    def add(self, keys: pa.Table, covered_to: int) -> None:
        """Take ``keys`` (admitted by :func:`admit` on the records up to ``covered_to``) into the state."""
        if keys.num_rows:
            self.keys = pa.concat_tables([self.keys, keys.select(KEYS.names).cast(KEYS)])
            self._lookup, self._counts = {}, {}
        self.covered_to = covered_to

    def as_of(self, offset: int) -> LimitState:
        """The state as it was before ``offset`` (``<= covered_to``): the keys first seen before it."""
        if offset >= self.covered_to:
            return self
        earlier = self.keys.filter(pc.less(self.keys.column("first_offset"), offset))
        return LimitState(self.limits, earlier, offset)

    def lookup(self, kind: str) -> pa.Array:
        """The admitted keys of ``kind`` as ``group<US>key`` strings (a set to look rows up in)."""
        if kind not in self._lookup:
            rows = self.keys.filter(pc.equal(self.keys.column("kind"), kind))
            joined = pc.binary_join_element_wise(rows.column("group"), rows.column("key"), _SEP)
            self._lookup[kind] = joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined
        return self._lookup[kind]

    def counts(self, kind: str) -> dict[str, int]:
        """Admitted keys of ``kind`` per group."""
        if kind not in self._counts:
            rows = self.keys.filter(pc.equal(self.keys.column("kind"), kind))
            counted = rows.group_by("group").aggregate([("key", "count")])
            self._counts[kind] = dict(
                zip(counted.column("group").to_pylist(), counted.column("key_count").to_pylist(), strict=True)
            )
        return self._counts[kind]


@dataclass(frozen=True)
class Admission:
    """What :func:`admit` decided for a block of records: ``refused`` (bool per record), ``reasons`` (string per
    record, null where admitted), ``limits`` (the name of the limit that refused each record, null where admitted)
    and the :data:`KEYS` it admits (new to the state); ``series``: the records'
    :func:`~metrics_lake.core.kernels.windows.series_codes` (int64 per record), when the series limit computed
    them for every record, else None."""

    refused: np.ndarray
    reasons: pa.Array
    limits: pa.Array
    keys: pa.Table
    series: np.ndarray | None = None

    @property
    def refused_by(self) -> dict[str, int]:
        """Refused records per limit name."""
        return refused_per_limit(self.limits)


def refused_per_limit(limits: pa.Array | pa.ChunkedArray) -> dict[str, int]:
    """Count a ``limits`` array (limit name per record, null where admitted) per limit name."""
    counted = pc.value_counts(pc.drop_null(limits)).to_pylist()
    return {entry["values"]: entry["counts"] for entry in counted}


def limit_hours(ingested_at: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The limit hour (epoch µs of the hour's start, int64) of each record from its append time (a timestamp)."""
    us = pc.cast(pc.cast(ingested_at, pa.timestamp("us", "UTC")), pa.int64()).to_numpy(zero_copy_only=False)
    return us - np.mod(us, LIMIT_HOUR_US)


def admit(state: LimitState, records: pa.Table) -> Admission:
    """Judge ``records`` (valid events of one partition and limit hour, in offset order, all at or after
    ``state.covered_to``: columns ``offset`` int64, ``metric``, ``server`` string, ``tags`` map<string, string>)
    against ``state`` and each other; returns the :class:`Admission`. Does not change ``state``.

    Vectorised: per limit, the records' keys not in the state are ranked per
    group by their first offset, and the first ``limit - admitted`` of each
    group are admitted (see the module docstring for the rules).
    """
    n = records.num_rows
    limits = state.limits
    offsets = records.column("offset").to_numpy(zero_copy_only=False)
    refusals = _Refusals(n)
    new_keys = [KEYS.empty_table()]
    candidate = np.ones(n, bool)
    series = None
    # The (name, value) pairs of the records' tags, each with its record: read once for both tag limits.
    parents, names, values = map_entries(records.column("tags"))
    if limits.labels_per_event and n:
        count = np.bincount(parents, minlength=n)
        over = count > limits.labels_per_event
        if over.any():
            reasons = [
                f"{REASON_CODE}: {c} labels, over labels_per_event={limits.labels_per_event}" for c in count[over]
            ]
            refusals.refuse(np.flatnonzero(over), reasons, "labels_per_event")
            candidate = ~over
    if limits.series_per_metric and n:
        rows = np.flatnonzero(candidate)
        kept = records if len(rows) == n else records.take(pa.array(rows))  # no copy in the usual case
        codes = series_codes(kept.column("metric"), kept.column("server"))
        series = codes if len(rows) == n else None
        over, keys = _first_n(
            state, SERIES, kept.column("metric"), kept.column("server"), codes, offsets[rows], limits.series_per_metric
        )
        _refuse_series(refusals, rows, over, kept, limits)
        new_keys.append(keys)
    if limits.values_per_label and n:
        if not candidate.all():  # the pairs of records the labels limit refused do not count
            keep = candidate[parents]
            parents, names, values = parents[keep], names.filter(pa.array(keep)), values.filter(pa.array(keep))
        if len(parents):
            codes = string_codes(names) << 32 | string_codes(values)
            over_pairs, keys = _first_n(state, VALUE, names, values, codes, offsets[parents], limits.values_per_label)
            # A record is refused for its first new value over the limit.
            over_at = np.flatnonzero(over_pairs)
            refused_rows, first = np.unique(parents[over_at], return_index=True)
            pairs = over_at[first]
            fresh = ~refusals.refused[refused_rows]
            refused_rows, pairs = refused_rows[fresh], pairs[fresh]
            if len(refused_rows):
                shown = limits.shown(limits.values_per_label)
                reasons = [
                    f"{REASON_CODE}: label {name!r} is at values_per_label={shown} this hour; value {value!r} is new"
                    for name, value in zip(
                        names.take(pa.array(pairs)).to_pylist(), values.take(pa.array(pairs)).to_pylist(), strict=True
                    )
                ]
                refusals.refuse(refused_rows, reasons, "values_per_label")
            new_keys.append(keys)
    return Admission(refusals.refused, *refusals.arrays(), pa.concat_tables(new_keys), series)


class _Refusals:
    """Which records of a block are refused, with each one's reason and limit name, in arrays made at the first
    refusal: most blocks have none, and object arrays of a million ``None`` cost more than the limits' checks."""

    def __init__(self, n: int) -> None:
        self.refused = np.zeros(n, bool)
        self._reasons: np.ndarray | None = None
        self._limits: np.ndarray | None = None

    def refuse(self, rows: np.ndarray, reasons: list[str], limit: str) -> None:
        """Refuse the records ``rows`` (none refused yet) for ``reasons`` (one per record) by the limit named ``limit``."""
        if self._reasons is None or self._limits is None:
            self._reasons = np.full(len(self.refused), None, dtype=object)
            self._limits = np.full(len(self.refused), None, dtype=object)
        self._reasons[rows] = reasons
        self._limits[rows] = limit
        self.refused[rows] = True

    def arrays(self) -> tuple[pa.Array, pa.Array]:
        """(reason, limit name) string arrays, one per record, null where admitted."""
        if self._reasons is None or self._limits is None:
            return pa.nulls(len(self.refused), pa.string()), pa.nulls(len(self.refused), pa.string())
        return pa.array(self._reasons, pa.string()), pa.array(self._limits, pa.string())


def _refuse_series(refusals: _Refusals, rows: np.ndarray, over: np.ndarray, kept: pa.Table, limits) -> None:
    """Refuse the records ``rows[over]`` (indexes into the block; ``kept`` holds ``rows``' records) for the series
    limit, unless an earlier limit refused them already."""
    picked = np.flatnonzero(over)
    picked = picked[~refusals.refused[rows[picked]]]
    if not len(picked):
        return
    metrics = kept.column("metric").take(pa.array(picked)).to_pylist()
    servers = kept.column("server").take(pa.array(picked)).to_pylist()
    reasons = [
        f"{REASON_CODE}: metric {m!r} is at series_per_metric={limits.shown(limits.series_per_metric)} "
        f"this hour; server {s!r} would be a new series"
        for m, s in zip(metrics, servers, strict=True)
    ]
    refusals.refuse(rows[picked], reasons, "series_per_metric")


def _rank_within(groups: np.ndarray) -> np.ndarray:
    """Each row's position (0, 1, …) among the rows of its group; ``groups`` sorted so that a group's rows are
    adjacent."""
    if not len(groups):
        return np.zeros(0, np.int64)
    starts = np.r_[0, np.flatnonzero(groups[1:] != groups[:-1]) + 1]
    return np.arange(len(groups)) - np.repeat(starts, np.diff(np.r_[starts, len(groups)]))


def _first_n(state: LimitState, kind: str, groups, keys, pair_codes: np.ndarray, offsets: np.ndarray, limit: int):
    """Per ``groups`` value, admit the first keys (by first offset) not yet in ``state`` while the group has fewer
    than ``limit``; returns (bool per input row: its key is new and not admitted, the admitted new :data:`KEYS`).
    ``pair_codes``: an int64 code per row of its (group, key) pair (equal pairs, equal codes).

    Works on the distinct (group, key) pairs: a block of a million events holds a few thousand series, so the
    strings are joined and looked up once per pair, not once per row.
    """
    if not len(offsets):
        return np.zeros(0, bool), KEYS.empty_table()
    # Codes in order of first appearance: rows are in offset order, so a pair's first row is its first offset.
    encoded = pc.dictionary_encode(pa.array(pair_codes))
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    # A pair's first row is where its code first appears: where the running maximum code grows.
    running = np.maximum.accumulate(codes)
    first_rows = np.flatnonzero(np.r_[True, running[1:] > running[:-1]])
    # Plain strings (the records' may be dictionaries, read so from the log) to join, sort and keep in the state.
    taken = {"group": pc.take(groups, pa.array(first_rows)), "key": pc.take(keys, pa.array(first_rows))}
    pairs = pa.table(taken).cast(_PAIRS)
    joined = pc.binary_join_element_wise(pairs.column("group"), pairs.column("key"), _SEP)
    fresh = np.flatnonzero(~pc.is_in(joined, value_set=state.lookup(kind)).to_numpy(zero_copy_only=False))
    if not len(fresh):
        return np.zeros(len(codes), bool), KEYS.empty_table()
    firsts = pairs.take(pa.array(fresh))
    order = pc.sort_indices(firsts, [("group", "ascending")]).to_numpy()  # stable: first offsets stay in order
    group = firsts.column("group").take(pa.array(order)).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    counts = state.counts(kind)
    room = np.repeat(
        np.array([limit - counts.get(group[i], 0) for i in starts], np.int64), np.diff(np.r_[starts, len(group)])
    )
    admitted = np.zeros(len(fresh), bool)
    admitted[order] = _rank_within(group) < room
    refused_pair = np.zeros(len(first_rows), bool)  # pairs the state holds are admitted
    refused_pair[fresh] = ~admitted
    chosen = np.flatnonzero(admitted)
    admitted_keys = pa.table(
        {
            "kind": pa.array([kind] * len(chosen), pa.string()),
            "group": firsts.column("group").take(pa.array(chosen)),
            "key": firsts.column("key").take(pa.array(chosen)),
            "first_offset": pa.array(offsets[first_rows[fresh[chosen]]], pa.int64()),
        },
        schema=KEYS,
    )
    return refused_pair[codes], admitted_keys


def top_label_values(series: pa.Table, top: int) -> pa.Table:
    """Per label name, the ``top`` values carried by the most series: ``series`` has one row per series with a
    ``labels`` map<string, string>; returns columns ``label``, ``value`` (string) and ``series`` (int64: series
    carrying it) plus ``values`` (int64: distinct values of the label), ordered by label, then series descending.
    A series without a label is not counted for it (Prometheus's ``count by (label)`` drops it too)."""
    _, names, values = map_entries(series.column("labels"))
    pairs = pa.table({"label": names, "value": values})
    counted = pairs.group_by(["label", "value"], use_threads=False).aggregate([("value", "count")])
    distinct = counted.group_by("label", use_threads=False).aggregate([("value", "count")])
    counted = counted.rename_columns(["label", "value", "series"]).sort_by(
        [("label", "ascending"), ("series", "descending"), ("value", "ascending")]
    )
    kept = counted.filter(pa.array(_rank_within(counted.column("label").to_numpy(zero_copy_only=False)) < top))
    per_label = dict(zip(distinct.column("label").to_pylist(), distinct.column("value_count").to_pylist(), strict=True))
    values = pa.array([per_label[name] for name in kept.column("label").to_pylist()], pa.int64())
    return kept.append_column("values", values).cast(
        pa.schema([("label", pa.string()), ("value", pa.string()), ("series", pa.int64()), ("values", pa.int64())])
    )

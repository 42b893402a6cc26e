"""The series a decoder has seen, each decoded, checked and converted to Arrow once, then named by an id.

Prometheus sends the same series with every scrape interval's samples, so a
remote-write request's label sets are almost all ones an earlier request
had. Decoding a label set, checking its names against the event contract
and converting server, metric and tags to Arrow took about two thirds of a
request's decode when each request did it again (2,000 series of one sample
each: 8.1 ms per request, 4.6 ms of them in the per-series loop and 2.6 ms
building the records; ``bench/protocol_decode.py``). With a catalog a
request looks each label set up by its encoded bytes, collects ids, and its
records take their server, metric and tags columns from the catalog's
arrays by id (:meth:`~metrics_lake.app.gateway.protocols.points.PointsBuilder.records`).

A catalog only grows; :class:`RecentSeries` replaces it with an empty one past
:data:`SERIES_CACHE` series: a request keeps the catalog it started with, so
ids never change under it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.app.gateway.protocols.points import SeriesKey, series_ok, tags_array
from metrics_lake.lake_schemas.types import TAGS

__all__ = ["SERIES_CACHE", "RecentSeries", "SeriesCatalog", "SeriesColumns", "joined_lists", "length_prefixed"]

#: Series a catalog holds before requests start on a new one (Prometheus and OTLP senders resend the same series).
SERIES_CACHE = 100_000

#: Conversions kept as separate chunks before they are combined into one (each combine copies the arrays).
MAX_CHUNKS = 16

SeriesColumns = tuple[pa.ChunkedArray, pa.ChunkedArray, pa.ChunkedArray, np.ndarray]
"""Every series of a catalog by id: servers (string), metrics (string), tags (TAGS), and whether the names pass
the contract (numpy bool)."""


class SeriesCatalog:
    """Series (server, metric, tags) by id, converted to Arrow once; thread-safe.

    :meth:`id_of` assigns ids in order of first sight, :meth:`columns` gives
    every series' columns indexed by id, :meth:`series` one series as Python
    values. A series is converted to Arrow by the first :meth:`columns` call
    after it was added, together with every other series added since.
    """

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}
        self._added: list[SeriesKey] = []  # not converted yet, in id order after the converted ones
        self._converted = 0
        self._lock = threading.Lock()
        empty = pa.chunked_array([], pa.string())
        self._columns: SeriesColumns = (empty, empty, pa.chunked_array([], TAGS), np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self._ids)

    def id_of(self, key: Hashable, make: Callable[[Hashable], SeriesKey]) -> int:
        """The id of the series cached under ``key``; ``make(key)`` gives its (server, metric, tags) the first time.

        What ``make`` raises propagates and nothing is added (a label set that does not decode).
        """
        found = self._ids.get(key)  # without the lock: a dict read is atomic, and ids are never reassigned
        if found is not None:
            return found
        series = make(key)
        with self._lock:
            found = self._ids.get(key)
            if found is None:
                found = self._ids[key] = self._converted + len(self._added)
                self._added.append(series)
        return found

    def ids_of(self, keys: list[Hashable], make: Callable[[int], SeriesKey]) -> np.ndarray:
        """The ids of the series cached under ``keys`` (int64, in their order); ``make(i)`` gives the (server,
        metric, tags) of ``keys[i]`` the first time. One dictionary lookup per key, in C, where :meth:`id_of` is a
        Python call per series; what ``make`` raises propagates (the series before it stay added)."""
        found = list(map(self._ids.get, keys))
        if None in found:
            for at, series_id in enumerate(found):
                if series_id is None:
                    found[at] = self.id_of(keys[at], lambda _key, at=at: make(at))
        return np.array(found, dtype=np.int64)

    def columns(self) -> SeriesColumns:
        """Every series added so far, by id (see :data:`SeriesColumns`)."""
        with self._lock:
            if not self._added and self._columns[0].num_chunks > 1:
                # Nothing new since the last call: the senders' series are known. Combine the chunks once, so that
                # every request from now on takes from plain arrays (32,000 series in 16 chunks: 1.99 ms a
                # request's decode, 1.5 in one; bench/protocol_decode.py-like loop, 2026-11-29).
                self._columns = (*(pa.chunked_array([c.combine_chunks()]) for c in self._columns[:3]), self._columns[3])
            if self._added:
                servers, metrics, tags = zip(*self._added, strict=True)
                new_servers, new_metrics = pa.array(servers, pa.string()), pa.array(metrics, pa.string())
                old_servers, old_metrics, old_tags, old_ok = self._columns
                self._columns = (
                    _appended(old_servers, new_servers),
                    _appended(old_metrics, new_metrics),
                    _appended(old_tags, tags_array(tags)),
                    np.concatenate([old_ok, series_ok(new_servers, new_metrics)]),
                )
                self._converted += len(self._added)
                self._added = []
            return self._columns

    def series(self, series_id: int) -> SeriesKey:
        """(server, metric, tags) of ``series_id`` as Python values; tags as (key, value) pairs."""
        servers, metrics, tags, _ = self.columns()
        pairs = tags[series_id].as_py()
        return servers[series_id].as_py(), metrics[series_id].as_py(), tuple(pairs or ())


def _appended(chunks: pa.ChunkedArray, new: pa.Array) -> pa.ChunkedArray:
    """``chunks`` with ``new`` after them, combined into one chunk once there are :data:`MAX_CHUNKS`."""
    appended = pa.chunked_array([*chunks.chunks, new], new.type)
    return pa.chunked_array([appended.combine_chunks()]) if appended.num_chunks > MAX_CHUNKS else appended


class RecentSeries:
    """The catalog a decoder's requests start on, replaced by an empty one once it holds ``limit`` series (default
    :data:`SERIES_CACHE`); thread-safe. Memory: about ``limit`` series' keys and Arrow columns."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = SERIES_CACHE if limit is None else limit
        self._catalog = SeriesCatalog()
        self._lock = threading.Lock()

    def catalog(self) -> SeriesCatalog:
        """The catalog for a new request (requests under way keep theirs)."""
        with self._lock:
            if len(self._catalog) >= self.limit:
                self._catalog = SeriesCatalog()
            return self._catalog


def length_prefixed(values: pa.Array) -> pa.Array:
    """Each of ``values`` (binary or string) as binary preceded by its length (4 bytes, big endian): keys built by
    concatenating such parts are equal exactly when the parts are (a part may hold any byte, so no separator
    would do)."""
    values = values.cast(pa.binary())
    lengths = pc.binary_length(values).to_numpy(zero_copy_only=False).astype(">u4")
    prefixes = pa.FixedSizeBinaryArray.from_buffers(pa.binary(4), len(values), [None, pa.py_buffer(lengths.tobytes())])
    return pc.binary_join_element_wise(prefixes.cast(pa.binary()), values, pa.scalar(b"", pa.binary()))


def joined_lists(lists: pa.ListArray) -> pa.Array:
    """Per list of ``lists`` (of binary), its items :func:`length_prefixed` and concatenated (binary)."""
    offsets = pc.subtract(lists.offsets, lists.offsets[0])
    prefixed = length_prefixed(pc.list_flatten(lists))
    return pc.binary_join(pa.ListArray.from_arrays(offsets, prefixed), pa.scalar(b"", pa.binary()))

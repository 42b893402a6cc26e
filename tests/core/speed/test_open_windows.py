"""A stream's memory of stored queries' merged minutes (OpenWindows.merged_minutes): reused exactly when the files
covering a minute (by their window_start statistics) are the same, merged again otherwise from those files' rows
alone, and always equal to merging every minute anew."""

from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.kernels.stored_queries import parse_query, window_span, window_states
from metrics_lake.core.kernels.windows import aggregate_events, merge_states
from metrics_lake.core.speed import open_windows as module
from metrics_lake.core.speed.open_windows import OpenWindows, minute_files
from metrics_lake.core.tables.snapshots import DataFile
from metrics_lake.lake_schemas.tables import METRIC_WINDOWS_1M

START_MS = 1_763_600_000_000 - 1_763_600_000_000 % 3_600_000  # an hour's start
MINUTE_US = 60_000_000


def windows_of(seconds: int, seed: int) -> pa.Table:
    """1-minute window rows of a small fleet (4 servers, 2 metrics), one minute per 60 s of ``seconds``."""
    events = FleetSimulator(servers=4, metrics=2, seconds=seconds, rate=1.0, seed=seed, start_ms=START_MS).generate()
    states = aggregate_events(events.filter(pc.is_null(events.column("reason"))), 60)
    return states.select([n for n in states.column_names if n in METRIC_WINDOWS_1M.names])


def minute_rows(windows: pa.Table, *minutes: int) -> pa.Table:
    start = pc.cast(windows.column("window_start"), pa.int64())
    wanted = pa.array([START_MS * 1000 + m * MINUTE_US for m in minutes], pa.int64())
    return windows.filter(pc.is_in(start, wanted))


@pytest.fixture
def merged(monkeypatch) -> list[list[int]]:
    """The minutes (index in the hour) of every merge_minutes call OpenWindows makes."""
    calls: list[list[int]] = []
    real = module.merge_minutes

    def spy(rows: pa.Table) -> pa.Table:
        starts = pc.unique(pc.cast(rows.column("window_start"), pa.int64())).to_pylist()
        calls.append(sorted((s - START_MS * 1000) // MINUTE_US for s in starts))
        return real(rows)

    monkeypatch.setattr(module, "merge_minutes", spy)
    return calls


def data_file(path: str, rows: pa.Table, window_starts: tuple[int, int] | None = None) -> DataFile:
    """A file named ``path`` holding ``rows``, its statistics ``window_starts`` (default: those of its rows)."""
    if window_starts is None and rows.num_rows:
        start = pc.cast(rows.column("window_start"), pa.int64())
        window_starts = (pc.min(start).as_py(), pc.max(start).as_py())
    return DataFile(path, path, 0, (), rows.num_rows, window_starts)


def evaluate(kept: OpenWindows, query, selections: dict[str, pa.Table], **stats) -> pa.Table:
    """The query's states for its window over the hour, through the memo and given only the rows of the files
    covering a stale minute, checked against merging every minute of every file anew. ``stats``: file -> statistics
    other than its rows'."""
    starts = np.array([START_MS * 1000], np.int64)
    files = [data_file(path, rows, stats.get(path)) for path, rows in selections.items()]
    coverage = minute_files(files, *window_span(query, starts))
    needed = {path for at in kept.stale_minutes(query, coverage) for path in coverage[at]}
    given = pa.concat_tables([rows for path, rows in selections.items() if path in needed] or [empty()])
    through_memo = window_states(given, query, starts, partial(kept.merged_minutes, coverage=coverage))
    anew = window_states(pa.concat_tables(selections.values()), query, starts)
    assert through_memo.equals(anew)
    assert anew.num_rows > 0 or all(rows.num_rows == 0 for rows in selections.values())
    return through_memo


def empty() -> pa.Table:
    return windows_of(60, seed=1).slice(0, 0)


def test_only_minutes_whose_files_changed_are_merged_again(merged):
    query = parse_query("fleet_cpu", "FROM * SELECT host.cpu.utilization WINDOW 1h COMPUTE avg, max, percentile(99)")
    windows = windows_of(240, seed=3)  # minutes 0-3
    kept = OpenWindows()
    evaluate(kept, query, {"sealed-a": minute_rows(windows, 0, 1), "open-2": minute_rows(windows, 2)})
    assert merged == [[0, 1, 2]]
    # The next batch: minute 2 sealed into a new file, minute 3 open; minutes 0 and 1 still from the same file.
    sealed = {"sealed-a": minute_rows(windows, 0, 1), "sealed-b": minute_rows(windows, 2)}
    evaluate(kept, query, {**sealed, "open-3": minute_rows(windows, 3)})
    assert merged[1:] == [[2, 3]]
    evaluate(kept, query, {**sealed, "open-3": minute_rows(windows, 3)})  # nothing changed: nothing merged
    assert merged[2:] == []
    # A compaction rewrites minutes 0-2 into one file (rows unchanged): merged again, the same states.
    evaluate(kept, query, {"compacted": minute_rows(windows, 0, 1, 2), "open-3": minute_rows(windows, 3)})
    assert merged[2:] == [[0, 1, 2]]
    # A file that joins a minute's files (another shard of minute 3, with other rows) merges that minute again.
    other = windows_of(240, seed=4)
    evaluate(
        kept,
        query,
        {"compacted": minute_rows(windows, 0, 1, 2), "open-3": minute_rows(windows, 3), "shard": minute_rows(other, 3)},
    )
    assert merged[3:] == [[3]]


def test_an_edited_query_or_another_query_merges_anew_and_without_coverage_nothing_is_kept(merged):
    query = parse_query("fleet_cpu", "FROM * SELECT host.cpu.utilization WINDOW 1h COMPUTE max")
    windows = windows_of(180, seed=5)
    selections = {"a": minute_rows(windows, 0, 1), "b": minute_rows(windows, 2)}
    kept = OpenWindows()
    evaluate(kept, query, selections)
    edited = dataclasses.replace(query, revision=query.revision + 1)
    evaluate(kept, edited, selections)
    grouped = parse_query("cpu_by_region", "FROM * SELECT host.cpu.utilization WINDOW 1h COMPUTE max BY region")
    evaluate(kept, grouped, selections)
    assert merged == [[0, 1, 2]] * 3
    evaluate(kept, grouped, selections)  # a BY query's groups per minute are kept like the fleet's
    assert len(merged) == 3
    starts = [START_MS * 1000]
    plain = pa.concat_tables(selections.values())  # no coverage: the kernel's own merge, nothing kept
    assert window_states(plain, query, starts, kept.merged_minutes).equals(window_states(plain, query, starts))
    assert len(merged) == 3
    # A file whose statistics cover minute 50 without rows of it: the minute is merged from nothing, no state.
    assert (
        evaluate(kept, query, {"a": minute_rows(windows, 50)}, a=(START_MS * 1000 + 50 * MINUTE_US,) * 2).num_rows == 0
    )
    assert len(merged) == 3


def test_forgetting_the_queries_the_registry_no_longer_holds_keeps_the_others_minutes(merged):
    fleet = parse_query("fleet_cpu", "FROM * SELECT host.cpu.utilization WINDOW 1h COMPUTE max")
    grouped = parse_query("cpu_by_region", "FROM * SELECT host.cpu.utilization WINDOW 1h COMPUTE max BY region")
    windows = windows_of(120, seed=6)
    selections = {"a": minute_rows(windows, 0), "b": minute_rows(windows, 1)}
    kept = OpenWindows()
    evaluate(kept, fleet, selections)
    evaluate(kept, grouped, selections)
    assert kept.queries == ["cpu_by_region", "fleet_cpu"] and len(merged) == 2
    kept.forget_queries_except(["fleet_cpu", "not_merged_yet"])
    assert kept.queries == ["fleet_cpu"]
    evaluate(kept, fleet, selections)  # still kept: nothing merged
    evaluate(kept, grouped, selections)  # forgotten: merged anew
    assert merged == [[0, 1]] * 3


def test_a_minute_is_covered_by_every_file_whose_statistics_hold_it_and_by_files_without_statistics():
    hour = START_MS * 1000
    at = [hour + m * MINUTE_US for m in range(6)]
    files = [
        data_file("early", empty(), (at[0] - 5 * MINUTE_US, at[1])),  # starts before the span: clipped to it
        data_file("middle", empty(), (at[1], at[3])),
        data_file("later", empty(), (at[5] + MINUTE_US, at[5] + 9 * MINUTE_US)),  # after the span: covers nothing
        data_file("unknown", empty(), None),  # no statistics: every minute of the span
    ]
    coverage = minute_files(files, at[0], at[5] + MINUTE_US)
    assert coverage == {
        at[0]: {"early", "unknown"},
        at[1]: {"early", "middle", "unknown"},
        at[2]: {"middle", "unknown"},
        at[3]: {"middle", "unknown"},
        at[4]: {"unknown"},
        at[5]: {"unknown"},
    }
    assert minute_files(files[:3], at[4], at[5]) == {}


def evaluate_per_server(kept: OpenWindows, query, selections: dict[str, pa.Table], window: int = 0) -> pa.Table:
    """A PER SERVER query's states for its window starting ``window`` minutes into the hour, through the memo of
    settled minutes, checked against merging every minute anew: the same states once merged, to the last bit."""
    starts = np.array([START_MS * 1000 + window * MINUTE_US], np.int64)
    files = [data_file(path, rows) for path, rows in selections.items()]
    coverage = minute_files(files, *window_span(query, starts))
    rows = pa.concat_tables(selections.values())
    memo = partial(kept.merged_minutes, coverage=coverage), partial(kept.settled_minutes, coverage=coverage)
    through_memo = window_states(rows, query, starts, *memo)
    anew = window_states(rows, query, starts)
    assert merge_states(through_memo).equals(merge_states(anew))
    return through_memo


def server_rows(states: pa.Table) -> int:
    """States of single servers (not the fleet's row) handed to the window merge."""
    return states.num_rows - states.column("server").null_count


def test_a_per_server_window_merges_its_settled_minutes_once_and_anew_when_their_files_change():
    query = parse_query("server_cpu_15m", "FROM * SELECT host.cpu.utilization WINDOW 15m COMPUTE avg, max PER SERVER")
    windows, late = windows_of(17 * 60, seed=7), windows_of(17 * 60, seed=8)  # minutes 0-16, 4 servers
    files = {f"m{m}": minute_rows(windows, m) for m in range(17)}

    def through(last: int, **rewritten: pa.Table) -> dict[str, pa.Table]:
        """Files of minutes 0 to ``last``; a rewritten minute's file under a new name (a file never changes)."""
        kept = {f"m{m}": files[f"m{m}"] for m in range(last + 1) if f"m{m}" not in rewritten}
        return {**kept, **{f"{name}-rewritten": rows for name, rows in rewritten.items()}}

    kept = OpenWindows()
    assert server_rows(evaluate_per_server(kept, query, through(1))) == 4 * 2  # nothing settled yet
    assert server_rows(evaluate_per_server(kept, query, through(4))) == 4 * (1 + 2)  # minutes 0-2 settled
    assert server_rows(evaluate_per_server(kept, query, through(5))) == 4 * (1 + 2)  # minute 3 joins them
    assert server_rows(evaluate_per_server(kept, query, through(5))) == 4 * (1 + 2)  # nothing new
    # A late event rewrites settled minute 1 (other values): every minute merged anew, settled again.
    assert server_rows(evaluate_per_server(kept, query, through(5, m1=minute_rows(late, 1)))) == 4 * (1 + 2)
    assert server_rows(evaluate_per_server(kept, query, through(6, m1=minute_rows(late, 1)))) == 4 * (1 + 2)
    # A compaction rewrites minutes 0-4 into one file, the same rows: merged anew, the same states.
    compacted = {"compacted": minute_rows(windows, 0, 1, 2, 3, 4), **{f"m{m}": files[f"m{m}"] for m in (5, 6, 7)}}
    assert server_rows(evaluate_per_server(kept, query, compacted)) == 4 * (1 + 2)
    # The next window: the first one's minutes are no longer kept.
    assert server_rows(evaluate_per_server(kept, query, through(16), window=15)) == 4 * 2
    assert kept.queries == ["server_cpu_15m"]
    kept.forget_queries_except([])
    assert kept.queries == []


def test_a_hopping_per_server_window_or_one_without_coverage_merges_every_minute():
    hopping = parse_query(
        "server_cpu_hop", "FROM * SELECT host.cpu.utilization WINDOW 15m EVERY 5m COMPUTE max PER SERVER"
    )
    windows = windows_of(6 * 60, seed=9)
    selections = {f"m{m}": minute_rows(windows, m) for m in range(6)}
    kept = OpenWindows()
    for _ in range(2):
        assert server_rows(evaluate_per_server(kept, hopping, selections)) == 4 * 6
    tumbling = dataclasses.replace(hopping, slide_s=hopping.duration_s)
    rows = pa.concat_tables(selections.values())
    starts = [START_MS * 1000]
    assert window_states(rows, tumbling, starts, settle=kept.settled_minutes).equals(
        window_states(rows, tumbling, starts)
    )  # no coverage: nothing kept
    assert kept.queries == ["server_cpu_hop"]  # its fleet row's minutes only

"""The speed layer's alert step: last_seen, threshold and absence alerts from committed tables, exactly once."""

from __future__ import annotations

import time
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import metrics_lake.core.speed.micro_batch as speed_layer
from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.kernels.alert_rules import parse_rule
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed import chunk_processing
from metrics_lake.core.speed.alerting import SEEN, AlertLog, AlertOptions, forget_alert_logs, seen_rows
from metrics_lake.core.speed.progress import CONSUMER, starting_offsets
from metrics_lake.core.speed.table_commits.alerts import AlertsCommit
from metrics_lake.core.tables.commits import committed_offsets
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.tables import BRONZE_EVENTS, Table
from tests.helpers import expected_windows

TOPIC = "metrics"
#: A fresh event time per run: absence uses append times (now), thresholds event times; both must be recent.
NOW_MS = int(time.time() * 1000) // 60_000 * 60_000 - 10 * 60_000


def produce(log, events: pa.Table) -> None:
    with Producer(log, TOPIC, partitions=2) as producer:
        producer.send(events)


def batch(store, log, *, queries, rules, **options):
    return speed_layer.run_batch_in_process(
        store,
        TOPIC,
        end_offsets(log, TOPIC),
        watermark_seconds=60,
        clock_skew_seconds=300,
        queries=queries,
        rules=rules,
        **options,
    )


def transitions(store) -> list[tuple]:
    rows = (
        open_table(store, Table.ALERTS).to_pyarrow_table().sort_by([("recorded_at", "ascending"), ("seq", "ascending")])
    )
    return [(r["rule"], r["server"], r["previous_state"], r["state"]) for r in rows.to_pylist()]


def sim(servers: int, seed: int, start_ms: int, seconds: int = 60) -> pa.Table:
    return FleetSimulator(servers=servers, metrics=2, seconds=seconds, seed=seed, start_ms=start_ms).generate()


def test_seen_rows_hold_each_servers_and_watched_series_newest_times_from_plain_or_dictionary_strings(log):
    produce(log, FleetSimulator(servers=12, metrics=3, seconds=40, seed=4, start_ms=NOW_MS).generate())
    with Producer(log, TOPIC, partitions=2) as producer:  # a second segment: another dictionary, newer times
        producer.send(FleetSimulator(servers=6, metrics=3, seconds=10, seed=5, start_ms=NOW_MS + 60_000).generate())
    end = end_offsets(log, TOPIC)[0]
    coded = pa.concat_tables(
        [
            chunk_processing.split_log_rows(read_range(log, TOPIC, 0, lo, hi, dictionaries=True))[0]
            for lo, hi in ((0, 9), (9, end))
        ]
    )
    plain = coded.cast(BRONZE_EVENTS)
    metrics = sorted(set(plain.column("metric").to_pylist()))
    watched = (metrics[0], metrics[2], "not.sent")
    servers = set(plain.column("server").to_pylist())
    assert len(servers) >= 3 and coded.column("server").num_chunks >= 2  # a dictionary per segment read

    def independent(rows: pa.Table, watched: tuple[str, ...]) -> dict[tuple, tuple]:
        newest: dict[tuple, tuple] = {}
        for row in rows.select(["server", "metric", "ingested_at", "ts"]).to_pylist():
            for key in [(row["server"], None)] + [(row["server"], row["metric"])] * (row["metric"] in watched):
                seen, event = newest.get(key, (row["ingested_at"], row["ts"]))
                newest[key] = (max(seen, row["ingested_at"]), max(event, row["ts"]))
        return newest

    def as_dict(rows: pa.Table) -> dict[tuple, tuple]:
        assert rows.schema == SEEN
        keyed = {(r["server"], r["metric"]): (r["last_seen_at"], r["last_event_at"]) for r in rows.to_pylist()}
        assert len(keyed) == rows.num_rows  # one row per series
        return keyed

    for chosen in (watched, ()):
        want = independent(plain, chosen)
        assert {server for server, _ in want} == servers and len(want) == len(servers) * (1 + 2 * bool(chosen))
        assert as_dict(seen_rows(coded, chosen)) == as_dict(seen_rows(plain, chosen)) == want
    assert seen_rows(plain.slice(0, 0), watched).num_rows == 0


def test_absence_fires_once_for_the_silent_server_and_resolves_when_it_sends_again(store, log):
    rules = [parse_rule("quiet", "ABSENT host.cpu.utilization FROM sim-* FOR 1s LABELS severity=info")]
    produce(log, sim(3, 1, NOW_MS))
    assert batch(store, log, queries=[], rules=rules).rows[Table.ALERTS] == 0
    seen = open_table(store, Table.LAST_SEEN).to_pyarrow_table()
    assert Counter(zip(seen.column("server").to_pylist(), seen.column("metric").to_pylist(), strict=True)) == Counter(
        [(f"sim-000{i}", m) for i in range(3) for m in (None, "host.cpu.utilization")]
    )
    time.sleep(1.2)
    produce(log, sim(2, 2, NOW_MS + 60_000))  # sim-0002 is silent now
    outcome = batch(store, log, queries=[], rules=rules)
    assert outcome.rows[Table.ALERTS] == 1
    assert transitions(store) == [("quiet", "sim-0002", "inactive", "firing")]
    time.sleep(0.2)
    produce(log, sim(2, 3, NOW_MS + 120_000))  # still silent: firing, no new transition
    batch(store, log, queries=[], rules=rules)
    produce(log, sim(3, 4, NOW_MS + 180_000))
    batch(store, log, queries=[], rules=rules)
    assert transitions(store) == [
        ("quiet", "sim-0002", "inactive", "firing"),
        ("quiet", "sim-0002", "firing", "resolved"),
    ]
    row = open_table(store, Table.ALERTS).to_pyarrow_table().to_pylist()[0]
    assert row["labels"] == [("alertname", "quiet"), ("server", "sim-0002"), ("severity", "info")]
    assert row["fingerprint"] == "c0e49fcdc5996a7e"  # Alertmanager's, for these labels


def test_a_per_server_threshold_fires_for_the_servers_over_it_computed_independently(store, log):
    query = parse_query("cpu_max", "FROM * SELECT host.cpu.utilization WINDOW 1m COMPUTE max PER SERVER")
    events = sim(6, 7, NOW_MS, seconds=120)
    produce(log, events)
    windows = expected_windows(events)
    starts = sorted({start for metric, _, start in windows if metric == "host.cpu.utilization"})
    # The event clock is the newest event time (watermark + watermark_seconds), in the newest minute: the last step
    # evaluated is that minute's start, which sees the minute before, the newest window that has ended.
    closed = starts[-2]
    maxima = {
        server: w["max"] for (m, server, start), w in windows.items() if m == "host.cpu.utilization" and start == closed
    }
    line = sorted(maxima.values())[3]  # two servers above it
    rules = [parse_rule("hot", f"cpu_max.max > {line} LABELS team=ops")]
    outcome = batch(store, log, queries=[query], rules=rules)
    hot = sorted(s for s, v in maxima.items() if v > line)
    assert len(hot) == 2 and outcome.rows[Table.ALERTS] == 2
    assert sorted(transitions(store)) == [("hot", s, "inactive", "firing") for s in hot]
    values = {r["server"]: r["value"] for r in open_table(store, Table.ALERTS).to_pyarrow_table().to_pylist()}
    assert values == {s: maxima[s] for s in hot}


def test_a_replayed_batch_records_no_transition_twice(store, log):
    rules = [parse_rule("quiet", "ABSENT host.cpu.utilization FOR 1s")]
    produce(log, sim(2, 1, NOW_MS))
    batch(store, log, queries=[], rules=rules)
    time.sleep(1.2)
    produce(log, sim(1, 2, NOW_MS + 60_000))
    ends = end_offsets(log, TOPIC)

    def planned():
        plan = speed_layer.plan_batch(
            store, TOPIC, ends, watermark_seconds=60, chunk_records=1000, watched=("host.cpu.utilization",)
        )
        return plan, [
            r
            for p in plan.partition_chunks()
            for r in speed_layer.process_partition(store, plan, p, clock_skew_seconds=300)
        ]

    (plan, results), (again, again_results) = planned(), planned()
    assert (
        speed_layer.commit_batch(store, plan, results, watermark_seconds=60, queries=[], rules=rules).rows[Table.ALERTS]
        == 1
    )
    assert (
        speed_layer.commit_batch(store, again, again_results, watermark_seconds=60, queries=[], rules=rules).rows[
            Table.ALERTS
        ]
        == 0
    )
    assert transitions(store) == [("quiet", "sim-0001", "inactive", "firing")]


def test_a_crash_before_the_alerts_commit_is_caught_up_by_the_next_batch_once(store, log, monkeypatch):
    rules = [parse_rule("quiet", "ABSENT host.cpu.utilization FOR 1s")]
    produce(log, sim(2, 1, NOW_MS))
    batch(store, log, queries=[], rules=rules)
    time.sleep(1.2)
    produce(log, sim(1, 2, NOW_MS + 60_000))

    def crash(*args, **kwargs):
        raise RuntimeError("killed after last_seen committed")

    real = AlertsCommit.commit
    monkeypatch.setattr(AlertsCommit, "commit", crash)
    with pytest.raises(RuntimeError):
        batch(store, log, queries=[], rules=rules)
    monkeypatch.setattr(AlertsCommit, "commit", real)
    forget_alert_logs()  # a new process: the state comes from the table alone
    outcome = batch(store, log, queries=[], rules=rules)
    assert outcome.rows[Table.BRONZE_EVENTS] == 0 and outcome.rows[Table.ALERTS] == 1
    assert batch(store, log, queries=[], rules=rules) is None
    assert transitions(store) == [("quiet", "sim-0001", "inactive", "firing")]
    ends = end_offsets(log, TOPIC)
    for name in (Table.LAST_SEEN, Table.ALERTS):
        marks = committed_offsets(open_table(store, name), CONSUMER, TOPIC, ends)
        assert {p: m or 0 for p, m in marks.items()} == ends


def test_tables_added_to_an_existing_lake_start_where_its_windows_are(store, log, monkeypatch):
    """An upgrade adds last_seen and alerts to a lake that holds data: they must not make the stream re-read it."""
    produce(log, sim(3, 1, NOW_MS))
    batch(store, log, queries=[], rules=[])
    ends = end_offsets(log, TOPIC)
    for name in (Table.LAST_SEEN, Table.ALERTS):  # as if the lake were written before these tables existed
        for key in store.list(f"tables/{name}/_delta_log"):
            store.delete(f"tables/{name}/_delta_log/{key}")
    assert starting_offsets(store, TOPIC) == ends
    produce(log, sim(3, 2, NOW_MS + 60_000))
    rules = [parse_rule("quiet", "ABSENT host.cpu.utilization FOR 1h")]
    outcome = batch(store, log, queries=[], rules=rules)
    assert outcome.records == sum(end_offsets(log, TOPIC).values()) - sum(ends.values())  # only the new records
    seen = open_table(store, Table.LAST_SEEN).to_pyarrow_table()
    assert Counter(seen.column("metric").to_pylist()) == {None: 3, "host.cpu.utilization": 3}


def test_a_newly_watched_metric_starts_from_the_windows_so_servers_already_silent_are_expected(store, log):
    produce(log, sim(3, 1, NOW_MS))
    batch(store, log, queries=[], rules=[])
    produce(log, sim(2, 2, NOW_MS + 60_000))  # sim-0002 silent since the first minute (event time)
    rules = [parse_rule("quiet", "ABSENT host.cpu.utilization FROM sim-0002 FOR 30s")]
    batch(store, log, queries=[], rules=rules)
    seen = open_table(store, Table.LAST_SEEN).to_pyarrow_table()
    watched = seen.filter(pc.and_(pc.equal(seen.column("server"), "sim-0002"), pc.is_valid(seen.column("metric"))))
    assert watched.num_rows == 1  # from its newest 1-minute window: no event of it in this batch
    assert watched.column("last_seen_at")[0].as_py().timestamp() * 1000 == pytest.approx(NOW_MS + 60_000)


def test_the_alert_log_reads_new_files_only_and_starts_over_when_files_go(store, log):
    rules = [parse_rule("quiet", "ABSENT host.cpu.utilization FOR 1s")]
    produce(log, sim(2, 1, NOW_MS))
    batch(store, log, queries=[], rules=rules)
    time.sleep(1.2)
    produce(log, sim(1, 2, NOW_MS + 60_000))
    batch(store, log, queries=[], rules=rules, alerting=AlertOptions(absence_lookback_s=3600))
    alert_log = AlertLog(store)
    assert [a.server for a in alert_log.refresh().values()] == ["sim-0001"]
    table = open_table(store, Table.ALERTS)
    table.optimize.compact()  # rewrites the files: the log must read them again, not keep stale ones
    assert [a.server for a in alert_log.refresh().values()] == ["sim-0001"]
    assert alert_log.transitions().num_rows == 1
    # The speed layer's own log keeps the state, not the rows: what it holds does not grow with the history.
    stateful = AlertLog(store, keep_transitions=False)
    assert [a.server for a in stateful.refresh().values()] == ["sim-0001"]
    assert all(rows is None for rows in stateful._files.values())
    with pytest.raises(RuntimeError, match="keeps no transitions"):
        stateful.transitions()


def test_catching_up_unevenly_does_not_make_the_servers_of_a_partition_read_later_look_silent(store, log):
    """A backlog of two appends 2 s apart; a batch reads partition 0 to its end but partition 1 only through the
    first append: partition 1's servers are not silent (their next records wait unread), so nothing fires."""
    rules = [parse_rule("quiet", "ABSENT host.cpu.utilization FOR 1s")]
    produce(log, sim(6, 1, NOW_MS))
    batch(store, log, queries=[], rules=rules)
    produce(log, sim(6, 2, NOW_MS + 60_000))
    first_append = end_offsets(log, TOPIC)
    time.sleep(2)
    produce(log, sim(6, 3, NOW_MS + 120_000))
    uneven = {0: end_offsets(log, TOPIC)[0], 1: first_append[1]}
    speed_layer.run_batch_in_process(
        store, TOPIC, uneven, watermark_seconds=60, clock_skew_seconds=300, queries=[], rules=rules
    )
    assert transitions(store) == []  # the clock stops where partition 1 was read: its servers' silence is not known
    batch(store, log, queries=[], rules=rules)
    assert transitions(store) == []

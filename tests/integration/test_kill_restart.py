"""Exactly once across crashes: `lake stream` killed with SIGKILL (and its checkpoint deleted, whole or in part),
restarted, no loss, no duplicate: in bronze, the windows, the stored queries' results and the alerts' transitions.

The stream compacts its tables continuously (every second, two files of a size tier merged), so the kills also
land before, during and after compactions: no file is lost or counted twice, and the files stay bounded."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.config_store import ALERT, Change, ConfigStore
from metrics_lake.core.kernels.stored_queries import load_stored_queries, parse_query
from metrics_lake.core.keys import table_lease_key
from metrics_lake.core.leases import read_lease_at
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.maintenance.continuous_compaction import COMPACTED_TABLES, LEASE_TTL_MS
from metrics_lake.core.tables.delta import open_table
from metrics_lake.spark.jobs.stream_metrics import checkpoint_location
from tests.helpers import assert_query_results, expected_windows

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LAKE = str(Path(sys.executable).with_name("lake"))
START_MS = 1_763_600_000_000 - 1_763_600_000_000 % 60_000  # a past minute boundary
#: How each run is killed: the first during JVM start-up (a fixed 4 s); the
#: later ones once that run has committed a new bronze version, plus a small
#: offset, so they land mid-stream with later batches under way on any
#: machine speed.
KILL_AFTER_COMMIT = [None, 0.0, 0.4, 0.9, 1.5]
#: The CPU line of the test's threshold rule: some servers' 1-minute max is above it at the end, some below.
HOT = 75
CPU_1M = parse_query("cpu_1m", "FROM * SELECT host.cpu.utilization WINDOW 1m COMPUTE max PER SERVER")


def lake_env(settings) -> dict[str, str]:
    return {
        **os.environ,
        "LAKE_ROOT": settings.root,
        "LAKE_CHECKPOINT_DIR": settings.checkpoint_dir,
        "LAKE_SPARK_MASTER": "local[2]",
        "LAKE_SHUFFLE_PARTITIONS": "2",
        "LAKE_TRIGGER_SECONDS": "1",
        "LAKE_MAX_RECORDS_PER_BATCH": "2500",
        "LAKE_WATERMARK_SECONDS": "3600",  # lateness is not under test here
        "LAKE_COMPACTION_INTERVAL_SECONDS": "1",
        "LAKE_COMPACTION_MIN_FILES": "2",
    }


def bronze_version(store) -> int:
    return open_table(store, "bronze_events").version() if store.exists("tables/bronze_events/_delta_log") else -1


def test_sigkilled_stream_restarts_exactly_once(settings, log, store, tmp_path):
    env = lake_env(settings)
    config_store = ConfigStore(store)
    config_store.ensure_seeded()
    config_store.apply(
        [
            Change("put", "cpu_1m", CPU_1M.text),
            Change("put", "hot", f"cpu_1m.max > {HOT}", kind=ALERT),
            Change("put", "quiet", "ABSENT host.cpu.utilization FOR 1s", kind=ALERT),
        ]
    )
    bronze_versions = []
    for phase, offset in enumerate(KILL_AFTER_COMMIT):
        servers = 10 if phase < len(KILL_AFTER_COMMIT) - 1 else 9  # sim-0009 goes silent in the last phase
        sim = FleetSimulator(
            servers=servers, metrics=5, seconds=60, rate=2.0, seed=phase, start_ms=START_MS + phase * 60_000
        )
        with Producer(log, settings.topic, partitions=settings.partitions) as producer:
            producer.send(sim.generate())
        before = bronze_version(store)
        with open(tmp_path / f"stream-{phase}.log", "wb") as output:
            process = subprocess.Popen(
                [LAKE, "stream"], env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
            if offset is None:
                time.sleep(4.0)
            else:
                deadline = time.monotonic() + 120
                while bronze_version(store) <= before and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(offset)
            assert process.poll() is None, (tmp_path / f"stream-{phase}.log").read_text()[-3000:]
            os.killpg(process.pid, signal.SIGKILL)  # the driver, its JVM and Python workers at once
            process.wait(30)
            # A killed JVM may still finish a file rename while it is torn down: only then is the checkpoint still.
            # After SIGKILL no member can fork: the members listed now are all there will be.
            assert all(exits_within(member, 30) for member in group_members(process.pid)), "the stream's group runs on"
        if phase == 1:  # and then the checkpoint is lost too (another worker, an ephemeral container)
            shutil.rmtree(settings.checkpoint_path)
        elif phase == 3:  # or only its metadata file, which Spark alone would refuse to start from
            (checkpoint_location(settings) / "metadata").unlink()
        bronze_versions.append(bronze_version(store))

    assert bronze_versions[-1] >= 1, f"no run got as far as a commit: {bronze_versions}"
    # A run killed mid-merge holds its table's compaction lease until the lease's TTL passes; the final run compacts
    # only then (it does not wait for a lease: the table is left to the next round).
    for name in COMPACTED_TABLES:
        lease = read_lease_at(store, table_lease_key(name), name)
        if lease is not None:
            assert lease.remaining_ms() <= LEASE_TTL_MS, lease.describe()
            time.sleep(max(lease.remaining_ms(), 0) / 1000)
    final = subprocess.run([LAKE, "stream", "--once"], env=env, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]

    produced = pa.concat_tables(
        read_range(log, settings.topic, p, 0, end) for p, end in end_offsets(log, settings.topic).items()
    )
    assert produced.num_rows == (4 * 10 + 9) * 5 * 120
    bronze = open_table(store, "bronze_events").to_pyarrow_table(columns=["topic", "partition", "offset"])
    positions = Counter(zip(*(bronze.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True))
    duplicates = {pos: n for pos, n in positions.items() if n > 1}
    assert not duplicates, f"{len(duplicates)} duplicated positions, e.g. {list(duplicates)[:3]}"
    wanted = set(zip(*(produced.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True))
    assert set(positions) == wanted, f"missing {len(wanted - set(positions))}, extra {len(set(positions) - wanted)}"

    windows = open_table(store, "metric_windows_1m").to_pyarrow_table().to_pylist()
    got = {(w["metric"], w["server"], int(w["window_start"].timestamp() * 1000)): w["count"] for w in windows}
    assert got == {key: value["count"] for key, value in expected_windows(produced).items()}

    events = [
        {"ts": round(e["ts"].timestamp() * 1000), "server": e["server"], "metric": e["metric"], "value": e["value"]}
        for e in produced.filter(pc.is_null(produced.column("reason"))).to_pylist()
    ]
    results = open_table(store, "query_results").to_pyarrow_table().to_pylist()
    assert_query_results(results, events, [*load_stored_queries(), CPU_1M])  # the live stored queries, exact too
    assert_alerts_exactly_once(store, events)
    # Continuously compacted: at most a file per size tier and partition of bronze's one day (none rewritten twice
    # into duplicates: the positions above are each once).
    for name in ("bronze_events", "quarantine_events", "alerts"):
        table = open_table(store, name)
        assert len(table.file_uris()) <= 3 * 4, (name, len(table.file_uris()), final.stderr[-2000:])
    history = open_table(store, "bronze_events").history()
    assert any(h.get("lake.operation") == "CONTINUOUS COMPACTION" for h in history)


def assert_alerts_exactly_once(store, events: list[dict]) -> None:
    """Every alert's transitions form one unbroken sequence (none twice, none lost: each starts from the state the
    one before left), and the alerts active after the last batch are those an independent computation finds at the
    final clocks: the servers whose CPU max over the minute that ended at the last evaluation step (the newest event
    time's minute) is over HOT, and sim-0009, silent. Then, with no record arriving, the final run's idle evaluation
    finds the whole fleet silent (``FOR 1s``): every server's absence alert fires."""
    rows = open_table(store, "alerts").to_pyarrow_table().sort_by([("recorded_at", "ascending"), ("seq", "ascending")])
    rows = rows.to_pylist()
    assert len({r["id"] for r in rows}) == len(rows)
    last_append = max(
        open_table(store, "last_seen").to_pyarrow_table(columns=["last_seen_at"]).column("last_seen_at").to_pylist()
    )
    state: dict[str, str] = {}
    after_batches: dict[str, str] = {}
    for r in rows:
        assert r["previous_state"] == state.get(r["fingerprint"], "inactive"), r
        state[r["fingerprint"]] = "inactive" if r["state"] == "resolved" else r["state"]
        if r["at"] <= last_append:  # a batch's evaluation (the idle one's clock is later than every append)
            after_batches[r["fingerprint"]] = state[r["fingerprint"]]
    names = {r["fingerprint"]: (r["rule"], r["server"]) for r in rows}
    active = {names[f] for f, s in after_batches.items() if s == "firing"}
    newest = max(e["ts"] for e in events)  # the event clock once every record is read (watermark + its seconds)
    step = newest - newest % 60_000  # the last evaluation step: it sees the minute that ended then
    maxima: dict[str, float] = {}
    for e in events:
        if e["metric"] == "host.cpu.utilization" and step - 60_000 <= e["ts"] < step:
            maxima[e["server"]] = max(maxima.get(e["server"], float("-inf")), e["value"])
    hot = {("hot", server) for server, value in maxima.items() if value > HOT}
    assert hot and len(hot) < len(maxima)  # the threshold splits the fleet: both outcomes are checked
    assert active == hot | {("quiet", "sim-0009")}
    quiet_at_end = {names[f][1] for f, s in state.items() if s == "firing" and names[f][0] == "quiet"}
    assert quiet_at_end == {f"sim-{i:04d}" for i in range(10)}


#: 6,000 records in batches of 2,500 back to back (LAKE_MAX_RECORDS_PER_BATCH of lake_env).
SIGNALLED_EVENTS = 6000


def stream_into_its_second_batch(settings, log, store, seed: int) -> tuple[subprocess.Popen, dict[str, str]]:
    """Produce :data:`SIGNALLED_EVENTS` and start `lake stream` (its own process group, batches back to back); return
    it and its environment once it has committed a batch and gone on into the next."""
    sim = FleetSimulator(servers=10, metrics=5, seconds=60, rate=2.0, seed=seed, start_ms=START_MS)
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(sim.generate())
    env = {**lake_env(settings), "LAKE_TRIGGER_SECONDS": "0.01"}
    process = subprocess.Popen(
        [LAKE, "stream"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and bronze_version(store) < 1:
        time.sleep(0.05)
    time.sleep(0.2)  # into the next batch (one takes about a second here)
    return process, env


def assert_the_next_run_completes_it_exactly_once(env: dict[str, str], store) -> None:
    once = subprocess.run([LAKE, "stream", "--once"], env=env, capture_output=True, text=True, timeout=300)
    assert once.returncode == 0, once.stderr[-3000:]
    bronze = open_table(store, "bronze_events").to_pyarrow_table(columns=["partition", "offset"])
    assert bronze.num_rows == len(set(zip(*bronze.to_pydict().values(), strict=True))) == SIGNALLED_EVENTS


def test_sigterm_to_the_process_group_stops_the_stream_between_batches_exactly_once(settings, log, store):
    """SIGTERM to the stream's whole process group (``timeout``, Airflow stopping a task) while batches run back to
    back: the driver lets the batch in flight commit and exits 0 with no stack trace, since Spark's JVM, in a
    session of its own, did not get the signal; the next run completes the rest exactly once."""
    process, env = stream_into_its_second_batch(settings, log, store, seed=7)
    os.killpg(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=90)
    assert process.returncode == 0, output[-3000:]
    assert "stopped on signal, between micro-batches" in output
    assert "Traceback" not in output and "Exception" not in output, output[-3000:]
    committed = open_table(store, "bronze_events").to_pyarrow_table().num_rows
    assert 0 < committed < SIGNALLED_EVENTS  # it stopped mid-stream (all events valid)
    assert_the_next_run_completes_it_exactly_once(env, store)


def test_sigterm_to_every_process_of_the_stream_ends_it_in_one_line_exit_0(settings, log, store):
    """As systemd's default KillMode=control-group does: the driver, Spark's JVM and its Python workers all get
    SIGTERM while batches run. The JVM exits at once and the driver's calls into it fail; the stream says so in one
    line (not "a bug in metrics-lake") and exits 0, and the next run completes what it left, exactly once."""
    process, env = stream_into_its_second_batch(settings, log, store, seed=8)
    stream = psutil.Process(process.pid)
    for member in [stream, *stream.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=90)
    assert process.returncode == 0, output[-3000:]
    assert "a bug in metrics-lake" not in output
    assert "stopped on signal" in output  # between batches, or "Spark's JVM got it too" (which came first varies)
    assert_the_next_run_completes_it_exactly_once(env, store)


def test_a_second_ctrl_c_ends_the_stream_at_once_and_the_next_run_completes_it_exactly_once(settings, log, store):
    """Ctrl-C while batches run says the stream is stopping; a second one ends it at once (exit 130) without waiting
    for the batch in flight, killing Spark's JVM first (which would print the failure of its calls into the driver),
    and the next run completes what it left, exactly once."""
    process, env = stream_into_its_second_batch(settings, log, store, seed=9)
    jvm = next(p for p in psutil.Process(process.pid).children(recursive=True) if p.name() == "java")
    process.send_signal(signal.SIGINT)
    time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 130, output[-3000:]
    assert "stopping once the micro-batch in flight commits" in output
    assert "exiting at once: a micro-batch in flight is left for the next" in output
    assert "Traceback" not in output and "Exception" not in output, output[-3000:]  # the JVM is killed first
    assert exits_within(jvm, 10)
    assert_the_next_run_completes_it_exactly_once(env, store)


def group_members(pgid: int) -> list[psutil.Process]:
    """The processes of process group ``pgid`` now."""
    members = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == pgid:
                members.append(process)
    return members


def exits_within(process: psutil.Process, seconds: float) -> bool:
    """Whether ``process`` (not a child of this one) exits within ``seconds``: gone, or a zombie (an orphan's parent
    may reap it late)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False

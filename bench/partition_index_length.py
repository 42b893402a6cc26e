"""Benchmark: a log append's time against the number of segments its partition index lists, on a local lake.

Every append writes its segment and then swaps the partition's index
(``core/log/index.py``), whose ``index.json`` holds only the newest entries
and names immutable chunks of the older ones; before the chunks, every
append wrote every entry again, and on a local lake the compare-and-swap
read the current index back and hashed it to check its version, so an
append slowed down as retention kept more segments. Log compaction keeps the number of
segments down to about one per ``LAKE_LOG_COMPACTION_TARGET_BYTES`` (8 MiB),
and retention (``LAKE_RETENTION_HOURS``, 7 days by default) lets them
accumulate: the 2-hour soak at 40,000 events/s left about 38 compacted
segments per partition after 50 minutes, so about 7,700 per partition at the
end of a week. This run gives a partition an index of N compacted segments
(entries only: an append never reads the segments themselves), then times
``--appends`` appends of one remote-write request's 2,000 records, as the
gateway appends them. The peer is the same append with an empty index (N =
0), in the same run. Run:
``python bench/partition_index_length.py [--segments 0 1000 7700] [--appends 50]``.
"""

from __future__ import annotations

import argparse
import time

from common import print_table, scratch_dir
from ingest_protocols import bodies_for

from metrics_lake.app.gateway.endpoints import RemoteWriteEndpoint
from metrics_lake.core.keys import index_key
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.segment import SegmentInfo
from metrics_lake.core.storage import LocalStore
from metrics_lake.lake_schemas.log_records import LOG_RECORD

#: Records of a compacted segment listed in the index (8 MiB of segment at about 120 bytes a record).
RECORDS_PER_SEGMENT = 70_000


def appends(listed: int, count: int, records) -> tuple[float, float, int]:
    """(wall ms, CPU ms) per append of ``records`` to a partition whose index lists ``listed`` compacted segments,
    and the index's size in bytes after the appends."""
    log = SegmentLog(LocalStore(scratch_dir("lake-index-length-")))
    log.ensure_topic("bench", 1)
    writer = log.writer("bench", 0, "bench-producer")
    now_ms = int(time.time() * 1000)
    for i in range(listed):
        base = i * RECORDS_PER_SEGMENT
        end = base + RECORDS_PER_SEGMENT
        writer.index.segments.append(
            SegmentInfo(
                base_offset=base,
                end_offset=end,
                min_ts=now_ms - 1000,
                max_ts=now_ms,
                appended_at=now_ms,
                size_bytes=8 * 1024 * 1024,
                epoch=writer.epoch,
                object_name=f"{base:020d}-{end:020d}.parquet",
                oldest_appended_at=now_ms - 60_000,  # its parts (one per append merged) are in its footer
            )
        )
    writer.index.save(log.store, "bench", 0)
    wall, cpu = time.perf_counter(), time.process_time()
    for seq in range(1, count + 1):
        writer.append(records, producer_id="bench-producer", producer_seq=seq)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    size = log.store.size(index_key("bench", 0))  # index.json alone: what every append writes
    return wall / count * 1000, cpu / count * 1000, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", nargs="+", type=int, default=[0, 1000, 7700], help="segments the index lists")
    parser.add_argument("--appends", type=int, default=50, help="appends timed per length")
    args = parser.parse_args()
    body = bodies_for("remote-write", 1, 1, 1000, 2)[0][0]
    records = RemoteWriteEndpoint().decode(body, "application/x-protobuf", {}, 1 << 30).records.cast(LOG_RECORD)
    appends(0, 5, records)  # warm up: imports, Parquet writer, the first files of a folder
    rows, first = [], None
    for listed in args.segments:
        wall, cpu, size = appends(listed, args.appends, records)
        first = first or wall
        rows.append((f"{listed:,}", f"{size / 1024:,.0f}", f"{wall:.2f}", f"{cpu:.2f}", f"{wall / first:.2f}x"))
        print(f"{listed:,} segments: done", flush=True)
    print()
    print_table(("segments listed", "index KiB", "append ms", "CPU ms", "vs the first length"), rows)


if __name__ == "__main__":
    main()

"""Benchmark: which file format should a log segment use?

Writes and reads the same realistic segment (simulator events in the log
record schema) as Parquet and as Arrow IPC with several codecs, in one
process, and prints bytes per event, encode and decode throughput and the
ratio against the first row. Run: ``python bench/segment_format.py``.
"""

from __future__ import annotations

import argparse
import io
import time

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.parquet_layout import write_options


def _encode_parquet(table: pa.Table, codec: str) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression=codec)
    return sink.getvalue()


def _encode_lake(table: pa.Table) -> bytes:
    """What the log writes: zstd, dictionaries for strings only, delta-packed times (core/parquet_layout.py)."""
    sink = io.BytesIO()
    pq.write_table(table, sink, **write_options(table.schema))
    return sink.getvalue()


def _encode_ipc(table: pa.Table, codec: str | None) -> bytes:
    sink = pa.BufferOutputStream()
    options = ipc.IpcWriteOptions(compression=codec)
    with ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _timed(fn, repeat: int) -> tuple[float, object]:
    best = float("inf")
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    """Print a comparison table of segment formats."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000, help="events per segment")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    servers = max(1, args.events // (10 * 60))
    table = FleetSimulator(servers=servers, metrics=10, seconds=60, rate=1.0, seed=7).generate()
    table = table.slice(0, args.events)
    n = table.num_rows
    candidates = {
        "parquet+zstd (lake layout)": (
            lambda: _encode_lake(table),
            lambda b: pq.read_table(pa.BufferReader(b)),
        ),
        "parquet+zstd": (lambda: _encode_parquet(table, "zstd"), lambda b: pq.read_table(pa.BufferReader(b))),
        "parquet+snappy": (lambda: _encode_parquet(table, "snappy"), lambda b: pq.read_table(pa.BufferReader(b))),
        "arrow-ipc+zstd": (lambda: _encode_ipc(table, "zstd"), lambda b: ipc.open_file(b).read_all()),
        "arrow-ipc+lz4": (lambda: _encode_ipc(table, "lz4"), lambda b: ipc.open_file(b).read_all()),
        "arrow-ipc (none)": (lambda: _encode_ipc(table, None), lambda b: ipc.open_file(b).read_all()),
    }
    print(f"segment of {n:,} events, best of {args.repeat}")
    print(
        f"{'format':26} {'bytes/event':>11} {'encode ev/s':>13} {'decode ev/s':>13} {'size x':>7} {'enc x':>6} {'dec x':>6}"
    )
    base = None
    for name, (encode, decode) in candidates.items():
        enc_s, blob = _timed(encode, args.repeat)
        dec_s, decoded = _timed(lambda blob=blob, decode=decode: decode(blob), args.repeat)
        assert decoded.num_rows == n
        row = (len(blob) / n, n / enc_s, n / dec_s)
        base = base or row
        print(
            f"{name:26} {row[0]:11.2f} {row[1]:13,.0f} {row[2]:13,.0f} "
            f"{row[0] / base[0]:7.2f} {row[1] / base[1]:6.2f} {row[2] / base[2]:6.2f}"
        )


if __name__ == "__main__":
    main()

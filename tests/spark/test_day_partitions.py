"""The batch layer's shuffle key: every row of a series reaches the same reduce task, whichever task produced it."""

from __future__ import annotations

import zlib

import pyarrow as pa

from metrics_lake.spark.jobs.day_partitions import series_partitions


def test_a_series_gets_one_partition_whatever_the_rows_around_it_and_their_encoding():
    metrics = ["cpu", "mem", "cpu", "rpc", "cpu", "q"]
    servers = ["a", "a", "b", "a", "a", None]
    states = pa.table({"metric": pa.array(metrics), "server": pa.array(servers)})
    parts = series_partitions(states, 4)
    assert parts.dtype.kind == "i" and ((parts >= 0) & (parts < 4)).all()
    # The same partition as an independent computation: CRC-32 of "metric\0server" (a null server as "").
    want = [zlib.crc32(f"{m}\0{s or ''}".encode()) % 4 for m, s in zip(metrics, servers, strict=True)]
    assert parts.tolist() == want
    # Another task's states: other series around it, other order, dictionary-encoded strings.
    other = pa.table(
        {
            "metric": pa.array(["zzz", "cpu", "cpu"]).dictionary_encode(),
            "server": pa.array(["c", "b", "a"]).dictionary_encode(),
        }
    )
    assert series_partitions(other, 4).tolist()[1:] == [parts[2], parts[0]]
    assert series_partitions(states.slice(0, 0), 4).tolist() == []

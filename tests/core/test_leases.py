"""Partition leases and fencing, on the local backend and on the S3 server."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from metrics_lake.core.leases import read_lease
from metrics_lake.core.log.consumer import read_range
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.lake_schemas.errors import FencedError, LeaseHeldError
from tests.core.log.test_log import records


def test_a_second_writer_gets_a_clear_error_while_the_lease_is_held(any_store):
    log = SegmentLog(any_store)
    log.ensure_topic("t", 2)
    first = log.writer("t", 0, "gateway-a", ttl_ms=30_000)
    with pytest.raises(LeaseHeldError, match=r"t/0 is leased to gateway-a \(epoch 1\)"):
        log.writer("t", 0, "gateway-b", ttl_ms=30_000)
    log.writer("t", 1, "gateway-b", ttl_ms=30_000)  # other partitions are free
    first.release()
    second = log.writer("t", 0, "gateway-b", ttl_ms=30_000)  # released: taken at once, next epoch
    assert (second.epoch, read_lease(any_store, "t", 0).owner) == (2, "gateway-b")


def test_an_expired_lease_is_taken_over_and_the_old_writer_is_fenced(any_store):
    log = SegmentLog(any_store)
    log.ensure_topic("t", 1)
    old = log.writer("t", 0, "old", ttl_ms=1_000)
    old.append(records(3), producer_id="old", producer_seq=1)
    time.sleep(1.1)  # the old writer stalls past its TTL...
    new = log.writer("t", 0, "new", ttl_ms=30_000)
    new.append(records(2), producer_id="new", producer_seq=1)
    with pytest.raises(FencedError):  # ...and can no longer append, even with a segment name free
        old.append(records(5), producer_id="old", producer_seq=2)
    with pytest.raises(FencedError):
        old.renew()
    index = log.index("t", 0)
    assert (index.next_offset, index.epoch) == (5, 2)
    assert read_range(log, "t", 0, 0, 5).column("value").to_pylist() == [0.0, 1.0, 2.0, 0.0, 1.0]
    assert sorted(any_store.list("log/t/0")) == [
        "00000000000000000000.parquet",
        "00000000000000000003.parquet",
        "index.json",
        "lease.json",
    ]


def test_two_producers_racing_for_one_partition_keep_offsets_dense(any_store):
    """Both producers send at once; the loser waits for the lease, then appends after the winner."""
    log = SegmentLog(any_store)
    log.ensure_topic("t", 1)
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def produce(name: str, base_value: float) -> None:
        try:
            with Producer(log, "t", partitions=1, producer_id=name, roll_bytes=10**9, linger_ms=60_000) as producer:
                start.wait()
                for i in range(5):
                    batch = records(4)
                    producer.send(batch.set_column(3, "value", pa.array([base_value + 4 * i + j for j in range(4)])))
                    producer.flush()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(name, base)) for name, base in (("a", 0.0), ("b", 100.0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    index = log.index("t", 0)
    assert [s.base_offset for s in index.segments] == list(range(0, 40, 4))  # dense, no overlap
    values = read_range(log, "t", 0, 0, 40).column("value").to_pylist()
    assert sorted(values) == [float(v) for v in range(20)] + [100.0 + v for v in range(20)]
    # The winner's whole run comes first: the lease is held until it closes.
    assert values[:20] in ([float(v) for v in range(20)], [100.0 + v for v in range(20)])


def test_a_producer_that_cannot_get_the_lease_says_who_holds_it(any_store):
    log = SegmentLog(any_store)
    log.ensure_topic("t", 1)
    holder = log.writer("t", 0, "gateway-a", ttl_ms=30_000)
    producer = Producer(log, "t", partitions=1, lease_wait_s=0.5, retries=0)
    producer.send(records(1))
    with pytest.raises(LeaseHeldError, match="gateway-a"):
        producer.flush()
    holder.release()
    producer.close()  # the lease is free now: the pending batch lands
    assert log.index("t", 0).next_offset == 1

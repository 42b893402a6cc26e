"""JSON Lines import: valid events produced, invalid ones quarantined, none lost."""

from __future__ import annotations

import gzip
import io
import json
import random

import pytest

from metrics_lake.agents import file_import
from metrics_lake.agents.file_import import import_jsonl
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.producer import Producer
from metrics_lake.lake_schemas.errors import InputError


def test_import_counts_and_keeps_every_line(log, tmp_path):
    good = {"ts": 1_800_000_000_000, "server": "db-1", "metric": "app.queue.depth", "value": 3}
    lines = [json.dumps({**good, "value": i}) for i in range(10)] + ["", "{broken", json.dumps({**good, "value": None})]
    path = tmp_path / "events.jsonl.gz"
    text = "\n".join(lines) + "\n"
    with gzip.open(path, "wt") as handle:
        handle.write(text)
    seen = []
    with Producer(log, "metrics", partitions=2) as producer:
        # chunks end mid-line: the rest starts the next one
        stats = import_jsonl(producer, path, chunk_bytes=64, progress=lambda s: seen.append((s.bytes, s.lines)))
    assert (stats.lines, stats.accepted, stats.rejected, stats.blank) == (13, 10, 2, 1)
    assert stats.bytes == len(text.encode()) and seen[-1] == (stats.bytes, 13)  # uncompressed bytes, all of them
    assert len(seen) > 1 and seen == sorted(seen)  # once per chunk, growing
    rows = [
        r for p, end in end_offsets(log, "metrics").items() for r in read_range(log, "metrics", p, 0, end).to_pylist()
    ]
    assert sorted(r["value"] for r in rows if r["reason"] is None) == [float(i) for i in range(10)]
    rejected = {r["raw"]: r["reason"].split(":")[0] for r in rows if r["reason"] is not None}
    assert rejected == {"{broken": "invalid_json", lines[-1]: "missing_field"}


def test_a_rerun_with_other_chunk_boundaries_stops_with_a_clear_error_and_appends_nothing_twice(log, tmp_path):
    good = {"ts": 1_800_000_000_000, "server": "db-1", "metric": "app.queue.depth"}
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({**good, "value": i}) + "\n" for i in range(400)))
    with Producer(log, "metrics", partitions=1) as producer:
        assert import_jsonl(producer, path, chunk_bytes=4096).accepted == 400
    with Producer(log, "metrics", partitions=1) as producer, pytest.raises(InputError) as error:
        import_jsonl(producer, path, chunk_bytes=3000)  # an import cut by another version's chunk size
    assert "cut the file into other chunks" in str(error.value) and "none twice" in str(error.value)
    values = read_range(log, "metrics", 0, 0, end_offsets(log, "metrics")[0]).column("value").to_pylist()
    assert sorted(values) == [float(i) for i in range(400)]


@pytest.mark.parametrize("earlier_digest", ["_sha256_digest", "_blake2b_digest"])
def test_an_import_begun_by_an_earlier_version_resumes_without_duplicates(log, tmp_path, monkeypatch, earlier_digest):
    """Earlier versions sent chunks with other digests (SHA-256, before that BLAKE2b)."""
    good = {"ts": 1_800_000_000_000, "server": "db-1", "metric": "app.queue.depth"}
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({**good, "value": i}) + "\n" for i in range(400)))

    class Crash(Exception):
        pass

    class CrashingProducer(Producer):  # the earlier run dies after appending its first two chunks
        sends = 0

        def send(self, records, *, source=None):
            if CrashingProducer.sends == 2:
                raise Crash
            CrashingProducer.sends += 1
            return super().send(records, source=source)

    monkeypatch.setattr(file_import, "chunk_digest", getattr(file_import, earlier_digest))
    with CrashingProducer(log, "metrics", partitions=1) as producer, pytest.raises(Crash):
        import_jsonl(producer, path, chunk_bytes=4096)
    monkeypatch.undo()
    with Producer(log, "metrics", partitions=1) as producer:
        stats = import_jsonl(producer, path, chunk_bytes=4096)
    values = read_range(log, "metrics", 0, 0, end_offsets(log, "metrics")[0]).column("value").to_pylist()
    assert sorted(values) == [float(i) for i in range(400)]  # each event once
    assert 0 < stats.duplicates < 400 and stats.accepted == 400


@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 4096])
def test_chunks_end_at_the_last_newline_before_each_multiple_of_the_chunk_size(chunk_bytes, reuse):
    """Resuming an import relies on these boundaries: a chunk's number is its sequence. With ``reuse``, each
    chunk's buffer is handed back once it was copied, as the importer does once a chunk is sent."""
    rng = random.Random(chunk_bytes)
    data = b"".join(b"x" * rng.randrange(0, 300) + b"\n" for _ in range(300)) + b"tail without newline"
    spare: list[bytearray] = []
    chunks, buffers = [], []
    for chunk in file_import._chunks(io.BytesIO(data), chunk_bytes, spare if reuse else None):
        chunks.append(bytes(chunk))
        if isinstance(chunk, bytearray):
            spare.append(chunk)
            buffers.append(chunk)
    assert len(buffers) > 1 and all(buffer is buffers[0] for buffer in buffers) == reuse
    assert b"".join(chunks) == data
    ends = [sum(len(c) for c in chunks[: i + 1]) for i in range(len(chunks))]
    grid = [data.rfind(b"\n", 0, k) + 1 for k in range(chunk_bytes, len(data) + chunk_bytes, chunk_bytes)]
    assert ends[:-1] == sorted(set(e for e in grid if e > 0))[: len(ends) - 1]
    assert ends[-1] == len(data) and all(c.endswith(b"\n") for c in chunks[:-1])

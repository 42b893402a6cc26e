"""Import events from a JSON Lines file (optionally gzip-compressed).

Each non-blank line is one event in the contract of
:mod:`lake_schemas.contract`. Lines that break it are produced as rejects and
land in ``quarantine_events`` with the raw line and a reason; nothing is
skipped except blank lines, which are counted.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lake.log.producer import Producer
from lake_schemas.contract import to_log_records


@dataclass
class ImportStats:
    """Lines read, events accepted, events rejected (quarantined), blank lines skipped."""

    lines: int = 0
    accepted: int = 0
    rejected: int = 0
    blank: int = 0


def import_jsonl(
    producer: Producer,
    path: str | Path,
    *,
    chunk_lines: int = 50_000,
    progress: Callable[[ImportStats], None] | None = None,
) -> ImportStats:
    """Validate and produce every line of ``path``; returns :class:`ImportStats`.

    ``progress`` is called after each chunk. Raises ``FileNotFoundError`` if
    ``path`` does not exist. Bytes that are not UTF-8 are kept escaped in the
    quarantined raw payload.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    stats = ImportStats()

    def send(chunk: list[bytes]) -> None:
        records = to_log_records(chunk)
        rejected = records.num_rows - records.column("reason").null_count
        producer.send(records)
        stats.accepted += records.num_rows - rejected
        stats.rejected += rejected
        if progress:
            progress(stats)

    chunk: list[bytes] = []
    with opener(path, "rb") as handle:
        for line in handle:
            stats.lines += 1
            line = line.rstrip(b"\r\n")
            if not line.strip():
                stats.blank += 1
                continue
            chunk.append(line)
            if len(chunk) >= chunk_lines:
                send(chunk)
                chunk = []
    if chunk:
        send(chunk)
    return stats

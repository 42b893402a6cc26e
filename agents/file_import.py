"""Import events from a JSON Lines file (optionally gzip-compressed).

Each non-blank line is one event in the contract of
:mod:`metrics_lake.schemas.contract`. Lines that break it are produced as rejects and
land in ``quarantine_events`` with the raw line and a reason; nothing is
skipped except blank lines, which are counted.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from metrics_lake.core.errors import InputError
from metrics_lake.core.log.producer import Producer
from metrics_lake.schemas.contract import to_log_records

__all__ = ["ImportStats", "check_importable", "import_jsonl"]


@dataclass
class ImportStats:
    """Lines read, events accepted, events rejected (quarantined), blank lines skipped."""

    lines: int = 0
    accepted: int = 0
    rejected: int = 0
    blank: int = 0


def check_importable(path: str | Path) -> None:
    """Raise :class:`~metrics_lake.core.errors.InputError` unless ``path`` is a readable regular file."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"--from-file {path}: no such file")
    if path.is_dir():
        raise InputError(f"--from-file {path} is a directory; give a .jsonl or .jsonl.gz file")
    if not os.access(path, os.R_OK):
        raise InputError(f"--from-file {path}: permission denied (not readable by this user)")


def import_jsonl(
    producer: Producer,
    path: str | Path,
    *,
    chunk_lines: int = 50_000,
    progress: Callable[[ImportStats], None] | None = None,
) -> ImportStats:
    """Validate and produce every line of ``path``; returns :class:`ImportStats`.

    ``progress`` is called after each chunk. Raises
    :class:`~metrics_lake.core.errors.InputError` if ``path`` is not a
    readable file, or if a ``.gz`` file is truncated or corrupt (saying how
    many lines before the damage were produced). Bytes that are not UTF-8
    are kept escaped in the quarantined raw payload.
    """
    path = Path(path)
    check_importable(path)
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
    try:
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
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        if chunk:
            send(chunk)  # the whole lines read before the damage are good events
        raise InputError(
            f"{path}: the gzip stream is truncated or corrupt after line {stats.lines:,} ({exc}); "
            f"the {stats.accepted + stats.rejected:,} events before it were produced"
        ) from None
    if chunk:
        send(chunk)
    return stats

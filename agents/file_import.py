"""Import events from a JSON Lines file (optionally gzip-compressed), at the speed of Arrow's JSON reader.

Each non-blank line is one event in the contract of
:mod:`metrics_lake.lake_schemas.contract`. Lines that break it are produced as
rejects and land in ``quarantine_events`` with the raw line and a reason;
nothing is skipped except blank lines, which are counted.

The file is read in chunks of :data:`CHUNK_BYTES` (a chunk ends at its last
newline; the rest starts the next chunk), each validated vectorised by
:func:`metrics_lake.lake_schemas.ndjson.records_from_lines` on a small thread pool
(Arrow and numpy release the GIL), and produced in file order.

An import is resumable and idempotent: it is an upstream producer of its
own, named by :func:`import_id` (a digest of the file's size, first and last
MiB), whose sequence numbers are the chunk numbers, each sent with the
digest of the chunk's bytes (:class:`~metrics_lake.core.log.producer.Source`,
:func:`chunk_digest`). Re-running an import that died (a full disk, a kill)
re-reads the file but appends only what the log does not hold yet: per
partition, the chunks up to the last one committed are recognised as
duplicates.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import pyarrow as pa
import xxhash

from metrics_lake.core.log.producer import Producer, Source
from metrics_lake.lake_schemas.errors import InputError, SequenceConflictError
from metrics_lake.lake_schemas.ndjson import MAX_LINE_BYTES, LinesResult, records_from_lines

__all__ = ["CHUNK_BYTES", "ImportStats", "check_importable", "chunk_digest", "import_id", "import_jsonl"]

#: Bytes read and validated at a time.
CHUNK_BYTES = 32 << 20
#: Chunks validated at once (each thread holds one).
VALIDATION_THREADS = 2


@dataclass(frozen=True)
class _Validated:
    """A validated chunk: its bytes, its lines, the records to send (a table or per partition), its digest."""

    chunk: bytes | bytearray
    result: LinesResult
    records: pa.Table | dict[int, pa.Table]
    digest: str


@dataclass
class ImportStats:
    """Lines read, events accepted, events rejected (quarantined), blank lines skipped, events already imported,
    and bytes of the file (uncompressed) done."""

    lines: int = 0
    accepted: int = 0
    rejected: int = 0
    blank: int = 0
    duplicates: int = 0  # events a previous run of this import already appended (not appended again)
    bytes: int = 0


def check_importable(path: str | Path) -> None:
    """Raise :class:`~metrics_lake.lake_schemas.errors.InputError` unless ``path`` is a readable regular file."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"--from-file {path}: no such file")
    if path.is_dir():
        raise InputError(f"--from-file {path} is a directory; give a .jsonl or .jsonl.gz file")
    if not os.access(path, os.R_OK):
        raise InputError(f"--from-file {path}: permission denied (not readable by this user)")


def import_id(path: str | Path) -> str:
    """The id of importing this file: ``import-`` + BLAKE2b of its size, first and last MiB (hex, 128 bits).

    The same file gives the same id wherever it lies, so a re-run resumes
    the earlier import; a file that changed (size, head or tail) is a new
    import.
    """
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, "rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(size - (1 << 20), 0))
        digest.update(handle.read(1 << 20))
    return f"import-{digest.hexdigest()}"


def chunk_digest(chunk: bytes | bytearray) -> str:
    """The digest an import sends a chunk with: ``xxh3:`` and the chunk's 128-bit XXH3 hash (xxHash), in hex.

    The digest tells a re-run's chunk from the one an earlier run sent with
    the same number. No adversary picks those bytes, so a non-cryptographic
    hash does, at 128 bits. XXH3 ran at 16 GB/s here against 1.2 GB/s for
    SHA-256, the digest of the previous version (5 % of an import's CPU time,
    measured). Imports begun by earlier versions resume with their digests
    (:data:`_EARLIER_DIGESTS`).
    """
    return "xxh3:" + xxhash.xxh3_128_hexdigest(chunk)


def _sha256_digest(chunk: bytes | bytearray) -> str:
    """The previous version's chunk digest: ``sha256:`` and the first 128 bits of the chunk's SHA-256, in hex."""
    return "sha256:" + hashlib.sha256(chunk).hexdigest()[:32]


def _blake2b_digest(chunk: bytes | bytearray) -> str:
    """The chunk digest of the versions before that: BLAKE2b, 128 bits, in hex."""
    return hashlib.blake2b(chunk, digest_size=16).hexdigest()


#: How earlier versions digested chunks, newest first: the chunk an import they began stopped at has one of these.
_EARLIER_DIGESTS = (_sha256_digest, _blake2b_digest)


def _validate(chunk: bytes | bytearray, split: Callable[..., dict[int, pa.Table]] | None) -> _Validated:
    """A chunk's records (split by partition with ``split``, :meth:`Producer.split`, if given) and digest; runs on
    the validation threads."""
    # The chunks are validated side by side already; records for a Producer come as its segments store them.
    result = records_from_lines(chunk, use_threads=False, dictionaries=split is not None)
    records = split(result.rows, result.line_order) if split is not None else result.records
    return _Validated(chunk, result, records, chunk_digest(chunk))


def _chunks(handle, chunk_bytes: int, spare: list[bytearray] | None = None) -> Iterator[bytes | bytearray]:
    """Whole lines of ``handle`` in chunks of about ``chunk_bytes`` (a longer line is one chunk of its own).

    Chunk k ends at the last newline before byte (k + 1) x ``chunk_bytes`` of
    the file, which resuming an import relies on. Each block of the file is
    read straight into a chunk's buffer, after the line the previous block
    left unfinished: one copy. ``spare``: chunks the caller is done with,
    whose buffers are filled again. Fresh ones would cost a page fault per
    4 KiB (glibc maps every block over 32 MiB anew): 3.5 % of an import's
    CPU time, measured with ``perf`` on 2 M lines.
    """
    rest = b""
    while True:
        buffer = _buffer(spare, len(rest) + chunk_bytes)
        buffer[: len(rest)] = rest
        size = len(rest) + _read_into(handle, buffer, len(rest))
        if size == len(rest):  # the end of the file
            _give_back(spare, buffer)
            break
        # The chunk ends at the block's last newline (rest holds none).
        cut = buffer.rfind(b"\n", len(rest), size) + 1
        if cut:
            rest = bytes(buffer[cut:size])
            del buffer[cut:]  # within the buffer's memory: it stays allocated for its next chunk
            yield buffer
            continue
        del buffer[size:]
        if size <= max(chunk_bytes, MAX_LINE_BYTES) * 4:
            rest = bytes(buffer)  # no newline yet: the line continues in the next block
            _give_back(spare, buffer)
            continue
        yield buffer  # a single line longer than four chunks: validate what we have as one line
        rest = b""
    if rest:
        yield rest


def _buffer(spare: list[bytearray] | None, size: int) -> bytearray:
    """A bytearray of ``size`` bytes: a spare one resized (within its memory, usually), or a new one."""
    while spare:
        buffer = spare.pop()
        try:
            if len(buffer) > size:
                del buffer[size:]
            else:
                buffer.extend(bytes(size - len(buffer)))
            return buffer
        except BufferError:  # something still views it: leave it to the garbage collector
            continue
    return bytearray(size)


def _give_back(spare: list[bytearray] | None, buffer: bytearray) -> None:
    if spare is not None:
        spare.append(buffer)


def _read_into(handle, buffer: bytearray, start: int) -> int:
    """Fill ``buffer`` from ``start`` with bytes of ``handle``, until it is full or the file ends; bytes read."""
    done = start
    with memoryview(buffer) as view:
        while done < len(buffer):
            with view[done:] as free:
                got = handle.readinto(free)
            if not got:
                break
            done += got
    return done - start


def import_jsonl(
    producer: Producer,
    path: str | Path,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Callable[[ImportStats], None] | None = None,
) -> ImportStats:
    """Validate and produce every line of ``path``, resuming an earlier run of the same import; returns :class:`ImportStats`.

    ``producer``: a :class:`Producer`, or anything with its ``send(records,
    source=)`` (the gateway client). ``progress`` is called after each chunk. Raises
    :class:`~metrics_lake.lake_schemas.errors.InputError` if ``path`` is not a
    readable file, or if a ``.gz`` file is truncated or corrupt (saying how
    many lines before the damage were produced), or if an earlier run of
    the same import used other chunk boundaries. Bytes that are not UTF-8
    are kept escaped in the quarantined raw payload.
    """
    path = Path(path)
    check_importable(path)
    opener = gzip.open if path.suffix == ".gz" else open
    stats = ImportStats()
    source_id = import_id(path)
    sent_chunks = 0

    # A Producer splits the records by partition on the validation threads, so this thread only buffers them.
    split = producer.split if isinstance(producer, Producer) else None
    spare: list[bytearray] = []  # chunks sent: _chunks reads the next ones into their memory

    def send(validated: _Validated) -> None:
        nonlocal sent_chunks
        result = validated.result
        # The chunk a run begun by an earlier version stopped at carries that version's digest: tried in turn.
        digests = chain([validated.digest], (earlier(validated.chunk) for earlier in _EARLIER_DIGESTS))
        for digest in digests:
            try:
                sent = producer.send(validated.records, source=Source(source_id, sent_chunks, digest, strict=False))
                break
            except SequenceConflictError:
                continue
        else:
            raise InputError(
                f"{path}: an earlier run of this import cut the file into other chunks (a version with another "
                f"chunk size); this run appended {stats.accepted + stats.rejected - stats.duplicates:,} new "
                "events, none twice. Resume it with that version, or import a copy of the rest of the file"
            )
        sent_chunks += 1
        stats.lines += result.lines
        stats.blank += result.blank
        stats.rejected += result.rejected
        stats.accepted += result.rows.num_rows - result.rejected
        stats.duplicates += sent.duplicates
        stats.bytes += len(validated.chunk)
        if isinstance(validated.chunk, bytearray):
            spare.append(validated.chunk)
        if progress:
            progress(stats)

    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=VALIDATION_THREADS, thread_name_prefix="validate") as pool:
        try:
            with opener(path, "rb") as handle:
                for chunk in _chunks(handle, chunk_bytes, spare):
                    pending.append(pool.submit(_validate, chunk, split))
                    while len(pending) > VALIDATION_THREADS:
                        send(pending.popleft().result())
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            while pending:  # the whole lines read before the damage are good events
                send(pending.popleft().result())
            raise InputError(
                f"{path}: the gzip stream is truncated or corrupt after line {stats.lines:,} ({exc}); "
                f"the {stats.accepted + stats.rejected:,} events before it were produced"
            ) from None
        while pending:
            send(pending.popleft().result())
    return stats

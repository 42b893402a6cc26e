"""JSON Lines in the event contract, checked a block at a time with Arrow: the importer's (and gateway's) fast path.

:func:`records_from_lines` turns bytes holding one event per line into
:data:`~metrics_lake.lake_schemas.log_records.LOG_RECORD` rows, in line order, with exactly
the outcome :func:`metrics_lake.lake_schemas.contract.to_log_records` gives line
by line (the same accepted values, the same reasons and raw payloads), at
the speed of Arrow's JSON reader:

1. Lines are split on ``\\n`` only (a trailing ``\\r`` is dropped), never on
   the other characters ``str.splitlines`` treats as line breaks (U+2028,
   U+0085, ``\\x0b``...), which may legally appear inside JSON strings.
   Whitespace-only lines are counted and skipped.
2. Lines that could hurt the parser, or cannot parse, go straight to the
   per-line validator: lines that do not start with ``{`` (no event does; a
   lone ``null`` line crashes Arrow's JSON reader, pyarrow 26) or do not end
   with ``}`` (cut short: an Arrow parse error costs far more than the line),
   more than :data:`MAX_BRACKETS` opening brackets (a deeply nested line
   crashes Arrow's JSON parser with a stack overflow, measured with pyarrow
   26; counting brackets, unlike estimating depth, cannot be fooled by
   brackets inside strings), more than :data:`MAX_LINE_BYTES` bytes, or
   bytes that are not UTF-8 (Arrow's JSON reader does not check them and
   would carry them into string columns).
3. The other lines are parsed in blocks by ``pyarrow.json`` (unless there
   are at most :data:`FEW_LINES`: then the per-line validator is faster
   than Arrow's fixed cost per call and per check, measured about 2 ms);
   lines that begin ``{"ts": "`` (an ISO time) apart from the others, since
   Arrow cannot put strings and numbers in one column. When a block
   does not parse (mixed types, a line that is not an object...) or yields
   more rows than lines, its lines that close an object and open another
   (two objects on one line, which Arrow reads as two rows) go line by line
   (looked for only then: the scan costs about 8 % of a clean block's parse),
   and the rest is streamed: the line an error names goes line by line and
   the rest is parsed again, so each line is parsed at most twice.
   Should rows and lines still differ, the block is split in halves, and
   parts of at most :data:`SMALL_BLOCK` lines that still fail go line by line.
4. The contract is checked on the Arrow columns (types, nulls, ranges, the
   metric pattern, server length, finite values, string-to-string tags,
   ISO-8601 times with a zone:
   :func:`~metrics_lake.lake_schemas.ndjson_columns.check_columns`); every
   row it rejects is validated again by the per-line validator, which gives
   the reason.

With ``dictionaries=True`` the rows come as :data:`CODED_LOG_RECORD`: the
``server`` and ``metric`` strings and the tags' names and values
dictionary-encoded, the way a segment stores them. The check hashes those
strings anyway (the metric rule is checked per distinct name), so the
importer's split by partition then moves an index per value instead of a
string, and the segment writer writes the indices as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from metrics_lake.lake_schemas.contract import to_log_records
from metrics_lake.lake_schemas.log_records import CODED_LOG_RECORD, LOG_RECORD
from metrics_lake.lake_schemas.ndjson_columns import check_columns

__all__ = ["MAX_BRACKETS", "MAX_LINE_BYTES", "LinesResult", "records_from_lines"]

#: Lines with more opening brackets than this are validated one by one (no event needs more than a few).
MAX_BRACKETS = 32
#: Lines longer than this (bytes) are validated one by one.
MAX_LINE_BYTES = 1 << 20
#: Lines up to this long cannot nest deeply enough to hurt the parser; longer ones have their brackets counted.
SHORT_LINE_BYTES = 1024
#: Up to this many lines, all go to the per-line validator (about 8 µs a line, below Arrow's fixed cost).
FEW_LINES = 128
#: Lines parsed by one call of Arrow's JSON reader (as one block, on the calling thread).
BLOCK_LINES = 1 << 16
#: Lines of the first block: a parse error there wastes a short parse only.
PROBE_LINES = 1 << 12
#: A failing block at most this long is validated line by line instead of being split further.
SMALL_BLOCK = 16
#: After a parse error, calls shrink to no fewer lines than this.
MIN_CALL_LINES = 256
#: Parse errors denser than one per this many lines send the rest of a block line by line: recovering from an
#: error costs an Arrow call (a fraction of a millisecond), the per-line validator some microseconds per line.
DENSE_ERROR_LINES = 64
DENSE_ERRORS = 4
#: Arrow's block size on the fast path (a line must fit in one block: more than MAX_LINE_BYTES).
FAST_BLOCK_BYTES = 2 << 20
#: Arrow's block size when a block of lines is streamed after a parse error: a bad line costs the rows
#: before it in its block (parsed again) and a new reader (about 0.1 ms), so smaller blocks waste less per
#: error, while Arrow's cost per block grows below 64 KiB (clean lines: 1.04 µs a line at 16 KiB, 0.86 at
#: 64 KiB). 32 KiB was fastest of 16/32/64 KiB on a file with one bad line in 1,000.
STREAM_BLOCK_BYTES = 32 << 10
#: An object closed and another opened on one line: Arrow would make two rows of it (JSON whitespace, no ``\n``).
_TWO_OBJECTS = re.compile(rb"\}[ \t\r]*\{")

_ERROR_ROW = re.compile(r"in row (\d+)")


@dataclass(frozen=True)
class LinesResult:
    """Records made of a block of lines, and line counts.

    ``rows``: the LOG_RECORD (or CODED_LOG_RECORD) rows, in any order; ``line_order``: each row's
    line number, or None when ``rows`` are in line order already;
    :attr:`records`: the rows in line order. A caller that reorders the rows
    anyway (the producer groups them by partition) passes ``rows`` and
    ``line_order`` on and spares a copy.
    """

    rows: pa.Table
    lines: int
    blank: int
    line_order: np.ndarray | None = None

    @cached_property
    def records(self) -> pa.Table:
        """The LOG_RECORD rows in line order."""
        if self.line_order is None:
            return self.rows
        return self.rows.take(pa.array(np.argsort(self.line_order, kind="stable")))

    @property
    def rejected(self) -> int:
        """Records that broke the contract (they carry a ``reason``)."""
        return self.rows.num_rows - self.rows.column("reason").null_count


def records_from_lines(
    data: bytes | bytearray, *, few_lines: int = FEW_LINES, use_threads: bool = True, dictionaries: bool = False
) -> LinesResult:
    """Validate newline-separated events in ``data`` into LOG_RECORD rows (module docstring); never raises for bad input.

    ``few_lines``: at most this many lines go to the per-line validator only
    (0: always try Arrow). ``use_threads``: Arrow's own threads parse clean
    blocks, for the latency of one call; a caller that validates on several
    threads itself (the importer) passes False, which spends less CPU per
    line (the threads' coordination: measured 2.70 -> 1.84 µs a line on
    clean lines, one call at a time). ``dictionaries``: the rows as
    :data:`CODED_LOG_RECORD` instead of :data:`LOG_RECORD` (the same values).
    """
    schema = CODED_LOG_RECORD if dictionaries else LOG_RECORD
    if not data:  # no lines; every step below may then index the buffer's first and last bytes
        return LinesResult(schema.empty_table(), 0, 0)
    buffer = np.frombuffer(data, dtype=np.uint8)
    newlines = _newlines(buffer)
    starts = np.concatenate([[0], newlines + 1])
    ends = np.concatenate([newlines, [len(buffer)]])
    if buffer[-1] == 10:  # a final newline ends the last line; it does not start another
        starts, ends = starts[:-1], ends[:-1]
    carriage = (ends > starts) & (buffer[np.maximum(ends - 1, 0)] == 13)
    ends = ends - carriage
    length = ends - starts
    # Blank: only whitespace (bytes.strip's set: \t \n \x0b \x0c \r and space). Events start with "{", so
    # only the few lines starting with whitespace, or empty, are looked at one by one.
    first = buffer[starts]  # a line starts before the end: a final newline starts none
    maybe_blank = (length <= 0) | (first == 32) | ((first >= 9) & (first <= 13))
    blank = np.zeros(len(starts), dtype=bool)
    for index in np.flatnonzero(maybe_blank).tolist():
        blank[index] = not data[starts[index] : ends[index]].strip()
    # Opening brackets of long lines only: Arrow's parser survives nesting 10,000 deep (crashes by 20,000, pyarrow
    # 26), so a line of at most SHORT_LINE_BYTES (at most half as deep) is safe whatever it holds.
    # 123: "{", 125: "}". A line that does not end an object (cut short, say) cannot parse: sending it one by one
    # up front spares Arrow's parser an error, which costs far more than the line (_parse_stream).
    last = buffer[np.maximum(ends - 1, 0)]
    heavy = ~blank & ((length > MAX_LINE_BYTES) | (first != 123) | (last != 125))
    for index in np.flatnonzero(~blank & ~heavy & (length > SHORT_LINE_BYTES)).tolist():
        line = data[starts[index] : ends[index]]
        heavy[index] = line.count(b"{") + line.count(b"[") > MAX_BRACKETS
    heavy[_lines_with_invalid_utf8(data, starts, ends)] = True
    lines = np.flatnonzero(~blank)
    if len(lines) <= few_lines:
        heavy[:] = True
    pieces: list[tuple[np.ndarray, pa.Table]] = []
    slow = list(lines[heavy[lines]])
    fast = lines[~heavy[lines]]
    # The contract allows ts as a string or a number, but a string after numbers is a parse error to Arrow
    # (one JSON column, one type): lines that visibly give ts a string are parsed as a group of their own.
    string_ts = _leading_string_times(buffer, starts, length)[fast]
    for group in (fast[~string_ts], fast[string_ts]):
        if len(group) <= few_lines:  # a few ISO times among numbers: below Arrow's fixed cost per call
            slow += group.tolist()
        else:
            slow += _parse_lines(data, starts, ends, group, pieces, use_threads, dictionaries)
    if slow:
        slow_lines = np.array(sorted(slow), dtype=np.int64)
        payloads = [bytes(data[starts[i] : ends[i]]) for i in slow_lines]  # the importer's chunks are bytearrays
        pieces.append((slow_lines, to_log_records(payloads).cast(schema)))
    if not pieces:
        return LinesResult(schema.empty_table(), len(starts), int(blank.sum()))
    order = np.concatenate([index for index, _ in pieces])
    rows = pa.concat_tables([table for _, table in pieces])
    in_order = not np.any(np.diff(order) < 0)  # else rejects or a group were validated apart
    return LinesResult(rows, len(starts), int(blank.sum()), None if in_order else order)


#: Bytes looked at in one step for newlines: the step's scratch mask stays in the CPU's cache.
NEWLINE_STEP_BYTES = 1 << 18


def _newlines(buffer: np.ndarray) -> np.ndarray:
    """Positions (int64) of the newlines in ``buffer`` (uint8), a step at a time.

    One mask of a whole chunk (32 MiB) would be fresh memory to fault in and
    write out to RAM; a step's mask is reused in cache (58 against 42 ns a
    line for the importer's chunks, measured).
    """
    scratch = np.empty(min(len(buffer), NEWLINE_STEP_BYTES), dtype=bool)
    found = []
    for start in range(0, len(buffer), NEWLINE_STEP_BYTES):
        step = buffer[start : start + NEWLINE_STEP_BYTES]
        mask = scratch[: len(step)]
        np.equal(step, 10, out=mask)
        found.append(np.flatnonzero(mask) + start)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _parse_lines(
    data: bytes | bytearray, starts, ends, lines: np.ndarray, pieces: list, use_threads: bool, dictionaries: bool
) -> list[int]:
    """Parse and check ``lines`` a block at a time into ``pieces``; return the lines to do one by one.

    Whole blocks in one read (with Arrow's threads if ``use_threads``)
    until a block has a parse error, which wastes that read: the first
    block is a short probe, and after an error the rest is streamed
    (:func:`_parse_stream`).
    """
    slow: list[int] = []
    whole, lo = True, 0
    while lo < len(lines):
        size = PROBE_LINES if lo == 0 else BLOCK_LINES
        block = lines[lo : lo + size]
        block_slow, whole = _parse_block(data, starts, ends, block, pieces, whole, use_threads, dictionaries)
        slow += block_slow
        lo += size
    return slow


#: How an event line usually begins (agents write ts first); the byte after it (or after one space) tells ts's type.
_TS_KEY = np.frombuffer(b'{"ts":', dtype=np.uint8)


def _leading_string_times(buffer: np.ndarray, starts: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Per line, whether it begins ``{"ts":`` and a string (``"``, after at most one space); vectorised.

    Lines that begin otherwise are False: they are parsed with the rest, and a string ts among numbers
    there costs a parse error, not a wrong result.
    """
    result = np.zeros(len(starts), dtype=bool)
    if len(buffer) < len(_TS_KEY) + 2:
        return result
    at = np.minimum(starts + len(_TS_KEY), len(buffer) - 2)  # where the value would begin
    after, second = buffer[at], buffer[at + 1]
    # A quote there first (34: '"', 32: space): usually few lines, whose key is then checked byte by byte.
    candidates = np.flatnonzero((length >= len(_TS_KEY) + 2) & ((after == 34) | ((after == 32) & (second == 34))))
    match = np.ones(len(candidates), dtype=bool)
    for k, byte in enumerate(_TS_KEY.tolist()):
        match &= buffer[starts[candidates] + k] == byte
    result[candidates[match]] = True
    return result


def _lines_with_invalid_utf8(data: bytes | bytearray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Indexes of the lines holding bytes that are not UTF-8: usually none, found with one decode of the block."""
    if data.isascii():  # the usual case, checked without decoding (a decode allocates the whole text)
        return np.zeros(0, dtype=np.int64)
    try:
        data.decode("utf-8")
        return np.zeros(0, dtype=np.int64)
    except UnicodeDecodeError:
        pass
    bad = []
    for index, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        try:
            data[start:end].decode("utf-8")
        except UnicodeDecodeError:
            bad.append(index)
    return np.array(bad, dtype=np.int64)


def _two_object_lines(data: bytes | bytearray, starts, ends, block: np.ndarray) -> np.ndarray:
    """Per line of ``block`` (ascending line numbers), whether it closes an object and opens another
    (:data:`_TWO_OBJECTS`): usually two objects on one line, rarely ``}{`` inside a string."""
    if not len(block):
        return np.zeros(0, dtype=bool)
    span = _TWO_OBJECTS.finditer(data, int(starts[block[0]]), int(ends[block[-1]]))
    positions = np.array([match.start() for match in span], dtype=np.int64)
    return np.isin(block, np.searchsorted(starts, positions, side="right") - 1)


def _join(data: bytes | bytearray, starts, ends, block: np.ndarray) -> tuple[pa.Buffer, np.ndarray]:
    """The lines ``block`` as one buffer, newline-separated, and the byte offset of each line in it.

    Runs of consecutive lines are sliced from ``data`` as they are (no copy
    when the block is one run); only the gaps cost a Python step.
    """
    breaks = np.flatnonzero(np.diff(block) != 1) + 1
    firsts = np.concatenate([[0], breaks]).astype(np.int64)
    lasts = np.concatenate([breaks, [len(block)]]).astype(np.int64) - 1
    run_starts, run_ends = starts[block[firsts]], ends[block[lasts]]
    base = np.concatenate([[0], np.cumsum(run_ends - run_starts + 1)[:-1]])
    run = np.repeat(np.arange(len(firsts)), lasts - firsts + 1)
    offsets = base[run] + starts[block] - run_starts[run]
    if len(firsts) == 1:
        return pa.py_buffer(data).slice(int(run_starts[0]), int(run_ends[0] - run_starts[0])), offsets
    with memoryview(data) as view:  # slices of a view are not copies: the join is the one copy
        joined = b"\n".join(
            [view[start:end] for start, end in zip(run_starts.tolist(), run_ends.tolist(), strict=True)]
        )
    return pa.py_buffer(joined), offsets


def _read(
    data: bytes | bytearray, starts, ends, block: np.ndarray, exact_rows: bool = True, use_threads: bool = False
) -> pa.Table:
    """Parse the lines ``block`` with Arrow: with ``exact_rows`` as one block, so an error names its row in the
    call; else in blocks of :data:`FAST_BLOCK_BYTES`, on Arrow's threads if ``use_threads``."""
    joined, _ = _join(data, starts, ends, block)
    if exact_rows:
        options = pj.ReadOptions(use_threads=False, block_size=max(joined.size + 1, 1 << 16))
    else:
        options = pj.ReadOptions(use_threads=use_threads, block_size=FAST_BLOCK_BYTES)
    return pj.read_json(pa.BufferReader(joined), read_options=options)


def _error_row(error: Exception) -> int | None:
    """The 0-based row an Arrow JSON error names (``... in row N``), or None."""
    match = _ERROR_ROW.search(str(error))
    return int(match.group(1)) if match else None


def _parse_block(
    data: bytes | bytearray,
    starts,
    ends,
    block: np.ndarray,
    pieces: list,
    whole: bool,
    use_threads: bool,
    dictionaries: bool,
) -> tuple[list[int], bool]:
    """Parse and check the lines ``block``; append (line numbers, records) to ``pieces``.

    Returns the lines to do one by one, and whether the next block should
    be tried whole first: only while no block had an error, since a failed
    whole read is wasted whole.
    """
    parsed: list[tuple[np.ndarray, pa.Table]] = []
    slow: list[int] | None = None
    if whole:  # the fast way first: Arrow's blocks (an error then names a row within a block only)
        try:
            table = _read(data, starts, ends, block, exact_rows=False, use_threads=use_threads)
            if table.num_rows == len(block):
                parsed, slow = [(block, table)], []
        except (pa.ArrowInvalid, ValueError, UnicodeDecodeError):
            pass
    if slow is None:
        whole = False
        slow = _parse_stream(data, starts, ends, block, parsed)
    if not parsed:
        return slow, whole
    try:  # one check for the block: Arrow unifies int64 with double and struct fields of the parts
        lines = np.concatenate([lines for lines, _ in parsed])
        table = pa.concat_tables([t for _, t in parsed], promote_options="permissive")
        # Rows must stay lines: parts without columns (lines of "{}") concatenate to no rows at all.
        groups = [(lines, table)] if table.num_rows == len(lines) else parsed
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        groups = parsed
    for lines, table in groups:
        accepted, records = check_columns(table, dictionaries)
        if records.num_rows:
            pieces.append((lines[accepted], records))
        slow += lines[~accepted].tolist()
    return slow, whole


def _dense_skip(block: np.ndarray, position: int, errors: list[int]) -> list[int]:
    """The next :data:`MIN_CALL_LINES` lines of ``block``, to go one by one, if parse errors are dense; else ``[]``.

    Dense: the last :data:`DENSE_ERRORS` errors (line positions in
    ``errors``, cleared when lines are skipped) fell within the last
    ``DENSE_ERRORS *`` :data:`DENSE_ERROR_LINES` lines.
    """
    if len(errors) >= DENSE_ERRORS and position - errors[-DENSE_ERRORS] < DENSE_ERRORS * DENSE_ERROR_LINES:
        errors.clear()
        return block[position : position + MIN_CALL_LINES].tolist()
    return []


def _parse_stream(data: bytes | bytearray, starts, ends, block: np.ndarray, parsed: list) -> list[int]:
    """Parse the lines ``block`` with Arrow's streaming JSON reader into ``parsed``; return the lines to do one by one.

    The reader parses :data:`STREAM_BLOCK_BYTES` at a time and yields each
    block's rows before it reaches the next, and an error names its row
    within the failing block: that line goes one by one, a new reader starts
    just after it, and the rows before it in that block are parsed again at
    the end, those of all errors in one call (:func:`_parse`): a bad line
    costs those rows twice and a reader's start (one block read ahead). An
    error naming no row (a field the reader's first block did not
    have: it fixes the schema) restarts the reader at the failing block, with
    the schema inferred anew. Where errors are dense (:func:`_dense_skip`)
    the next :data:`MIN_CALL_LINES` lines go one by one. Rows must be lines:
    lines that could hold two objects go one by one first (the reader would
    make two rows of each and match its rows to the wrong lines); should the
    counts still differ, the block goes to :func:`_parse`.
    """
    # Looked for here only: a block comes here when its whole read failed or gave more rows than lines.
    two = _two_object_lines(data, starts, ends, block)
    slow: list[int] = block[two].tolist()
    block = block[~two]
    if not len(block):
        return slow
    joined, offsets = _join(data, starts, ends, block)
    longest = int((ends[block] - starts[block]).max())
    options = pj.ReadOptions(use_threads=False, block_size=max(STREAM_BLOCK_BYTES, longest + 2))
    mine: list[tuple[np.ndarray, pa.Table]] = []
    dropped: list[np.ndarray] = []
    position, errors = 0, []
    while position < len(block):
        if skipped := _dense_skip(block, position, errors):
            slow += skipped
            position += len(skipped)
            continue
        batches, rows, error = [], 0, None
        try:
            for batch in pj.open_json(pa.BufferReader(joined.slice(int(offsets[position]))), read_options=options):
                batches.append(batch)
                rows += batch.num_rows
        except (pa.ArrowInvalid, ValueError, UnicodeDecodeError) as exc:
            error = exc
        row = _error_row(error) if error is not None else None
        remaining = len(block) - position
        # Rows are lines: the reader finished with all the rest, or stopped at a line within it.
        rows_are_lines = rows == remaining if error is None else rows + (row or 0) < remaining
        if not rows_are_lines:  # do not guess which line a row came from
            return _parse(data, starts, ends, block, parsed)
        if rows:
            mine.append((block[position : position + rows], pa.Table.from_batches(batches)))
        if error is None:
            break
        if row is None and rows == 0:  # the reader's first block fails without a row: the careful way
            slow += _parse(data, starts, ends, block[position:], mine)
            break
        position += rows
        if row is not None:
            if row:  # the failing block's rows before the bad line: good, but the reader dropped them
                dropped.append(block[position : position + row])
            errors.append(position + row)
            slow.append(int(block[position + row]))
            position += row + 1
    if dropped:  # parsed again in one call: Arrow's cost per call is more than a block's rows
        slow += _parse(data, starts, ends, np.concatenate(dropped), mine)
    parsed.extend(mine)
    return slow


def _parse(data: bytes | bytearray, starts, ends, block: np.ndarray, parsed: list) -> list[int]:
    """Parse the lines ``block`` into ``parsed`` (line numbers, table); return the lines to do one by one.

    Arrow parses a whole call before it reports an error, so after an error
    calls get smaller (a sixteenth, at least :data:`MIN_CALL_LINES` lines)
    and grow back (doubling) while they succeed: where bad lines are dense,
    an error wastes the parse of a small call only. On an error at a named
    row, the rows before it are parsed again, that line goes one by one and
    parsing resumes after it. An error without a row (two objects on one
    line) splits the call in halves instead. Where the last
    :data:`DENSE_ERRORS` errors fell within ``DENSE_ERRORS *``
    :data:`DENSE_ERROR_LINES` lines, the next :data:`MIN_CALL_LINES` lines
    go one by one without trying Arrow.
    """
    slow: list[int] = []
    size, position, errors = len(block), 0, []
    while position < len(block):
        if skipped := _dense_skip(block, position, errors):
            slow += skipped
            position += len(skipped)
            continue
        call = block[position : position + size]
        try:
            table = _read(data, starts, ends, call)
        except (pa.ArrowInvalid, ValueError, UnicodeDecodeError) as error:
            errors.append(position)
            row = _error_row(error)
            if row is None or not 0 <= row < len(call):
                slow += _halve(data, starts, ends, call, parsed)
            else:
                if row:
                    slow += _parse(data, starts, ends, call[:row], parsed)
                slow.append(int(call[row]))
                position += row + 1
                size = max(size // 16, MIN_CALL_LINES)
                continue
        else:
            if table.num_rows == len(call):
                parsed.append((call, table))
            else:  # two objects on one line: which one is unknown
                slow += _halve(data, starts, ends, call, parsed)
        position += len(call)
        size = min(size * 2, len(block))
    return slow


def _halve(data: bytes | bytearray, starts, ends, block: np.ndarray, parsed: list) -> list[int]:
    if len(block) <= SMALL_BLOCK:
        return block.tolist()
    half = len(block) // 2
    return _parse(data, starts, ends, block[:half], parsed) + _parse(data, starts, ends, block[half:], parsed)

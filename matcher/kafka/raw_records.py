"""Kafka's v2 record batches read from raw bytes, with header names kept as bytes.

aiokafka decodes every header name as UTF-8 and raises when one is not, in the middle of
a fetched batch (see ``matcher.kafka.fetch``). This module reads the same bytes without
deciding what a name means, so a record aiokafka refuses can still be handed over with its
key, value and headers, and the good records after it in the same batch are not lost.

It reads bytes that anybody with write access to a topic chose, so it is strict and
bounded: every length is checked against the bytes that are there, every loop consumes
input, and every failure is a ``RawRecordError`` (never an IndexError, a struct.error or a
codec's own exception). Format: https://kafka.apache.org/documentation/#recordbatch
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from aiokafka.record.util import calc_crc32c

from matcher.kafka import codecs

Header = tuple[bytes, bytes | None]

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# firstTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_LOG_OVERHEAD = 12  # baseOffset and batchLength: what batchLength does not count
_MAGIC_AT = 16  # where every message format version keeps its magic byte
_CRC_FROM = 21  # the CRC covers everything from the attributes on
_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
_CONTROL_MASK = 0x20
_ABORT = 0  # a control record's type: the transaction was aborted
_NOT_UTF8 = "header name is not UTF-8"


class RawRecordError(ValueError):
    """The bytes are not a record batch this module can read (the message says why)."""


@dataclass(frozen=True, slots=True)
class RawRecord:
    offset: int
    timestamp: int  # milliseconds; -1 when the record has none
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


@dataclass(frozen=True, slots=True)
class RawBatch:
    base_offset: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    record_count: int
    crc_ok: bool
    body: bytes  # the records, still compressed if the batch is

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_MASK)


@dataclass(frozen=True, slots=True)
class Piece:
    """One offset to hand over: a record (None when no byte of it could be read) and,
    when the client cannot decode it, why not."""

    offset: int
    record: RawRecord | None
    problem: str | None


@dataclass(frozen=True, slots=True)
class Located:
    """What the client met at a position it fails on: the pieces from that position on,
    where reading continues after them, and whether the bytes explain the failure."""

    pieces: tuple[Piece, ...]
    resume_at: int
    explained: bool


def iter_batches(data: bytes) -> Iterator[RawBatch]:
    """The complete batches in ``data`` (a fetch may end in a partial one: not an error)."""
    pos = 0
    while len(data) - pos >= _LOG_OVERHEAD:
        length = struct.unpack_from(">i", data, pos + 8)[0]
        if length < _HEADER.size - _LOG_OVERHEAD:
            raise RawRecordError(f"record batch length {length} is too short")
        end = pos + _LOG_OVERHEAD + length
        if end > len(data):
            return
        magic = data[pos + _MAGIC_AT]
        if magic != 2:
            raise RawRecordError(f"message format v{magic} is not read here")
        fields = _HEADER.unpack_from(data, pos)
        yield RawBatch(
            base_offset=fields[0],
            attributes=fields[5],
            last_offset_delta=fields[6],
            first_timestamp=fields[7],
            max_timestamp=fields[8],
            producer_id=fields[9],
            record_count=fields[12],
            crc_ok=calc_crc32c(data[pos + _CRC_FROM : end]) == fields[4],
            body=data[pos + _HEADER.size : end],
        )
        pos = end


def read_records(batch: RawBatch) -> tuple[list[RawRecord], RawRecordError | None]:
    """The batch's records, up to the first one that cannot be framed (then its error)."""
    try:
        body = _decompressed(batch)
    except RawRecordError as error:
        return [], error
    if batch.record_count < 0:
        return [], RawRecordError(f"negative record count {batch.record_count}")
    records: list[RawRecord] = []
    pos = 0
    try:
        # Bounded by the bytes as well as the count: each record takes at least one byte.
        for _ in range(batch.record_count):
            record, pos = _read_record(batch, body, pos)
            records.append(record)
        if pos != len(body):
            raise RawRecordError(f"{len(body) - pos} bytes left after the last record")
    except RawRecordError as error:
        return records, error
    return records, None


def problem_of(record: RawRecord) -> str | None:
    """Why aiokafka cannot decode this (well-framed) record, if it cannot."""
    for name, _ in record.headers:
        try:
            name.decode("utf-8")
        except UnicodeDecodeError:
            return _NOT_UTF8
    return None


def locate(
    data: bytes, position: int, aborted: Sequence[tuple[int, int]], read_committed: bool
) -> Located | None:
    """Walk fetched bytes the way aiokafka's fetcher does from ``position`` (CRC checks,
    aborted transactions, control batches, records below the position) to the batch it
    fails on. None when the bytes hold no such batch (nothing there, or only a part)."""
    cursor = position
    txns = _Transactions(aborted)
    try:
        for batch in iter_batches(data):
            if not batch.crc_ok:
                return _single(cursor, "record batch failed its CRC check")
            if read_committed and txns.skips(batch):
                cursor = max(cursor, batch.next_offset)
                continue
            if batch.is_control:
                cursor = max(cursor, batch.next_offset)
                continue
            found = _in_data_batch(batch, cursor)
            if found is not None:
                return found
            cursor = max(cursor, batch.next_offset)
    except RawRecordError as error:
        return _single(cursor, f"unreadable record batch: {error}")
    return None


def _single(offset: int, problem: str) -> Located:
    return Located((Piece(offset, None, problem[:200]),), offset + 1, explained=True)


def _in_data_batch(batch: RawBatch, cursor: int) -> Located | None:
    records, error = read_records(batch)
    problems = [problem_of(r) for r in records]
    handed = [i for i, r in enumerate(records) if r.offset >= cursor]
    first_bad = next((i for i, p in enumerate(problems) if p is not None), len(records))
    if error is None and first_bad == len(records):
        # All of it reads well: aiokafka passes this batch too, unless it failed on a
        # record here for a reason the bytes do not show (a deserializer, say).
        return _unexplained(records[handed[0]]) if handed else None
    if handed and handed[0] < first_bad:
        # A good record comes before the first bad one, so aiokafka would have returned
        # it: whatever failed, it is not what the bytes show.
        return _unexplained(records[handed[0]])
    pieces = tuple(Piece(records[i].offset, records[i], problems[i]) for i in handed)
    if error is not None:
        # Framing is lost after the last readable record: go on one offset at a time.
        if not pieces:
            return _single(cursor, f"unreadable record: {error}")
        return Located(pieces, pieces[-1].offset + 1, explained=True)
    after = pieces[-1].offset + 1 if pieces else cursor
    return Located(pieces, max(batch.next_offset, after), explained=True)


def _unexplained(record: RawRecord) -> Located:
    piece = Piece(record.offset, record, "the client failed on it; its bytes look valid")
    return Located((piece,), record.offset + 1, explained=False)


class _Transactions:
    """aiokafka's read_committed bookkeeping (``PartitionRecords._unpack_records``):
    producers with an aborted transaction in reach, until their abort marker."""

    def __init__(self, aborted: Sequence[tuple[int, int]]) -> None:
        self._pending = sorted(aborted, key=lambda entry: entry[1])
        self._aborted: set[int] = set()

    def skips(self, batch: RawBatch) -> bool:
        while self._pending and self._pending[0][1] <= batch.base_offset:
            self._aborted.add(self._pending.pop(0)[0])
        if batch.is_control and _is_abort_marker(batch):
            self._aborted.discard(batch.producer_id)
        return batch.is_transactional and batch.producer_id in self._aborted


def _is_abort_marker(batch: RawBatch) -> bool:
    records, error = read_records(batch)
    if not records:
        raise error or RawRecordError("control batch without records")
    key = records[0].key or b""
    if len(key) < 4:
        raise RawRecordError("control record key is too short")
    return bool(struct.unpack_from(">h", key, 2)[0] == _ABORT)


def _decompressed(batch: RawBatch) -> bytes:
    compression = batch.attributes & _CODEC_MASK
    if compression == 0:
        return batch.body
    try:  # bounded, as aiokafka's own readers are (matcher.kafka.codecs)
        return codecs.decode(compression, batch.body)
    except codecs.TooLarge as exc:
        raise RawRecordError(str(exc)) from exc
    except Exception as exc:  # each codec fails its own way; all of them mean "unreadable"
        raise RawRecordError(f"cannot decompress: {type(exc).__name__}") from exc


def _read_record(batch: RawBatch, body: bytes, pos: int) -> tuple[RawRecord, int]:
    length, pos = _varint(body, pos, len(body), 5)
    end = pos + length
    if length < 1 or end > len(body):
        raise RawRecordError(f"record length {length} does not fit")
    pos += 1  # attributes: one byte, unused by every format version so far
    ts_delta, pos = _varint(body, pos, end, 10)
    offset_delta, pos = _varint(body, pos, end, 5)
    key, pos = _nullable(body, pos, end)
    value, pos = _nullable(body, pos, end)
    count, pos = _varint(body, pos, end, 5)
    if count < 0:
        raise RawRecordError(f"negative header count {count}")
    headers: list[Header] = []
    for _ in range(count):  # each header takes at least two bytes of a bounded record
        name, pos = _nullable(body, pos, end)
        if name is None:
            raise RawRecordError("header without a name")
        header_value, pos = _nullable(body, pos, end)
        headers.append((name, header_value))
    if pos != end:
        raise RawRecordError(f"record has {end - pos} bytes more than it declares")
    if batch.attributes & _TIMESTAMP_TYPE_MASK:
        timestamp, timestamp_type = batch.max_timestamp, 1
    else:
        timestamp, timestamp_type = batch.first_timestamp + ts_delta, 0
    record = RawRecord(
        batch.base_offset + offset_delta, timestamp, timestamp_type, key, value, tuple(headers)
    )
    return record, pos


def _nullable(body: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = _varint(body, pos, end, 5)
    if length < 0:
        return None, pos  # Kafka reads any negative length as null, as aiokafka does
    if pos + length > end:
        raise RawRecordError(f"field of {length} bytes does not fit")
    return body[pos : pos + length], pos + length


def _varint(body: bytes, pos: int, end: int, most: int) -> tuple[int, int]:
    """A zigzag varint of at most ``most`` bytes (5 for Kafka's varint, 10 for varlong)."""
    result = 0
    for shift in range(0, 7 * most, 7):
        if pos >= end:
            raise RawRecordError("truncated varint")
        byte = body[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
    raise RawRecordError("varint too long")

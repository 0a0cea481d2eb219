"""The raw v2 record batch reader: it agrees with aiokafka on every batch aiokafka reads,
keeps header names as bytes where aiokafka gives up, and on any bytes at all it either
reads them or raises RawRecordError (never another exception, never a hang)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest
from aiokafka.record.default_records import (
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
    _DefaultRecordBatchBuilderPy,
)
from aiokafka.record.util import calc_crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matcher.kafka.raw_records import (
    RawRecordError,
    iter_batches,
    locate,
    problem_of,
    read_records,
)
from tests.support.records import RawHeaderName

# Hundreds of generated batches, each read twice: past the unit tier's 20 s on a busy machine.
pytestmark = pytest.mark.timeout(120)

Record = tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]
GZIP = 1
NOT_UTF8 = "header name is not UTF-8"


def build(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    compression: int = 0,
    python: bool = False,
    producer_id: int = -1,
    transactional: bool = False,
    extra_attributes: int = 0,
) -> bytes:
    """A batch as a producer writes it, then with the fields the broker sets."""
    builder_type = _DefaultRecordBatchBuilderPy if python else DefaultRecordBatchBuilder
    epoch = 0 if producer_id >= 0 else -1
    builder = builder_type(2, compression, int(transactional), producer_id, epoch, 0, 1 << 24)
    for i, (timestamp, key, value, headers) in enumerate(records):
        builder.append(i, timestamp=timestamp, key=key, value=value, headers=list(headers))
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    if extra_attributes:
        attributes = struct.unpack_from(">h", data, 21)[0] | extra_attributes
        struct.pack_into(">h", data, 21, attributes)
    return with_crc(data)


def with_crc(data: bytearray) -> bytes:
    """Recompute the CRC, so that mutated bytes get past it into the record parser."""
    if len(data) >= 61:
        struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


names = st.text(max_size=12)
headers = st.lists(st.tuples(names, st.none() | st.binary(max_size=20)), max_size=4)
records = st.lists(
    st.tuples(
        st.integers(0, 2**42),
        st.none() | st.binary(max_size=40),
        st.none() | st.binary(max_size=80),
        headers,
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    records,
    st.integers(0, 2**40),
    st.sampled_from([0, GZIP]),
    st.booleans(),
    st.booleans(),
)
def test_reads_what_aiokafka_reads(
    batch_records: list[Record], base: int, compression: int, python: bool, log_append: bool
) -> None:
    data = build(
        batch_records,
        base_offset=base,
        compression=compression,
        python=python,
        extra_attributes=0x08 if log_append else 0,
    )
    [batch] = list(iter_batches(data))
    ours, error = read_records(batch)
    assert error is None
    theirs = DefaultRecordBatch(data)
    assert batch.crc_ok
    assert theirs.validate_crc()
    expected = [
        (
            r.offset,
            r.timestamp,
            r.timestamp_type,
            r.key,
            r.value,
            [(k.encode(), v) for k, v in r.headers],
        )
        for r in theirs
    ]
    assert [
        (r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers)) for r in ours
    ] == expected
    assert batch.next_offset == theirs.next_offset
    assert all(problem_of(r) is None for r in ours)


def test_keeps_names_aiokafka_refuses() -> None:
    name = RawHeaderName(b"\xff\xfe-x")
    data = build(
        [(1, b"k", b"good", [("a", b"1")]), (2, None, b"bad", [("a", b"1"), (name, None)])],
        python=True,
    )
    with pytest.raises(UnicodeDecodeError):
        list(DefaultRecordBatch(data))
    [batch] = list(iter_batches(data))
    ours, error = read_records(batch)
    assert error is None
    assert ours[1].headers == ((b"a", b"1"), (b"\xff\xfe-x", None))
    assert [problem_of(r) for r in ours] == [None, NOT_UTF8]


def _bad_in_middle(base: int = 100) -> bytes:
    bad = [("n", b"v"), (RawHeaderName(b"\xc3\x28"), b"x")]
    batch = [(5, b"k", f"v{i}".encode(), bad if i in (2, 3) else [("n", b"v")]) for i in range(6)]
    return build(batch, base_offset=base, python=True)


def test_locate_at_the_bad_record_hands_over_the_rest_of_its_batch() -> None:
    found = locate(_bad_in_middle(), 102, [], read_committed=False)
    assert found is not None
    assert found.explained
    assert [(p.offset, p.problem) for p in found.pieces] == [
        (102, NOT_UTF8),
        (103, NOT_UTF8),
        (104, None),
        (105, None),
    ]
    assert found.pieces[0].record is not None
    assert found.pieces[0].record.value == b"v2"
    assert found.resume_at == 106


def test_locate_after_the_bad_record_hands_over_the_good_ones() -> None:
    # aiokafka fails here too: it decodes the records below the position as well.
    found = locate(_bad_in_middle(), 104, [], read_committed=False)
    assert found is not None
    assert found.explained
    assert found.resume_at == 106
    assert [(p.offset, p.problem) for p in found.pieces] == [(104, None), (105, None)]


def test_locate_where_a_good_record_comes_first_is_unexplained() -> None:
    # aiokafka would have returned record 101: what failed is not in the bytes.
    found = locate(_bad_in_middle(), 101, [], read_committed=False)
    assert found is not None
    assert not found.explained
    assert [p.offset for p in found.pieces] == [101]
    assert found.resume_at == 102


def test_locate_a_batch_failing_its_crc() -> None:
    data = bytearray(_bad_in_middle())
    data[-1] ^= 0x01
    found = locate(bytes(data), 103, [], read_committed=False)
    assert found is not None
    assert [(p.offset, p.record) for p in found.pieces] == [(103, None)]
    assert found.resume_at == 104


def test_locate_skips_aborted_transactions_and_control_batches() -> None:
    bad = [(RawHeaderName(b"\xff"), b"x")]
    aborted = build(
        [(1, None, b"a0", []), (1, None, b"a1", bad), (1, None, b"a2", [])],
        base_offset=0,
        python=True,
        producer_id=7,
        transactional=True,
    )
    marker = build(
        [(1, struct.pack(">hh", 0, 0), b"\x00\x00\x00\x00\x00\x00", [])],
        base_offset=3,
        producer_id=7,
        transactional=True,
        extra_attributes=0x20,
    )
    after = build([(1, None, b"c4", bad), (1, None, b"c5", [])], base_offset=4, python=True)
    data = aborted + marker + after
    skipping = locate(data, 1, [(7, 0)], read_committed=True)
    assert skipping is not None
    assert [(p.offset, p.problem) for p in skipping.pieces] == [(4, NOT_UTF8), (5, None)]
    reading = locate(data, 1, [(7, 0)], read_committed=False)
    assert reading is not None
    assert [(p.offset, p.problem) for p in reading.pieces] == [(1, NOT_UTF8), (2, None)]
    assert reading.resume_at == 3


def test_a_partial_batch_at_the_end_is_not_an_error() -> None:
    data = _bad_in_middle()
    assert list(iter_batches(data[:-1])) == []
    assert locate(data[:-1], 102, [], read_committed=False) is None


def resized(data: bytes, body: bytes) -> bytes:
    """The batch with another record body, its length and CRC made to match."""
    out = bytearray(data[:61] + body)
    struct.pack_into(">i", out, 8, len(out) - 12)
    return with_crc(out)


def test_framing_lost_after_a_bad_record() -> None:
    data = _bad_in_middle(base=0)
    cut = resized(data, data[61:-1])  # the last record no longer fits
    found = locate(cut, 2, [], read_committed=False)
    assert found is not None
    assert found.explained
    assert [(p.offset, p.problem) for p in found.pieces] == [
        (2, NOT_UTF8),
        (3, NOT_UTF8),
        (4, None),
    ]
    assert found.resume_at == 5  # then one offset at a time: the framing is lost
    rest = locate(cut, 5, [], read_committed=False)
    assert rest is not None
    assert [(p.offset, p.record) for p in rest.pieces] == [(5, None)]
    assert rest.resume_at == 6


def test_a_record_longer_than_its_fields() -> None:
    data = build([(1, None, b"x", [])])
    body = data[61:]
    assert body[0] < 0x40  # a one-byte varint: twice the length
    padded = resized(data, bytes([body[0] + 2]) + body[1:] + b"\x00")
    [batch] = list(iter_batches(padded))
    records, error = read_records(batch)
    assert records == []
    assert error is not None
    assert "more than it declares" in str(error)


def exercise(data: bytes, position: int, aborted: list[tuple[int, int]]) -> None:
    """Everything a fetch's bytes go through: only RawRecordError may come out."""
    try:
        for batch in iter_batches(data):
            read_records(batch)
    except RawRecordError:
        pass
    for read_committed in (False, True):
        found = locate(data, position, aborted, read_committed)
        if found is not None and found.pieces:
            assert found.resume_at > max(p.offset for p in found.pieces)
            assert all(p.offset >= position for p in found.pieces)


fuzz = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
aborted_lists = st.lists(st.tuples(st.integers(-1, 9), st.integers(-5, 50)), max_size=3)


@fuzz
@given(st.binary(max_size=3000), st.integers(-5, 50), aborted_lists)
def test_any_bytes(data: bytes, position: int, aborted: list[tuple[int, int]]) -> None:
    exercise(data, position, aborted)


@fuzz
@given(
    records,
    st.sampled_from([0, GZIP]),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
    st.integers(0, 10**6),
    st.integers(0, 20),
    aborted_lists,
    st.integers(0, 0x3F),
)
def test_mutated_batches(
    batch_records: list[Record],
    compression: int,
    flips: list[tuple[int, int]],
    cut: int,
    position: int,
    aborted: list[tuple[int, int]],
    attributes: int,
) -> None:
    """Valid batches with bytes changed (anywhere, attributes included), cut short, and
    the CRC made right again, so the damage reaches the record parser."""
    data = bytearray(build(batch_records, compression=compression, extra_attributes=attributes))
    for where, byte in flips:
        data[where % len(data)] = byte
    data = bytearray(data[: max(12, len(data) - cut % 8)]) if cut % 3 == 0 else data
    exercise(with_crc(data), position, aborted)
    exercise(with_crc(data) * 2, position, aborted)


@fuzz
@given(st.lists(st.integers(0, 255), max_size=30), st.integers(-(2**31), 2**31 - 1))
def test_damaged_record_bodies(body: list[int], count: int) -> None:
    """A well-formed batch header over record bytes of any kind, any record count."""
    data = bytearray(build([(1, None, b"x", [])]))
    data[61:] = bytes(body)
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">i", data, 57, count)
    exercise(with_crc(data), 0, [])

"""The bounded decoders: the same bytes as aiokafka's own, and a bomb stops at the bound."""

from __future__ import annotations

import os
import tracemalloc
import zlib
from collections.abc import Callable

import cramjam
import pytest
from aiokafka import codec
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from matcher.kafka import codecs

ENCODERS: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes, int], bytes]]] = {
    "gzip": (codec.gzip_encode, codecs.gzip),
    "snappy": (codec.snappy_encode, codecs.snappy),
    "snappy-raw": (lambda b: bytes(cramjam.snappy.compress_raw(b)), codecs.snappy),
    "lz4": (codec.lz4_encode, codecs.lz4),
    "zstd": (codec.zstd_encode, codecs.zstd),
}
MiB = 1024 * 1024


@pytest.mark.parametrize("name", sorted(ENCODERS))
@pytest.mark.parametrize("size", [1, 1000, 70_000, 3 * MiB])  # (no batch is empty)
def test_round_trip_within_the_bound(name: str, size: int) -> None:
    encode, decode = ENCODERS[name]
    payload = os.urandom(size // 2) + bytes(size - size // 2)
    assert decode(encode(payload), 4 * MiB) == payload


def _gzip_members(total: int, members: int) -> bytes:
    out = b""
    for _ in range(members):
        packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        out += packer.compress(bytes(total // members)) + packer.flush()
    return out


BOMBS: dict[str, Callable[[], bytes]] = {
    "gzip": lambda: _gzip_members(64 * MiB, 1),
    "gzip, many members": lambda: _gzip_members(64 * MiB, 64),
    "snappy": lambda: codec.snappy_encode(bytes(64 * MiB)),
    "snappy-raw": lambda: bytes(cramjam.snappy.compress_raw(bytes(64 * MiB))),
    "lz4": lambda: codec.lz4_encode(bytes(64 * MiB)),
    "zstd": lambda: codec.zstd_encode(bytes(64 * MiB)),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_bomb_stops_at_the_bound_without_holding_it(name: str) -> None:
    bomb = BOMBS[name]()
    decode = ENCODERS[name.split(",")[0]][1]
    tracemalloc.start()
    try:
        with pytest.raises(codecs.TooLarge):
            decode(bomb, 1 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB  # the 64 MiB were never held


def test_aiokafka_reads_batches_through_the_bound() -> None:
    builder = DefaultRecordBatchBuilder(2, 1, 0, -1, -1, -1, 1 << 26)
    for i in range(8):
        builder.append(i, timestamp=None, key=None, value=bytes(MiB), headers=[])
    data = bytes(builder.build())
    from aiokafka.record._crecords.default_records import DefaultRecordBatch

    codecs.install(4 * MiB)
    try:
        with pytest.raises(codecs.TooLarge):
            list(DefaultRecordBatch(data))
        codecs.install(16 * MiB)
        assert len(list(DefaultRecordBatch(data))) == 8
    finally:
        codecs.install()

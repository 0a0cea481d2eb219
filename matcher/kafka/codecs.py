"""Decompression with a bound, for record batches from writers nobody vouched for.

The broker bounds a record batch by its *compressed* size (``max.message.bytes``), and
aiokafka decompresses a whole batch into memory before reading its first record: a 1 MiB
gzip batch of zeros is a gigabyte, and the daemon, killed for its memory, would read the
same batch again on restart, for ever. So the decoders aiokafka's record readers call are
replaced by these, which stop at ``MATCHER_MAX_BATCH_BYTES`` and raise ``TooLarge``: the
fetcher (``matcher.kafka.fetch``) then takes the batch's records as undecodable, and the
partition moves on. Legitimate batches are far below the bound (a producer batch is
``batch.size``, 16 KiB by default, compressed a few times over).
"""

from __future__ import annotations

import functools
import importlib
import zlib
from collections.abc import Callable

import cramjam
from aiokafka.codec import _detect_xerial_stream

Buffer = bytes | bytearray | memoryview

DEFAULT_LIMIT = 64 * 1024 * 1024
_limit = DEFAULT_LIMIT  # what install() set; decode() uses it too
_XERIAL_HEADER = 16


class TooLarge(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the record batch decompresses to more than {limit} bytes")


def gzip(payload: Buffer, limit: int) -> bytes:
    out = bytearray()
    data = bytes(payload)
    while data:  # a gzip stream may hold several members, as gzip.GzipFile reads them
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += member.decompress(data, limit + 1 - len(out))
        if len(out) > limit or member.unconsumed_tail:
            raise TooLarge(limit)
        if not member.eof:
            raise ValueError("truncated gzip stream")
        data = member.unused_data
    return bytes(out)


def snappy(payload: Buffer, limit: int) -> bytes:
    data = bytes(payload)
    if not _detect_xerial_stream(data):
        return _snappy_raw(data, limit)
    out = bytearray()  # xerial framing: [4-byte big-endian length][snappy block] ...
    cursor = _XERIAL_HEADER
    while cursor < len(data):
        size = int.from_bytes(data[cursor : cursor + 4], "big")
        cursor += 4
        out += _snappy_raw(data[cursor : cursor + size], limit - len(out))
        cursor += size
    return bytes(out)


def _snappy_raw(data: bytes, limit: int) -> bytes:
    if cramjam.snappy.decompress_raw_len(data) > limit:  # the block declares its size
        raise TooLarge(limit)
    return bytes(cramjam.snappy.decompress_raw(data))


def _into(decompress_into: Callable[[bytes, bytearray], int], payload: Buffer, limit: int) -> bytes:
    """Decompress into a buffer that cannot grow past ``limit``: first one sized for an
    ordinary ratio (most batches), then, if that was too small, one of ``limit`` + 1."""
    data = bytes(payload)
    for size in (min(limit + 1, 64 * 1024 + 32 * len(data)), limit + 1):
        out = bytearray(size)
        try:
            written = decompress_into(data, out)
        except cramjam.DecompressionError:
            if size > limit:
                raise TooLarge(limit) from None  # (or corrupt: unreadable either way)
            continue
        if written > limit:
            raise TooLarge(limit)
        return bytes(out[:written])
    raise TooLarge(limit)


def lz4(payload: Buffer, limit: int) -> bytes:
    return _into(cramjam.lz4.decompress_into, payload, limit)


def zstd(payload: Buffer, limit: int) -> bytes:
    return _into(cramjam.zstd.decompress_into, payload, limit)


# Kafka's codec ids (the low bits of a record batch's attributes).
DECODERS: dict[int, Callable[[Buffer, int], bytes]] = {1: gzip, 2: snappy, 3: lz4, 4: zstd}
_NAMES = {"gzip_decode": gzip, "snappy_decode": snappy, "lz4_decode": lz4, "zstd_decode": zstd}
# aiokafka's record readers (compiled and pure-Python) look these names up at call time.
_READERS = (
    "aiokafka.record._crecords.default_records",
    "aiokafka.record.default_records",
    "aiokafka.record._crecords.legacy_records",
    "aiokafka.record.legacy_records",
)


def decode(codec: int, payload: Buffer) -> bytes:
    """Decompress with the installed bound; ValueError for an unknown codec."""
    decoder = DECODERS.get(codec)
    if decoder is None:
        raise ValueError(f"unknown compression type {codec}")
    return decoder(payload, _limit)


def install(limit: int = DEFAULT_LIMIT) -> None:
    """Make aiokafka's record readers decompress with ``limit`` (process-wide)."""
    global _limit
    _limit = limit
    for module_name in _READERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, decoder in _NAMES.items():
            if hasattr(module, name):
                setattr(module, name, functools.partial(decoder, limit=limit))

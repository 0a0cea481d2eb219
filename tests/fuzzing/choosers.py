"""Where the generator's decisions come from.

The generator in ``records`` asks only for integers, booleans and short byte strings, so
one generator serves three engines: hypothesis (which shrinks a failure to a small
example), a seeded ``random.Random`` (fast, for the long campaign) and atheris (coverage
guided: libFuzzer mutates the bytes a ``FuzzedDataProvider`` reads decisions from).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")


class Chooser(Protocol):
    def integer(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]; engines shrink towards ``lo``."""

    def boolean(self) -> bool: ...

    def raw(self, max_len: int) -> bytes:
        """Up to ``max_len`` arbitrary bytes."""

    def choice(self, seq: Sequence[T]) -> T:
        """One element of a non-empty ``seq``; engines shrink towards the first."""


class RandomChooser:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)

    def boolean(self) -> bool:
        return self._rng.random() < 0.5

    def raw(self, max_len: int) -> bytes:
        return self._rng.randbytes(self._rng.randint(0, max_len))

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self._rng.randrange(len(seq))]


class HypothesisChooser:
    """Draws from ``st.data()``; every decision is a draw, so failures shrink."""

    def __init__(self, data: st.DataObject) -> None:
        self._data = data

    def integer(self, lo: int, hi: int) -> int:
        return self._data.draw(st.integers(lo, hi))

    def boolean(self) -> bool:
        return self._data.draw(st.booleans())

    def raw(self, max_len: int) -> bytes:
        return self._data.draw(st.binary(max_size=max_len))

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self.integer(0, len(seq) - 1)]


class DataProvider(Protocol):
    """The part of ``atheris.FuzzedDataProvider`` the chooser uses (atheris' names)."""

    def ConsumeIntInRange(self, lo: int, hi: int) -> int: ...

    def ConsumeBool(self) -> bool: ...

    def ConsumeBytes(self, count: int) -> bytes: ...


class ProviderChooser:
    """Reads decisions from fuzzer bytes. Once they run out every answer is the lowest,
    so the generator's loops (all bounded by decisions) still end."""

    def __init__(self, provider: DataProvider) -> None:
        self._provider = provider

    def integer(self, lo: int, hi: int) -> int:
        return self._provider.ConsumeIntInRange(lo, hi)

    def boolean(self) -> bool:
        return self._provider.ConsumeBool()

    def raw(self, max_len: int) -> bytes:
        return self._provider.ConsumeBytes(self._provider.ConsumeIntInRange(0, max_len))

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self.integer(0, len(seq) - 1)]

"""Where a worker stands in each partition: the offsets it took, which are done, and so
the offset it may commit. Pure: no Kafka, no clock."""

from __future__ import annotations


class PartitionOffsets:
    """The offsets of one partition a worker has taken, in order, and which are done.

    The offset to commit is the lowest one not done yet (every offset before it is done),
    so a resume that waits for a retry, or whose handler is still running, holds the
    partition's commit point while the resumes after it (other runs') go on. After a crash
    those are read again and are duplicates, which ``advance`` makes harmless.
    """

    def __init__(self) -> None:
        self._taken: dict[int, bool] = {}  # offset -> done, in the order taken (ascending)
        self._after_done: int | None = None  # the offset after the last of the done prefix

    def take(self, offset: int) -> None:
        self._taken.setdefault(offset, False)

    def done(self, offset: int) -> None:
        if offset in self._taken:
            self._taken[offset] = True
            while self._taken:
                first = next(iter(self._taken))
                if not self._taken[first]:
                    break
                del self._taken[first]
                self._after_done = first + 1

    def committable(self) -> int | None:
        """The offset to commit (the next to read after a restart); None: nothing yet."""
        if self._taken:
            return next(iter(self._taken))
        return self._after_done

    def pending(self) -> int:
        return len(self._taken)

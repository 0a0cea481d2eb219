"""Where a resume worker stands in a partition: it commits up to the lowest offset not done,
whatever order resumes finish in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from matcher.sdk.worker.progress import PartitionOffsets


def test_nothing_taken_commits_nothing() -> None:
    assert PartitionOffsets().committable() is None


def test_a_resume_not_done_holds_the_commit_point() -> None:
    offsets = PartitionOffsets()
    for n in (10, 11, 12):
        offsets.take(n)
    offsets.done(11)
    offsets.done(12)
    assert offsets.committable() == 10  # 10 is retrying: 11 and 12 are read again
    offsets.done(10)
    assert offsets.committable() == 13
    assert offsets.pending() == 0


@given(st.permutations(list(range(30))), st.integers(0, 30))
def test_the_commit_point_is_the_lowest_offset_not_done(order: list[int], finished: int) -> None:
    offsets = PartitionOffsets()
    for n in range(30):
        offsets.take(100 + n)
    done = {100 + n for n in order[:finished]}
    for offset in done:
        offsets.done(offset)
    not_done = sorted(set(range(100, 130)) - done)
    expected = not_done[0] if not_done else 130
    assert offsets.committable() == expected
    assert all(o in done for o in range(100, expected))  # nothing before it is lost

"""`ensure_topics` waits for the brokers' metadata: the condition it waits on."""

from __future__ import annotations

from typing import Any

import pytest

from matcher.kafka import topics


class _Admin:
    """Answers describe_topics with each of ``answers`` in turn, then the last forever."""

    def __init__(self, answers: list[list[dict[str, Any]]]) -> None:
        self.answers = answers
        self.calls = 0

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return answer


def _topic(error: int, leaders: list[int], name: str = "t") -> dict[str, Any]:
    return {
        "error_code": error,
        "topic": name,
        "partitions": [{"partition": i, "leader": leader} for i, leader in enumerate(leaders)],
    }


@pytest.mark.parametrize(
    ("topic", "led"),
    [
        (_topic(0, [1, 2, 3]), True),
        (_topic(3, []), False),  # UNKNOWN_TOPIC_OR_PARTITION: not in this broker's cache yet
        (_topic(5, [1]), False),  # LEADER_NOT_AVAILABLE
        (_topic(0, [1, -1]), False),  # one partition without a leader yet
        (_topic(0, []), False),
    ],
)
def test_a_topic_is_usable_only_with_a_leader_for_every_partition(
    topic: dict[str, Any], led: bool
) -> None:
    assert topics._led(topic) is led


async def test_waits_until_every_topic_is_led() -> None:
    admin = _Admin([[_topic(3, [])], [_topic(0, [1, -1])], [_topic(0, [1, 1])]])
    await topics._until_led(admin, ["t"])
    assert admin.calls == 3


async def test_a_short_answer_is_not_taken_for_all_topics() -> None:
    # One topic, then the same topic twice (as many entries as names, not the names), then both.
    admin = _Admin(
        [[_topic(0, [1])], [_topic(0, [1]), _topic(0, [1])], [_topic(0, [1]), _topic(0, [1], "u")]]
    )
    await topics._until_led(admin, ["t", "u"])
    assert admin.calls == 3

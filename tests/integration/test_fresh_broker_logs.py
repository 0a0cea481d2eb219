"""A consumer group's first join on a brand-new broker: the broker creates its offsets
topic meanwhile, and until it has, aiokafka logs every retry of its coordinator look-up at
ERROR (GroupCoordinatorNotAvailableError). Each first start of a cluster logged errors
that needed no one; now the first is said once at INFO, and the others are dropped."""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer
from matcher_devstack.stack import Devstack, project_root

from matcher.kafka.topics import ensure_topics
from matcher.logs import COORDINATOR_LOGGER, CoordinatorStartFilter
from tests.support.kafka import started, within

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def fresh_broker() -> Iterator[str]:
    home = project_root() / ".devstack" / "tests" / uuid.uuid4().hex[:8]
    stack = Devstack(home=home, cache=Devstack().cache)
    try:
        stack.up()
        yield stack.env()["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_a_first_join_on_a_new_broker_logs_no_coordinator_error(fresh_broker: str) -> None:
    await ensure_topics({"bootstrap_servers": fresh_broker}, ["events"], partitions=1)
    logger = logging.getLogger(COORDINATOR_LOGGER)
    # A filter of its own: the process's one starts its grace at its first record.
    installed = list(logger.filters)
    for existing in installed:
        logger.removeFilter(existing)
    logger.addFilter(CoordinatorStartFilter())
    captured = _Records()
    logging.getLogger("aiokafka").addHandler(captured)
    try:
        consumer = AIOKafkaConsumer(
            "events", bootstrap_servers=fresh_broker, group_id=f"g-{uuid.uuid4().hex[:6]}"
        )
        async with started(consumer):
            await within(consumer.getmany(timeout_ms=100))
            assert consumer.assignment()
    finally:
        logging.getLogger("aiokafka").removeHandler(captured)
        logger.filters[:] = installed
    about_coordinator = [r for r in captured.records if "coordinator" in r.getMessage()]
    errors = [
        r.getMessage()
        for r in captured.records
        if r.levelno >= logging.ERROR and "CoordinatorNotAvailable" in r.getMessage()
    ]
    assert errors == []
    said = [r for r in about_coordinator if "not available yet" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in about_coordinator]
    assert said[0].levelno == logging.INFO

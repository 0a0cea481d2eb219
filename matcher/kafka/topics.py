"""Topic administration: create the events and resume topics when they are missing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError


async def ensure_topics(
    client_options: dict[str, Any],
    names: Iterable[str],
    *,
    partitions: int,
    replication_factor: int | None = None,
) -> list[str]:
    """Create each missing topic; return the names this call created.

    Without a ``replication_factor``, topics get three replicas, or one per broker on a
    cluster with fewer than three brokers (a development single node gets one).
    A topic that exists already is left as it is (its partition count included).
    """
    admin = AIOKafkaAdminClient(**client_options)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in dict.fromkeys(names) if name not in existing]
        if not missing:
            return []
        if replication_factor is None:
            cluster = await admin.describe_cluster()
            replication_factor = max(1, min(3, len(cluster["brokers"])))
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication_factor) for name in missing]
        )
        created: list[str] = []
        for topic_error in response.topic_errors:
            name, code = topic_error[0], topic_error[1]
            if code == 0:
                created.append(name)
            elif code != TopicAlreadyExistsError.errno:  # lost a race with another migrate
                message = topic_error[2] if len(topic_error) > 2 else ""
                raise RuntimeError(f"could not create topic {name!r}: error {code} {message}")
        return created
    finally:
        await admin.close()


async def delete_topics(client_options: dict[str, Any], names: Iterable[str]) -> None:
    """Delete topics that exist; the rest are ignored. For tests and the benchmark, which
    create topics by the hundred: a broker carrying thousands of dead partitions spends
    its heap and CPU on them and slows everything measured on it."""
    admin = AIOKafkaAdminClient(**client_options)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [name for name in dict.fromkeys(names) if name in existing]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()

"""Topic administration: create the events and resume topics when they are missing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from matcher.kafka.deadlines import close_admin

if TYPE_CHECKING:
    from matcher.config import Settings

# Event topics keep the broker's append time as each record's timestamp: the arrival the
# gate judges signature freshness against (a producer cannot choose it).
TIMESTAMP_TYPE = "message.timestamp.type"
EVENT_TOPIC_CONFIGS = {TIMESTAMP_TYPE: "LogAppendTime"}
# DescribeConfigs v1+: where a value comes from; 1 = set on this topic.
_DYNAMIC_TOPIC_CONFIG = 1
# The longest one of the functions here may talk to Kafka (start, requests, close).
ADMIN_TIMEOUT_S = 60.0


@contextlib.asynccontextmanager
async def _admin(client_options: dict[str, Any]) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client, closed when the block ends; the start and the block are
    bounded by ADMIN_TIMEOUT_S altogether (TimeoutError past it), the close too."""
    admin = AIOKafkaAdminClient(**client_options)
    try:
        async with asyncio.timeout(ADMIN_TIMEOUT_S):
            await admin.start()
            yield admin
    finally:
        await close_admin(admin, ADMIN_TIMEOUT_S)


async def ensure_topics(
    client_options: dict[str, Any],
    names: Iterable[str],
    *,
    partitions: int,
    replication_factor: int | None = None,
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """Create each missing topic (with ``configs[name]``); return the names created.

    Without a ``replication_factor``, topics get three replicas, or one per broker on a
    cluster with fewer than three brokers (a development single node gets one).
    A topic that exists already is left as it is (its partition count included).
    """
    async with _admin(client_options) as admin:
        existing = set(await admin.list_topics())
        missing = [name for name in dict.fromkeys(names) if name not in existing]
        if not missing:
            return []
        if replication_factor is None:
            cluster = await admin.describe_cluster()
            replication_factor = max(1, min(3, len(cluster["brokers"])))
        response = await admin.create_topics(
            [
                NewTopic(
                    name,
                    partitions,
                    replication_factor,
                    topic_configs=_with_durability(
                        (configs or {}).get(name, {}), replication_factor
                    ),
                )
                for name in missing
            ]
        )
        created: list[str] = []
        for topic_error in response.topic_errors:
            name, code = topic_error[0], topic_error[1]
            if code == 0:
                created.append(name)
            elif code != TopicAlreadyExistsError.errno:  # lost a race with another migrate
                message = topic_error[2] if len(topic_error) > 2 else ""
                raise RuntimeError(f"could not create topic {name!r}: error {code} {message}")
        await _until_led(admin, missing)
        return created


async def _until_led(admin: AIOKafkaAdminClient, names: list[str]) -> None:
    """Return once the broker's metadata has every one of ``names`` with a leader for
    each partition (bounded by the admin block's timeout).

    CreateTopics answers when the controller has the topic, before the brokers' metadata
    caches do: a `matcher run` (or a test) straight after could still be told the topic
    does not exist, and refuse to start. This asks one broker; on a cluster another may
    learn of the topic a moment later (the daemon's start check then fails with a clear
    message, and a restart succeeds).
    """
    delay = 0.05
    while True:
        led = {topic.get("topic") for topic in await admin.describe_topics(names) if _led(topic)}
        if led.issuperset(names):
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


def _led(topic: Mapping[str, Any]) -> bool:
    partitions = topic.get("partitions") or []
    return (
        topic.get("error_code") == 0
        and bool(partitions)
        and all(p.get("leader", -1) >= 0 for p in partitions)
    )


def min_insync_replicas(replication_factor: int) -> int | None:
    """What ``acks=all`` should wait for: with three replicas or more, two (a write then
    survives the loss of any one broker, and one broker may be down without stopping
    writes); below three, the broker's default (one)."""
    return 2 if replication_factor >= 3 else None


def _with_durability(configs: Mapping[str, str], replication_factor: int) -> dict[str, str]:
    chosen = dict(configs)
    wanted = min_insync_replicas(replication_factor)
    if wanted is not None:
        chosen.setdefault("min.insync.replicas", str(wanted))
    return chosen


async def delete_topics(client_options: dict[str, Any], names: Iterable[str]) -> None:
    """Delete topics that exist; the rest are ignored. For tests and the benchmark, which
    create topics by the hundred: a broker carrying thousands of dead partitions spends
    its heap and CPU on them and slows everything measured on it."""
    async with _admin(client_options) as admin:
        existing = set(await admin.list_topics())
        doomed = [name for name in dict.fromkeys(names) if name in existing]
        if doomed:
            await admin.delete_topics(doomed)


async def topic_configs(client_options: dict[str, Any], topic: str) -> dict[str, tuple[str, bool]]:
    """Every config of ``topic``: name to (value, set on the topic itself)."""
    async with _admin(client_options) as admin:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, None)]
        )
    found: dict[str, tuple[str, bool]] = {}
    for response in responses:
        for resource in response.resources:
            error_code, error_message = resource[0], resource[1]
            if error_code != 0:
                raise RuntimeError(f"cannot describe topic {topic!r}: {error_message}")
            for entry in resource[4]:
                name, value, source = entry[0], entry[1], entry[3]
                found[name] = (value, source == _DYNAMIC_TOPIC_CONFIG)
    return found


async def set_topic_config(
    client_options: dict[str, Any], topic: str, name: str, value: str
) -> None:
    """Set one config of ``topic``, keeping the others set on it.

    (The admin client has only the non-incremental AlterConfigs, which replaces every
    config set on the topic: the current ones are sent along.)
    """
    current = await topic_configs(client_options, topic)
    kept = {key: val for key, (val, own) in current.items() if own and val is not None}
    kept[name] = value
    async with _admin(client_options) as admin:
        responses = await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, kept)]
        )
    for response in responses:
        for resource in response.resources:
            if resource[0] != 0:
                raise RuntimeError(f"cannot set {name} on topic {topic!r}: {resource[1]}")


async def prepare_topics(settings: Settings) -> list[str]:
    """What ``matcher migrate`` does on Kafka: create the missing topics (the events topic
    with broker timestamps), and move an existing events topic to broker timestamps.
    Returns one line per thing done."""
    options = settings.kafka_client_options()
    names = [settings.events_topic, settings.resume_topic]
    if settings.dead_letter_topic is not None:
        names.append(settings.dead_letter_topic)
    created = await ensure_topics(
        options,
        names,
        partitions=settings.topic_partitions,
        replication_factor=settings.topic_replication_factor,
        configs={settings.events_topic: EVENT_TOPIC_CONFIGS},
    )
    done = [f"created topic {name} ({settings.topic_partitions} partitions)" for name in created]
    if settings.events_topic not in created:
        value, _ = (await topic_configs(options, settings.events_topic))[TIMESTAMP_TYPE]
        if value != "LogAppendTime":
            await set_topic_config(options, settings.events_topic, TIMESTAMP_TYPE, "LogAppendTime")
            done.append(
                f"set {TIMESTAMP_TYPE}=LogAppendTime on {settings.events_topic} (was {value}): "
                "signatures are judged fresh against the broker's arrival time"
            )
    return done


async def events_timestamp_type(settings: Settings) -> str | None:
    """The events topic's timestamp type, or None when it cannot be read."""
    try:
        configs = await topic_configs(settings.kafka_client_options(), settings.events_topic)
    except (RuntimeError, KafkaError, OSError):
        return None
    entry = configs.get(TIMESTAMP_TYPE)
    return None if entry is None else entry[0]

"""What the admin server's routes share: the settings, the database pool, and how to ask
the daemon's Kafka side about itself. Its own module, so that the API and the console
both depend on it rather than on each other."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings


@dataclass
class AdminState:
    settings: Settings
    pool: AsyncConnectionPool
    # Readiness of the Kafka side: partitions this daemon's consumer holds (None: not
    # in the group yet).
    assigned_partitions: Callable[[], int | None]
    kafka_reachable: Callable[[], Awaitable[bool]]

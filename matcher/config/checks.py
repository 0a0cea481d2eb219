"""What every settings model shares: the variables' prefix, the checks of addresses and
topics, and how a bad value becomes one line naming its variable."""

from __future__ import annotations

import re
from typing import Any

from matcher.logs import quoted

ENV_PREFIX = "MATCHER_"
# The admin token guards /v1 and the console: long enough that guessing it, even at the
# rate the throttle allows (matcher.admin.throttle), is hopeless; 32 hex digits are 128 bits.
ADMIN_TOKEN_MIN_LENGTH = 32
ADMIN_TOKEN_MIN_DISTINCT = 8

# libpq parameters every daemon connection gets unless the URL says otherwise.
CONNECTION_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}

# Kafka topic names: the broker's own rule (legal characters, at most 249 of them).
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
HOST_PORT_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


class ConfigError(Exception):
    """Raised with one human-readable line per bad setting."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def check_address(value: str) -> str:
    match = HOST_PORT_RE.match(value)
    if match is None or not 0 <= int(match.group(2)) <= 65535:
        raise ValueError("must be HOST:PORT (port 0: any free port)")
    return value


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def check_topic(value: str) -> str:
    if not _TOPIC_RE.match(value) or value in (".", ".."):
        raise ValueError("a Kafka topic name is 1-249 of the characters A-Z a-z 0-9 . _ -")
    return value


def describe_problem(error: Any) -> str:
    """One line for one pydantic error: the variable, the problem, and the given value."""
    loc = [str(part) for part in error.get("loc", ()) if part != "__root__"]
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if not loc:
        return message
    field = loc[0]
    variable = ENV_PREFIX + field.upper()
    if error.get("type") == "missing":
        return f"{variable}: required, not set"
    given = error.get("input")
    secret = any(word in field for word in ("password", "url", "secret", "token"))
    if given is None or secret or isinstance(given, dict):
        return f"{variable}: {message}"
    return f"{variable}: {message} (got {quoted(str(given))})"

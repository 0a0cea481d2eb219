"""A reconciler for the tests: answers by the idempotency key's prefix."""

from __future__ import annotations

from matcher.sdk import Found, Launch, NotFound, Unknown


async def lookup(launch: Launch) -> Found | NotFound | Unknown:
    key = launch.idempotency_key
    if key.startswith("found"):
        return Found(f"job-for-{key}")
    if key.startswith("missing"):
        return NotFound()
    if key.startswith("broken"):
        raise RuntimeError("the external system answered 500")
    return Unknown("the external system is down")

"""Replay from the console: the same store function as ``matcher quarantine replay``, with
the producer registry loaded as the CLI loads it (MATCHER_PRODUCERS_FILE, read now: the
file the daemon's registry watcher reloads from) and the daemon's policy."""

from __future__ import annotations

from typing import Any

from matcher.admin.state import AdminState
from matcher.auth.gate import judge as gate_judge
from matcher.auth.registry import Registry, RegistryError, load_registry
from matcher.domain.records import RawRecord
from matcher.store.replay import ReplayOutcome, replay


async def replay_records(
    state: AdminState, ids: list[int], reason: str | None
) -> tuple[list[ReplayOutcome], str | None]:
    """What replaying did per record, or why nothing was replayed."""
    settings = state.settings
    if settings.producers_file is None and not settings.allow_unsigned:
        return [], "MATCHER_PRODUCERS_FILE is not set: nothing to judge against"
    try:
        registry = load_registry(settings.producers_file) if settings.producers_file else Registry()
    except RegistryError as exc:
        return [], f"the producers file cannot be read: {exc}"
    policy = settings.policy()

    def judge(record: RawRecord) -> Any:
        return gate_judge(record, registry, policy)

    outcomes: list[ReplayOutcome] = []
    async with state.pool.connection() as conn:
        if ids:
            for record_id in ids:
                done = await replay(conn, judge, quarantine_id=record_id)
                outcomes += done or [
                    ReplayOutcome(
                        record_id, "not_replayable", "already replayed, or no such record"
                    )
                ]
        else:
            outcomes = await replay(conn, judge, reason=reason)
    return outcomes, None

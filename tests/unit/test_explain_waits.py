"""explain's words for the waits that say more: fan-in progress, heartbeats, conditions,
callbacks. Pure: facts in, verdict and reasons out."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from matcher.domain.events import StoredEvent
from matcher.domain.explain import ExplainFacts, Verdict, explain
from matcher.domain.waits import ConditionState, Wait, WaitState

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _wait(**extra: Any) -> Wait:
    fields: dict[str, Any] = {
        "id": uuid.uuid4(), "tenant": "acme", "run_id": "run-7", "position": 0,
        "event_types": ["job.completed"], "correlation_id": "job-a", "deadline": None,
        "external_job_id": None, "state": WaitState.WAITING,
        "created_at": NOW - timedelta(minutes=5), "resolved_at": None, "resolution": None,
        "resolved_by_producer": None, "resolved_by_event_id": None,
    }  # fmt: skip
    return Wait(**(fields | extra))


def _event(correlation: str = "job-a", **extra: Any) -> StoredEvent:
    fields: dict[str, Any] = {
        "producer": "billing", "event_id": str(uuid.uuid4()), "tenant": "acme",
        "type": "job.completed", "correlation_id": correlation, "external_job_id": None,
        "occurred_at": None, "received_at": NOW - timedelta(minutes=1), "kafka_topic": "t",
        "kafka_partition": 0, "kafka_offset": 1, "data": {}, "status": "pending",
        "consumed_by": None, "late_for": None,
    }  # fmt: skip
    return StoredEvent(**(fields | extra))


def _condition(index: int, correlation: str, state: str) -> ConditionState:
    return ConditionState(
        id=uuid.uuid4(),
        index=index,
        event_types=["job.completed"],
        correlation_id=correlation,
        state=state,
    )


def test_a_fan_in_wait_says_how_many_conditions_are_met_and_what_it_waits_for() -> None:
    conditions = [_condition(0, "job-a", "matched"), _condition(1, "job-b", "matched"),
                  _condition(2, "job-c", "waiting")]  # fmt: skip
    wait = _wait(needed=3, conditions=conditions)
    found = explain(ExplainFacts(now=NOW, wait=wait, events=[_event()], lag={}))
    assert found.verdict is Verdict.WAITING
    assert (
        "2 of 3 conditions met (all needed): waiting for job.completed on 'job-c' since "
        "2026-12-07T11:55:00Z" in found.reasons
    )
    assert [c["state"] for c in found.evidence["conditions"]] == ["matched"] * 2 + ["waiting"]


def test_a_fan_in_wait_with_nothing_arrived_names_every_correlation_id() -> None:
    conditions = [_condition(0, "job-a", "waiting"), _condition(1, "job-b", "waiting")]
    found = explain(ExplainFacts(now=NOW, wait=_wait(needed=1, conditions=conditions), lag={}))
    assert found.verdict is Verdict.MISSING_SIGNAL
    assert "nothing with correlation id 'job-a' or 'job-b' has arrived" in found.reasons


def test_an_event_that_failed_the_condition_is_a_mismatch_with_its_data() -> None:
    failed = _event(data={"status": "failed"})
    wait = _wait(condition='($."status" == "succeeded")')
    facts = ExplainFacts(
        now=NOW, wait=wait, events=[failed], lag={},
        condition_misses={(failed.producer, failed.event_id)},
    )  # fmt: skip
    found = explain(facts)
    assert found.verdict is Verdict.MISMATCH
    [mismatch] = found.evidence["mismatches"]
    assert (mismatch["differs"], mismatch["data"]) == ("condition", {"status": "failed"})


def test_a_heartbeat_is_described_and_one_come_due_is_a_backlog() -> None:
    progress = _event(type="job.progress")
    wait = _wait(progress_types=["job.progress"], heartbeat_interval_s=60.0,
                 heartbeat_due=NOW + timedelta(seconds=30), last_progress_at=NOW)  # fmt: skip
    progress = progress.model_copy(update={"progress_for": wait.id, "status": "progress"})
    found = explain(ExplainFacts(now=NOW, wait=wait, events=[progress], lag={}))
    assert found.verdict is Verdict.WAITING
    assert any("heartbeat every 60s on job.progress: 1 progress event(s)" in r
               for r in found.reasons)  # fmt: skip
    overdue = wait.model_copy(update={"heartbeat_due": NOW - timedelta(seconds=3)})
    behind = explain(ExplainFacts(now=NOW, wait=overdue, events=[progress], lag={}))
    assert behind.verdict is Verdict.BACKLOG
    assert "its heartbeat came due 3.0s ago but the sweeper has not timed it out" in (
        behind.reasons
    )


def test_a_heartbeat_timeout_says_so() -> None:
    wait = _wait(state=WaitState.TIMED_OUT, resolved_at=NOW, resolution="heartbeat",
                 heartbeat_interval_s=60.0, last_progress_at=NOW - timedelta(minutes=2),
                 progress_types=["job.progress"])  # fmt: skip
    found = explain(ExplainFacts(now=NOW, wait=wait))
    assert found.verdict is Verdict.TIMED_OUT
    assert "its heartbeat was missed (no progress for 60s" in found.reasons[0]


def test_a_callbacks_event_is_named_without_a_kafka_position() -> None:
    wait = _wait(state=WaitState.MATCHED, resolved_at=NOW, resolution="event",
                 resolved_by_producer="callback", resolved_by_event_id="w-1")  # fmt: skip
    winner = _event(producer="callback", event_id="w-1", kafka_topic=None,
                    kafka_partition=None, kafka_offset=None, status="consumed")  # fmt: skip
    found = explain(ExplainFacts(now=NOW, wait=wait, events=[winner]))
    assert found.reasons[0] == "resolved by event callback/w-1 (received 2026-12-07T11:59:00Z)"

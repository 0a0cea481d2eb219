"""The worker SDK: what an agent worker imports to wait durably and resume exactly once.

    from matcher.sdk import WaitSpec, register_wait, parse_resume, advance

    with psycopg.connect(url) as conn, conn.transaction():
        save_my_run_state(conn, ...)
        register_wait(conn, WaitSpec(tenant="acme", run_id="r1", position=3,
                                     event_types=["job.completed", "job.failed"],
                                     correlation_id=correlation_id))
    # ... the worker goes away; later, any worker reads the resume topic:
    resume = parse_resume(message.value)
    with psycopg.connect(url) as conn:
        if advance(conn, resume):        # True once per resolution, whatever the redeliveries
            continue_run(resume)         # resume.event says which event resolved the wait

Importing it starts nothing: no daemon, no Kafka client.
"""

from matcher.domain.launches import Found, Launch, LaunchSpec, LaunchState, NotFound, Unknown
from matcher.domain.resume import ResumeData, ResumeEvent
from matcher.domain.waits import Outcome, Wait, WaitSpec, WaitState
from matcher.sdk.resumes import parse_resume
from matcher.store.launches import audit_trail, get_launch, record_job_id, record_launch
from matcher.store.waits import (
    UnverifiedResume,
    advance,
    advance_async,
    cancel_wait,
    get_wait,
    list_waits,
    register_wait,
    register_wait_async,
    verify_resume,
    verify_resume_async,
)

__all__ = [
    "Found",
    "Launch",
    "LaunchSpec",
    "LaunchState",
    "NotFound",
    "Outcome",
    "ResumeData",
    "ResumeEvent",
    "Unknown",
    "UnverifiedResume",
    "Wait",
    "WaitSpec",
    "WaitState",
    "advance",
    "advance_async",
    "audit_trail",
    "cancel_wait",
    "get_launch",
    "get_wait",
    "list_waits",
    "parse_resume",
    "record_job_id",
    "record_launch",
    "register_wait",
    "register_wait_async",
    "verify_resume",
    "verify_resume_async",
]

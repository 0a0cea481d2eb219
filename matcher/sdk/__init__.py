"""The worker SDK: what an agent worker imports to wait durably and resume exactly once.

    from matcher.sdk import WaitSpec, register_wait

    with psycopg.connect(url) as conn, conn.transaction():
        save_my_run_state(conn, ...)
        register_wait(conn, WaitSpec(tenant="acme", run_id="r1", position=3,
                                     event_types=["job.completed", "job.failed"],
                                     correlation_id=correlation_id))
    # ... the worker goes away; later, the resume worker calls your handler with the
    # transaction that advances the run (matcher.sdk.worker, or `matcher worker`):

    async def handle(tx, resume):          # resume.event says which event resolved the wait
        await continue_run(tx, resume)     # commits with the advance, or neither does

Every call goes through the worker API in SQL (functions matcher.*_v1), in the caller's
transaction; each has an ``_async`` twin for asyncio workers. Importing this starts
nothing: no daemon, no Kafka client.
"""

from matcher.domain.callbacks import callback_url
from matcher.domain.launches import Found, Launch, LaunchSpec, LaunchState, NotFound, Unknown
from matcher.domain.resume import NotAResume, ResumeData, ResumeEvent
from matcher.domain.waits import Outcome, Wait, WaitSpec, WaitState
from matcher.sdk.resumes import parse_resume
from matcher.store.launches import (
    audit_trail,
    audit_trail_async,
    get_launch,
    get_launch_async,
    record_job_id,
    record_job_id_async,
    record_launch,
    record_launch_async,
)
from matcher.store.recovery import (
    retry_parked,
    retry_parked_async,
    unadvanced_resolutions,
    unadvanced_resolutions_async,
)
from matcher.store.waits import (
    advance,
    advance_async,
    cancel_wait,
    cancel_wait_async,
    committed_resume,
    committed_resume_async,
    get_wait,
    get_wait_async,
    issue_callback,
    issue_callback_async,
    list_waits,
    list_waits_async,
    register_wait,
    register_wait_async,
    verify_resume,
    verify_resume_async,
)
from matcher.store.worker_api import Unadvanced, UnverifiedResume

__all__ = [
    "Found",
    "Launch",
    "LaunchSpec",
    "LaunchState",
    "NotAResume",
    "NotFound",
    "Outcome",
    "ResumeData",
    "ResumeEvent",
    "Unadvanced",
    "Unknown",
    "UnverifiedResume",
    "Wait",
    "WaitSpec",
    "WaitState",
    "advance",
    "advance_async",
    "audit_trail",
    "audit_trail_async",
    "callback_url",
    "cancel_wait",
    "cancel_wait_async",
    "committed_resume",
    "committed_resume_async",
    "get_launch",
    "get_launch_async",
    "get_wait",
    "get_wait_async",
    "issue_callback",
    "issue_callback_async",
    "list_waits",
    "list_waits_async",
    "parse_resume",
    "record_job_id",
    "record_job_id_async",
    "record_launch",
    "record_launch_async",
    "register_wait",
    "register_wait_async",
    "retry_parked",
    "retry_parked_async",
    "unadvanced_resolutions",
    "unadvanced_resolutions_async",
    "verify_resume",
    "verify_resume_async",
]

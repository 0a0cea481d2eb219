"""The Restate peer's service, an ASGI app served over HTTP/2 (hypercorn) and registered
with the server as a deployment:

- ``BenchWaiter``: a workflow whose run awaits the durable promise ``completion``; its
  shared handler ``complete`` resolves it (also before the run has started).
- ``BenchAwakeable``: a workflow whose run creates an awakeable, keeps its id in state
  (``awakeable``), and awaits it; it is resolved over the ingress by that id.

Both runs suspend after one idle second (``inactivity_timeout``), as a run waiting long
for its event is suspended; the benchmark resolves them once they are.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import restate

IDLE = timedelta(seconds=1)

waiter = restate.Workflow("BenchWaiter")
awakeable = restate.Workflow("BenchAwakeable")


@waiter.main(inactivity_timeout=IDLE)
async def run(ctx: restate.WorkflowContext) -> str:
    event: dict[str, Any] = await ctx.promise("completion", type_hint=dict).value()
    return str(event["status"])


@waiter.handler()
async def complete(ctx: restate.WorkflowSharedContext, event: dict[str, Any]) -> None:
    await ctx.promise("completion", type_hint=dict).resolve(event)


@awakeable.main(name="run", inactivity_timeout=IDLE)
async def run_awakeable(ctx: restate.WorkflowContext) -> str:
    name, future = ctx.awakeable(type_hint=dict)
    ctx.set("awakeable", name)
    event: dict[str, Any] = await future
    return str(event["status"])


app = restate.app(services=[waiter, awakeable])

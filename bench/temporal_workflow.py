"""The Temporal peer's workflow, in a module of its own: the workflow sandbox re-imports the
module a workflow is defined in, so it imports nothing but the SDK."""

from __future__ import annotations

from typing import Any

from temporalio import workflow


@workflow.defn
class Waiter:
    """Waits for one completion signal, as a run waits for its external event."""

    def __init__(self) -> None:
        self.event: dict[str, Any] | None = None

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.event is not None)
        assert self.event is not None
        return str(self.event["status"])

    @workflow.signal
    def completion(self, event: dict[str, Any]) -> None:
        self.event = event

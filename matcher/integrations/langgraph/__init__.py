"""LangGraph on matcher: a node waits for an external job or event without holding a
worker, and the graph is resumed exactly once when it comes (``pip install
'matcher[langgraph]'``).

- ``Waits`` (in nodes): ``launch_and_wait`` / ``alaunch_and_wait`` record a launch, start
  the job at most once and wait for its completion; ``wait_for_event`` / ``await_event``
  wait for an event someone else sends. Each returns the resume when the node runs again.
- ``GraphResumer`` / ``SyncGraphResumer`` (in the resume worker): resume the interrupt that
  waits for the resume's wait, by its id, with the checkpoint and the run's advance in one
  transaction.

See docs/workers/langgraph.md.
"""

from matcher.integrations.langgraph.keys import NotInANode
from matcher.integrations.langgraph.resumer import (
    GraphResumer,
    NotBoundToTheWorker,
    NotThisResumersRun,
    SyncGraphResumer,
)
from matcher.integrations.langgraph.waits import ForeignResume, KeyReused, Waits, transaction

__all__ = [
    "ForeignResume",
    "GraphResumer",
    "KeyReused",
    "NotBoundToTheWorker",
    "NotInANode",
    "NotThisResumersRun",
    "SyncGraphResumer",
    "Waits",
    "transaction",
]

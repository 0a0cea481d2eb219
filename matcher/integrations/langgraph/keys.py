"""Where a wait stands in a LangGraph thread: the matcher run a node's wait belongs to.

Each wait a node makes is a run of its own at position 0, named from the thread and a key
for the wait's place in the graph: the step (LangGraph numbers a thread's steps in order,
and a step re-run after a rollback has the same number), the task's path (the node, or
the index of the ``Send``), the namespace's node names (a subgraph's), and the wait's
order among the node's waits. LangGraph's own task ids are not used for the top level:
they derive from a checkpoint id that is new each time a step is run again, so a resumer
attempt rolled back after a launch would launch again under a new key.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from langgraph.config import get_config

# The waits a node execution has made so far: (its scratchpad, how many). The scratchpad
# is new for each execution of a task (and each retry), so the count restarts with it.
_COUNT: ContextVar[tuple[object, int] | None] = ContextVar("matcher_langgraph_waits", default=None)


class NotInANode(RuntimeError):
    """A matcher wait was asked for outside a LangGraph node with a checkpointer and a
    thread id."""


@dataclass(frozen=True)
class Place:
    """The thread and the key of one wait of one node execution."""

    thread_id: str
    key: str

    def run_id(self, prefix: str) -> str:
        return f"{prefix}{self.thread_id}/{self.key}"


def _stable(part: Any) -> str:
    """A path element as text that is the same in every process (no object addresses)."""
    if isinstance(part, str | int | bool) or part is None:
        return repr(part)
    if isinstance(part, tuple | list):
        return "(" + ",".join(_stable(p) for p in part) + ")"
    return type(part).__name__


def _namespace(ns: str) -> str:
    """The namespace with the top level's task id left out; a subgraph's parent levels
    keep theirs (a subgraph's steps restart in each parent task)."""
    levels = ns.split("|")
    return "|".join([*levels[:-1], levels[-1].split(":", 1)[0]])


def key_of(ns: str, step: int, path: Any, index: int) -> str:
    text = "\x1f".join((_namespace(ns), str(step), _stable(path), str(index)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def run_id_of(prefix: str, thread_id: str, key: str) -> str:
    return f"{prefix}{thread_id}/{key}"


def thread_of(prefix: str, run_id: str) -> str | None:
    """The thread a run id names, or None when it is not one of ``prefix``'s."""
    if not run_id.startswith(prefix):
        return None
    thread, sep, key = run_id[len(prefix) :].rpartition("/")
    if not sep or not thread or len(key) != 32:
        return None
    return thread


def next_place() -> Place:
    """The place of the wait the calling node makes now (counting its earlier ones)."""
    try:
        config = get_config()
    except RuntimeError as exc:
        raise NotInANode("a matcher wait must be made inside a LangGraph node") from exc
    conf = config.get("configurable", {})
    meta = config.get("metadata", {})
    thread_id = conf.get("thread_id")
    if thread_id is None or "langgraph_step" not in meta:
        raise NotInANode("a matcher wait needs a graph with a checkpointer and a thread_id")
    scratchpad = conf.get("__pregel_scratchpad")
    if scratchpad is None:
        raise NotInANode("a matcher wait must be made while a LangGraph node runs")
    seen = _COUNT.get()
    index = seen[1] if seen is not None and seen[0] is scratchpad else 0
    _COUNT.set((scratchpad, index + 1))
    ns = str(conf.get("checkpoint_ns", ""))
    key = key_of(ns, int(meta["langgraph_step"]), meta.get("langgraph_path"), index)
    return Place(str(thread_id), key)

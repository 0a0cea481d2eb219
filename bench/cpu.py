"""Where the machine's CPU goes during a measurement: the daemon, Postgres, Kafka, and the
benchmark's own processes, each read from /proc at the start and the end of the window.

On a 2-core machine that runs all of them, matcher's throughput is bounded by the CPU it
costs per event wherever that CPU is spent, and its latency tail by how busy the machine
is; these figures say which. The servers are found by the port they listen on, so the
meter needs no help from whatever started them; a server that is not on this machine
(or whose process cannot be read) is left out, and the results say so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

_TICK = os.sysconf("SC_CLK_TCK")
_LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp
_TREE_READ_TRIES = 5


def _stat_fields(pid: int, task: Path | None = None) -> list[str]:
    """The fields of a process's stat (or of one of its threads', ``task``) after
    "pid (command) ": the state is field 3 (1-based, man 5 proc), so index 0."""
    stat = ((task or Path(f"/proc/{pid}")) / "stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


def _own_and_reaped_s(pid: int) -> tuple[float, float]:
    fields = _stat_fields(pid)
    # utime, stime, cutime, cstime: fields 14 to 17 (1-based, man 5 proc).
    own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    return own / _TICK, reaped / _TICK


def process_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds."""
    return _own_and_reaped_s(pid)[0]


def named_threads(pid: int, prefixes: tuple[str, ...]) -> list[Path]:
    """The /proc directories of ``pid``'s threads whose names start with one of
    ``prefixes`` (Linux keeps a thread's name to 15 characters)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().startswith(prefixes):
                found.append(task)
        except OSError:
            continue  # the thread exited meanwhile
    return found


def threads_ticks(pid: int, prefixes: tuple[str, ...]) -> dict[str, int]:
    """utime + stime, in clock ticks, of each thread of ``pid`` named as ``named_threads``
    finds them, by thread id; a thread that exits between the two reads is left out."""
    ticks = {}
    for task in named_threads(pid, prefixes):
        try:
            fields = _stat_fields(pid, task)
        except OSError:
            continue
        ticks[task.name] = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def ticks_to_s(ticks: int) -> float:
    return ticks / _TICK


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat_fields(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    return found


def tree_cpu_s(pid: int) -> float:
    """The CPU of a forking server (Postgres: one process per connection) up to now: its
    own, its live children's, and its exited children's (in the parent's cutime).

    A child that exits while its siblings are read is either read live or found in the
    parent's cutime, never neither nor both: the parent is read before and after the
    children, and the reading is taken again when a child was reaped in between."""
    for _ in range(_TREE_READ_TRIES):
        _, reaped_before = _own_and_reaped_s(pid)
        live = 0.0
        for child in _children(pid):
            try:
                live += process_cpu_s(child)
            except OSError:
                continue  # exited and reaped: in the parent's cutime, read again below
        own, reaped = _own_and_reaped_s(pid)
        if reaped == reaped_before:
            break
    # Children exiting all the time: off by at most the ones reaped during the last try.
    return own + reaped + live


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine, or None."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(entry.name)
        except OSError:
            continue  # not ours to read, or gone
    return None


def port_of(address: str, default: int) -> int:
    """The port of a database URL or of the first ``host:port`` of a bootstrap list."""
    first = address.split(",")[0]
    parsed = urlsplit(first if "//" in first else f"//{first}")
    return parsed.port or default


Reader = Callable[[], float]


@dataclass(frozen=True)
class Window:
    """CPU seconds per component over one window, and the window's wall time."""

    cpu_s: dict[str, float]
    wall_s: float

    def cores(self) -> dict[str, float]:
        """Each component's share of the window, in cores (1.0 = one core all along)."""
        return {name: s / self.wall_s for name, s in self.cpu_s.items()}

    def us_per_event(self, events: int) -> dict[str, float]:
        return {name: 1e6 * s / events for name, s in self.cpu_s.items()}


class Meter:
    """Reads each component's CPU at ``start()`` and again at ``stop()``."""

    def __init__(self, readers: Mapping[str, Reader], clock: Callable[[], float]) -> None:
        self._readers = dict(readers)
        self._clock = clock
        self._started: tuple[float, dict[str, float]] | None = None

    def _read(self) -> dict[str, float]:
        values = {}
        for name, read in self._readers.items():
            try:
                values[name] = read()
            except OSError:
                continue  # a process that is gone has no figure for this window
        return values

    @property
    def started(self) -> bool:
        return self._started is not None

    def start(self) -> None:
        self._started = (self._clock(), self._read())

    def stop(self) -> Window:
        if self._started is None:
            raise RuntimeError("the meter was stopped before it was started")
        began, before = self._started
        after = self._read()
        cpu = {name: after[name] - before[name] for name in before if name in after}
        return Window(cpu, max(self._clock() - began, 1e-9))


def server_readers(database_url: str, kafka_bootstrap: str) -> dict[str, Reader]:
    """Readers for the Postgres and Kafka servers, where they run on this machine."""
    readers: dict[str, Reader] = {}
    pg = listening_pid(port_of(database_url, 5432))
    if pg is not None:
        readers["postgres"] = lambda: tree_cpu_s(pg)
    kafka = listening_pid(port_of(kafka_bootstrap, 9092))
    if kafka is not None:
        readers["kafka"] = lambda: process_cpu_s(kafka)
    return readers


def own_cpu_s() -> float:
    """This process's CPU (all its threads; not its children)."""
    t = os.times()
    return t.user + t.system


def processes_cpu_s(pids: Iterable[int]) -> float:
    return sum(process_cpu_s(pid) for pid in pids)

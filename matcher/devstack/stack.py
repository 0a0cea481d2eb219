"""The local stack: one Kafka broker and one Postgres server under a project-local directory.

Everything lives in ``.devstack/`` at the project root (or ``MATCHER_DEVSTACK_DIR``):
``stack.json`` remembers the ports so the services come back where clients expect them,
``kafka/`` and ``postgres/`` hold each service's data and log, and ``cache/`` holds the
Kafka jars (or ``MATCHER_DEVSTACK_CACHE``, so several stacks share one download).
Every operation holds a file lock, so concurrent ``up`` calls cannot start two brokers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from matcher.devstack import kafka, postgres
from matcher.devstack.procs import DevstackError, free_port, port_in_use

DEFAULT_TIMEOUT = 120.0


def project_root(start: Path | None = None) -> Path:
    """The nearest directory upward holding pyproject.toml or .git; else the start."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pyproject.toml").exists() or (candidate / ".git").exists():
            return candidate
    return here


def default_home() -> Path:
    configured = os.environ.get("MATCHER_DEVSTACK_DIR")
    return Path(configured).resolve() if configured else project_root() / ".devstack"


@dataclass
class Ports:
    kafka: int
    kafka_controller: int
    postgres: int


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    pid: int | None
    address: str
    log: str


class Devstack:
    def __init__(self, home: Path | None = None, cache: Path | None = None) -> None:
        self.home = (home or default_home()).resolve()
        cache_env = os.environ.get("MATCHER_DEVSTACK_CACHE")
        self.cache = (cache or (Path(cache_env) if cache_env else self.home / "cache")).resolve()
        self.kafka = kafka.KafkaPaths(home=self.home / "kafka", cache=self.cache)
        self.postgres = postgres.PostgresPaths(home=self.home / "postgres")

    @property
    def _state_file(self) -> Path:
        return self.home / "stack.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.home.mkdir(parents=True, exist_ok=True)
        # Searchable by the unprivileged account Postgres runs as when we are root.
        self.home.chmod(0o755)
        with (self.home / ".lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def ports(self) -> Ports | None:
        try:
            return Ports(**json.loads(self._state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _choose_ports(self) -> Ports:
        """Keep the remembered ports unless a stranger took one while we were down."""
        remembered = self.ports()
        if remembered is None:
            ports = Ports(free_port(), free_port(), free_port())
        else:
            ports = remembered
            if kafka.running_pid(self.kafka) is None:
                if port_in_use(ports.kafka):
                    ports.kafka = free_port()
                if port_in_use(ports.kafka_controller):
                    ports.kafka_controller = free_port()
            if postgres.running_pid(self.postgres) is None and port_in_use(ports.postgres):
                ports.postgres = free_port()
        self._state_file.write_text(json.dumps(asdict(ports)) + "\n")
        return ports

    def up(self, *, fresh: bool = False, timeout: float = DEFAULT_TIMEOUT) -> Ports:
        """Start both services (idempotent); with ``fresh``, wipe their data first."""
        with self._locked():
            if fresh:
                self._stop_all()
                for path in (self.kafka.home, self.postgres.home, self._state_file):
                    if path.is_dir():
                        shutil.rmtree(path)
                    else:
                        path.unlink(missing_ok=True)
            ports = self._choose_ports()
            postgres.start(self.postgres, ports.postgres, timeout=timeout)
            kafka.start(self.kafka, ports.kafka, ports.kafka_controller, timeout=timeout)
            return ports

    def _stop_all(self) -> None:
        problems: list[str] = []
        try:
            kafka.stop(self.kafka)
        except DevstackError as exc:
            problems.append(str(exc))
        try:
            postgres.stop(self.postgres)
        except DevstackError as exc:
            problems.append(str(exc))
        if problems:
            raise DevstackError("\n".join(problems))

    def down(self) -> None:
        """Stop both services; their data stays for the next ``up``."""
        with self._locked():
            self._stop_all()

    def status(self) -> list[ServiceStatus]:
        ports = self.ports()
        kafka_pid = kafka.running_pid(self.kafka)
        pg_pid = postgres.running_pid(self.postgres)
        return [
            ServiceStatus(
                "kafka",
                kafka_pid is not None,
                kafka_pid,
                f"127.0.0.1:{ports.kafka}" if ports else "-",
                str(self.kafka.log),
            ),
            ServiceStatus(
                "postgres",
                pg_pid is not None,
                pg_pid,
                f"127.0.0.1:{ports.postgres}" if ports else "-",
                str(self.postgres.log),
            ),
        ]

    def env(self) -> dict[str, str]:
        """The MATCHER_* variables that point a client at this stack."""
        ports = self.ports()
        if ports is None:
            raise DevstackError(f"no devstack at {self.home}: run `matcher devstack up` first")
        return {
            "MATCHER_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{ports.kafka}",
            "MATCHER_DATABASE_URL": postgres.url(ports.postgres),
        }


def as_json(statuses: list[ServiceStatus]) -> list[dict[str, Any]]:
    return [asdict(s) for s in statuses]

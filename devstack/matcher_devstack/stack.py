"""The local stack: Kafka and Postgres under a project-local directory.

By default one Kafka broker and one Postgres server. In cluster mode (``up --brokers 3``,
``up --standby``, or both) three brokers with a dedicated controller, and a Postgres
primary with a synchronous streaming standby, for failover tests; the verbs that break
things on purpose (stop, pause a broker; fail the primary over) live here too.

Everything lives in ``.devstack/`` at the project root (or ``MATCHER_DEVSTACK_DIR``):
``stack.json`` remembers the mode and the ports so the services come back where clients
expect them, ``kafka/`` and ``postgres/`` (in cluster mode ``kafka-<node id>/``,
``kafka-controller/``, ``postgres-<n>/``) hold each service's data and log, and ``cache/``
holds the Kafka jars (or ``MATCHER_DEVSTACK_CACHE``, so several stacks share one download).
Every operation that changes the stack holds a file lock, so concurrent ``up`` calls cannot
start two brokers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from matcher_devstack import kafka, postgres
from matcher_devstack.procs import DevstackError, DevstackUsageError, free_port, port_in_use

DEFAULT_TIMEOUT = 120.0
CLUSTER_BROKERS = 3


def is_project_root(directory: Path) -> bool:
    """Whether ``directory`` is a checkout's root (.git) or matcher's (its pyproject.toml);
    a subproject's own pyproject.toml (producers/python, devstack) is neither."""
    if (directory / ".git").exists():
        return True
    try:
        project = tomllib.loads((directory / "pyproject.toml").read_text())
    except (OSError, ValueError):
        return False
    return bool(project.get("project", {}).get("name") == "matcher")


def project_root(start: Path | None = None) -> Path:
    """The nearest directory upward that is a project's root; else the start."""
    here = (start or Path.cwd()).resolve()
    return next((c for c in (here, *here.parents) if is_project_root(c)), here)


def default_home(start: Path | None = None) -> Path:
    """MATCHER_DEVSTACK_DIR when set; else the .devstack/ of the nearest directory upward
    that has one or is a project's root, so a stack is found from anywhere inside its
    project, and a .devstack/ above the project (a checkout inside another one, a stack
    left in a parent directory) is not taken for a fresh clone's."""
    configured = os.environ.get("MATCHER_DEVSTACK_DIR")
    if configured:
        return Path(configured).resolve()
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / ".devstack").is_dir() or is_project_root(candidate):
            return candidate / ".devstack"
    return here / ".devstack"


@dataclass
class Ports:
    """The single stack's ports (in cluster mode: the first broker's, the primary's)."""

    kafka: int
    kafka_controller: int
    postgres: int


@dataclass(frozen=True)
class Mode:
    brokers: int = 1
    standby: bool = False

    @property
    def single(self) -> bool:
        return self.brokers == 1 and not self.standby

    def flags(self) -> str:
        """The ``up`` options that ask for this mode."""
        parts = [f"--brokers {self.brokers}"] if self.brokers != 1 else []
        return " ".join([*parts, "--standby"] if self.standby else parts)

    def describe(self) -> str:
        kafka_part = "one Kafka broker" if self.brokers == 1 else f"{self.brokers} Kafka brokers"
        pg_part = "a Postgres primary with a standby" if self.standby else "one Postgres"
        return f"{kafka_part} and {pg_part}"


@dataclass
class Broker:
    node_id: int
    port: int


@dataclass
class PgNode:
    """One Postgres server: ``node`` names its directory (postgres-<node>) and its
    application_name (pg<node>); ``role`` is primary, standby, or detached (a former
    primary that failed over and awaits ``rejoin``)."""

    node: int
    port: int
    role: str

    @property
    def name(self) -> str:
        return f"pg{self.node}"


@dataclass
class State:
    mode: Mode
    brokers: list[Broker]
    controller_port: int
    postgres: list[PgNode] = field(default_factory=list)  # the primary first

    @property
    def primary(self) -> PgNode:
        return self.postgres[0]

    def to_json(self) -> dict[str, Any]:
        if self.mode.single:  # the single stack's file, as it has always been
            return asdict(self.ports())
        return {
            "mode": asdict(self.mode),
            "brokers": [asdict(b) for b in self.brokers],
            "controller_port": self.controller_port,
            "postgres": [asdict(n) for n in self.postgres],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        if "mode" not in data:
            ports = Ports(**data)
            return cls(
                Mode(),
                [Broker(1, ports.kafka)],
                ports.kafka_controller,
                [PgNode(1, ports.postgres, "primary")],
            )
        return cls(
            Mode(**data["mode"]),
            [Broker(**b) for b in data["brokers"]],
            int(data["controller_port"]),
            [PgNode(**n) for n in data["postgres"]],
        )

    def ports(self) -> Ports:
        return Ports(self.brokers[0].port, self.controller_port, self.primary.port)

    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers)

    def database_url(self) -> str:
        if not self.mode.standby:
            return postgres.url(self.primary.port)
        return postgres.multi_host_url([n.port for n in self.postgres])


def _distinct_free_ports(count: int, taken: set[int]) -> list[int]:
    chosen: list[int] = []
    while len(chosen) < count:
        port = free_port()
        if port not in taken and port not in chosen:
            chosen.append(port)
    return chosen


def new_state(mode: Mode) -> State:
    """Fresh ports for every service of ``mode``."""
    brokers = mode.brokers
    nodes = 2 if mode.standby else 1
    ports = _distinct_free_ports(brokers + 1 + nodes, set())
    return State(
        mode,
        [Broker(i + 1, ports[i]) for i in range(brokers)],
        ports[brokers],
        [
            PgNode(i + 1, ports[brokers + 1 + i], "primary" if i == 0 else "standby")
            for i in range(nodes)
        ],
    )


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    pid: int | None
    address: str
    log: str
    kind: str = ""  # kafka or postgres
    node_id: int | None = None  # a broker's node id (the controller's is 0); a Postgres node
    port: int | None = None
    role: str = ""  # broker, controller, broker+controller; primary, standby, detached
    paused: bool = False  # a broker stopped with SIGSTOP (pause-broker)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP interrupt like Ctrl-C does, so ``finally`` blocks run."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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

    # Where each node keeps its files.

    def broker_paths(self, state: State, node_id: int) -> kafka.KafkaPaths:
        if state.mode.brokers == 1:
            return self.kafka
        return kafka.KafkaPaths(home=self.home / f"kafka-{node_id}", cache=self.cache)

    @property
    def controller_paths(self) -> kafka.KafkaPaths:
        return kafka.KafkaPaths(home=self.home / "kafka-controller", cache=self.cache)

    def pg_paths(self, state: State, node: PgNode) -> postgres.PostgresPaths:
        if not state.mode.standby:
            return self.postgres
        return postgres.PostgresPaths(home=self.home / f"postgres-{node.node}")

    def _service_dirs(self) -> list[Path]:
        """Every directory a service of any mode keeps here (not the jar cache)."""
        found = [self.kafka.home, self.postgres.home, self.controller_paths.home]
        for pattern in ("kafka-[0-9]*", "postgres-[0-9]*"):
            found.extend(sorted(self.home.glob(pattern)))
        return found

    # The remembered state and the mode of the data already here.

    def state(self) -> State | None:
        try:
            return State.from_json(json.loads(self._state_file.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _save(self, state: State) -> None:
        self._state_file.write_text(json.dumps(state.to_json()) + "\n")

    def ports(self) -> Ports | None:
        state = self.state()
        return state.ports() if state is not None else None

    def _data_mode(self) -> tuple[int | None, bool | None]:
        """The broker count and whether there is a standby, as the data on disk says
        (None: no data of that service)."""
        brokers: int | None = None
        numbered = [p for p in self.home.glob("kafka-[0-9]*") if (p / "data").is_dir()]
        if numbered:
            brokers = len(numbered)
        elif (self.kafka.data / "meta.properties").exists():
            brokers = 1
        standby: bool | None = None
        if any((p / "data" / "PG_VERSION").exists() for p in self.home.glob("postgres-[0-9]*")):
            standby = True
        elif (self.postgres.data / "PG_VERSION").exists():
            standby = False
        return brokers, standby

    def _resolve_mode(
        self, brokers: int | None, standby: bool | None, *, check: bool = True
    ) -> Mode:
        """The mode asked for: what the options say, the rest as the stack already is;
        with ``check``, refuse a mode that the data here does not have."""
        if brokers is not None and brokers not in (1, CLUSTER_BROKERS):
            raise DevstackUsageError(f"--brokers {brokers}: the devstack runs 1 or 3 brokers")
        remembered = self.state()
        has_brokers: int | None
        has_standby: bool | None
        if remembered is not None:
            has_brokers, has_standby = remembered.mode.brokers, remembered.mode.standby
        else:
            has_brokers, has_standby = self._data_mode()
        want = Mode(
            brokers if brokers is not None else (has_brokers or 1),
            standby if standby is not None else bool(has_standby),
        )
        clash = (has_brokers is not None and has_brokers != want.brokers) or (
            has_standby is not None and has_standby != want.standby
        )
        if check and clash:
            have = Mode(has_brokers or want.brokers, bool(has_standby))
            again = f"matcher devstack up --fresh {want.flags()}".rstrip()
            raise DevstackUsageError(
                f"the devstack at {self.home} holds the data of {have.describe()}, not "
                f"{want.describe()}: start over with `{again}` (wipes it; or "
                "`matcher devstack down --purge` first), or keep it with `matcher devstack up`"
            )
        return want

    def _choose_state(self, mode: Mode) -> State:
        """Keep the remembered ports unless a stranger took one while we were down."""
        state = self.state()
        if state is None or state.mode != mode:
            state = new_state(mode)
        else:
            taken = {b.port for b in state.brokers} | {n.port for n in state.postgres}
            taken.add(state.controller_port)
            for broker in state.brokers:
                paths = self.broker_paths(state, broker.node_id)
                if kafka.running_pid(paths) is None and port_in_use(broker.port):
                    broker.port = _distinct_free_ports(1, taken)[0]
                    taken.add(broker.port)
            controller = self.kafka if mode.brokers == 1 else self.controller_paths
            if kafka.running_pid(controller) is None and port_in_use(state.controller_port):
                state.controller_port = _distinct_free_ports(1, taken)[0]
                taken.add(state.controller_port)
            for node in state.postgres:
                running = postgres.running_pid(self.pg_paths(state, node)) is not None
                if not running and port_in_use(node.port):
                    node.port = _distinct_free_ports(1, taken)[0]
                    taken.add(node.port)
        self._save(state)
        return state

    def _require(self) -> State:
        state = self.state()
        if state is None:
            raise DevstackError(f"no devstack at {self.home}: run `matcher devstack up` first")
        return state

    @contextlib.contextmanager
    def _locked_existing(self) -> Iterator[None]:
        """The lock of a stack that exists (taking it would create the directory)."""
        self._require()
        with self._locked():
            yield

    # Up and down.

    def up(
        self,
        *,
        fresh: bool = False,
        brokers: int | None = None,
        standby: bool | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Ports:
        """Start every service (idempotent); with ``fresh``, wipe their data first. The
        mode is what ``brokers`` and ``standby`` ask, else the stack's own, else single;
        without ``fresh``, asking for another mode than the data here has is refused."""
        with self._locked():
            # Fresh data, the same mode unless the options ask for another.
            mode = self._resolve_mode(brokers, standby, check=not fresh)
            if fresh:
                self._stop_all()
                self._wipe()
            state = self._choose_state(mode)
            if state.mode.brokers == 1:
                self._start_postgres(state, timeout)
                kafka.start(
                    self.kafka, state.brokers[0].port, state.controller_port, timeout=timeout
                )
            else:
                # The JVMs warm up while Postgres starts.
                nodes = self._cluster_nodes(state)
                launched = kafka.launch_cluster(
                    nodes, state.controller_port, brokers=state.mode.brokers
                )
                self._start_postgres(state, timeout)
                kafka.wait_cluster(nodes, launched, timeout=timeout)
            self._save(state)
            return state.ports()

    def _cluster_nodes(self, state: State) -> list[tuple[kafka.KafkaPaths, kafka.ClusterNode]]:
        nodes = [
            (
                self.controller_paths,
                kafka.ClusterNode(kafka.CONTROLLER_NODE_ID, state.controller_port),
            )
        ]
        for broker in state.brokers:
            nodes.append(
                (
                    self.broker_paths(state, broker.node_id),
                    kafka.ClusterNode(broker.node_id, broker.port),
                )
            )
        return nodes

    def _start_postgres(self, state: State, timeout: float) -> None:
        if not state.mode.standby:
            postgres.start(self.postgres, state.primary.port, timeout=timeout)
            return
        primary, other = state.postgres
        primary_paths, other_paths = self.pg_paths(state, primary), self.pg_paths(state, other)
        has_standby = other.role == "standby" and (other_paths.data / "PG_VERSION").exists()
        # No synchronous standby named until one streams: a commit would wait for it.
        postgres.start(
            primary_paths,
            primary.port,
            timeout=timeout,
            extra_config=postgres.replication_config(
                name=primary.name, sync_standby=other.name if has_standby else None
            ),
        )
        if not (other_paths.data / "PG_VERSION").exists():
            postgres.base_backup(other_paths, primary.port, timeout=timeout)
            other.role = "standby"
            self._save(state)
        elif other.role == "detached":
            self._rewind(state, other, timeout)
        self._start_standby(state, timeout)

    def _rewind(self, state: State, node: PgNode, timeout: float) -> str:
        paths = self.pg_paths(state, node)
        # A former primary must never run beside the new one.
        postgres.kill(paths)
        done = postgres.rewind(paths, state.primary.port, timeout=timeout)
        node.role = "standby"
        self._save(state)
        return done

    def _start_standby(self, state: State, timeout: float) -> None:
        """Start the standby, wait until it streams, then make it the synchronous one."""
        primary, other = state.postgres
        postgres.start(
            self.pg_paths(state, other),
            other.port,
            timeout=timeout,
            extra_config=postgres.replication_config(name=other.name, primary_port=primary.port),
            standby=True,
        )
        postgres.wait_streaming(primary.port, other.name, sync=False, timeout=timeout)
        postgres.write_config(
            self.pg_paths(state, primary),
            primary.port,
            postgres.replication_config(name=primary.name, sync_standby=other.name),
        )
        postgres.reload(primary.port, "synchronous_standby_names", other.name, timeout=timeout)
        postgres.wait_streaming(primary.port, other.name, sync=True, timeout=timeout)

    def _all_kafka(self) -> tuple[list[kafka.KafkaPaths], list[kafka.KafkaPaths]]:
        """The brokers of any mode, then the controllers (stopped after the brokers)."""
        brokers = [
            self.kafka,
            *(kafka.KafkaPaths(p, self.cache) for p in sorted(self.home.glob("kafka-[0-9]*"))),
        ]
        return brokers, [self.controller_paths]

    def _all_postgres(self) -> list[postgres.PostgresPaths]:
        state = self.state()
        found = [self.postgres]
        if state is not None and state.mode.standby:  # the primary first
            found.extend(self.pg_paths(state, n) for n in state.postgres)
        found.extend(postgres.PostgresPaths(p) for p in sorted(self.home.glob("postgres-[0-9]*")))
        unique: list[postgres.PostgresPaths] = []
        for paths in found:
            if paths not in unique:
                unique.append(paths)
        return unique

    def _stop_all(self) -> None:
        problems: list[str] = []
        brokers, controllers = self._all_kafka()
        for group in (brokers, controllers):
            try:
                kafka.stop_many(group)
            except DevstackError as exc:
                problems.append(str(exc))
        for paths in self._all_postgres():
            try:
                postgres.stop(paths)
            except DevstackError as exc:
                problems.append(str(exc))
        if problems:
            raise DevstackError("\n".join(problems))

    def _wipe(self) -> None:
        for path in (*self._service_dirs(), self._state_file):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)

    def down(self, *, purge: bool = False) -> None:
        """Stop every service; their data stays for the next ``up`` unless ``purge``."""
        with self._locked():
            self._stop_all()
            if purge:
                self._wipe()

    # What runs where.

    def status(self) -> list[ServiceStatus]:
        state = self.state()
        if state is None:
            return self._unknown_status()
        found: list[ServiceStatus] = []
        for broker in state.brokers:
            paths = self.broker_paths(state, broker.node_id)
            single = state.mode.brokers == 1
            found.append(
                self._kafka_status(
                    "kafka" if single else f"kafka-{broker.node_id}",
                    paths,
                    broker.node_id,
                    broker.port,
                    "broker+controller" if single else "broker",
                )
            )
        if state.mode.brokers != 1:
            found.append(
                self._kafka_status(
                    "kafka-controller",
                    self.controller_paths,
                    kafka.CONTROLLER_NODE_ID,
                    state.controller_port,
                    "controller",
                )
            )
        for node in state.postgres:
            node_paths = self.pg_paths(state, node)
            pid = postgres.running_pid(node_paths)
            found.append(
                ServiceStatus(
                    f"postgres-{node.node}" if state.mode.standby else "postgres",
                    pid is not None,
                    pid,
                    f"127.0.0.1:{node.port}",
                    str(node_paths.log),
                    kind="postgres",
                    node_id=node.node,
                    port=node.port,
                    role=node.role,
                )
            )
        return found

    def _kafka_status(
        self, name: str, paths: kafka.KafkaPaths, node_id: int, port: int, role: str
    ) -> ServiceStatus:
        pid = kafka.running_pid(paths)
        return ServiceStatus(
            name,
            pid is not None,
            pid,
            f"127.0.0.1:{port}",
            str(paths.log),
            kind="kafka",
            node_id=node_id,
            port=port,
            role=role,
            paused=kafka.is_paused(paths),
        )

    def _unknown_status(self) -> list[ServiceStatus]:
        kafka_pid = kafka.running_pid(self.kafka)
        pg_pid = postgres.running_pid(self.postgres)
        return [
            ServiceStatus(
                "kafka",
                kafka_pid is not None,
                kafka_pid,
                "-",
                str(self.kafka.log),
                kind="kafka",
                role="broker+controller",
            ),
            ServiceStatus(
                "postgres",
                pg_pid is not None,
                pg_pid,
                "-",
                str(self.postgres.log),
                kind="postgres",
                role="primary",
            ),
        ]

    def env(self) -> dict[str, str]:
        """The MATCHER_* variables that point a client at this stack: every broker, and
        (with a standby) every Postgres node, the primary first."""
        state = self._require()
        return {
            "MATCHER_KAFKA_BOOTSTRAP_SERVERS": state.bootstrap_servers(),
            "MATCHER_DATABASE_URL": state.database_url(),
        }

    # Breaking things on purpose.

    def _broker(self, state: State, node_id: int) -> tuple[kafka.KafkaPaths, Broker]:
        for broker in state.brokers:
            if broker.node_id == node_id:
                return self.broker_paths(state, node_id), broker
        ids = ", ".join(str(b.node_id) for b in state.brokers)
        raise DevstackUsageError(f"no broker {node_id}: this devstack's brokers are {ids}")

    def stop_broker(self, node_id: int, *, timeout: float = 30.0) -> dict[str, Any]:
        """Kill broker ``node_id`` with SIGKILL (a crash), and return once it is gone."""
        with self._locked_existing():
            state = self._require()
            paths, _ = self._broker(state, node_id)
            started = time.monotonic()
            pid = kafka.kill(paths, timeout=timeout)
            return {
                "node_id": node_id,
                "pid": pid,
                "was_running": pid is not None,
                "seconds": round(time.monotonic() - started, 3),
            }

    def start_broker(self, node_id: int, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """Start broker ``node_id`` again on its ports and data; return once it answers."""
        with self._locked_existing():
            state = self._require()
            paths, broker = self._broker(state, node_id)
            started = time.monotonic()
            if state.mode.brokers == 1:
                kafka.start(paths, broker.port, state.controller_port, timeout=timeout)
            else:
                if kafka.running_pid(self.controller_paths) is None:
                    raise DevstackError(
                        "the Kafka controller is not running: run `matcher devstack up`"
                    )
                node = [(paths, kafka.ClusterNode(node_id, broker.port))]
                launched = kafka.launch_cluster(
                    node, state.controller_port, brokers=state.mode.brokers
                )
                kafka.wait_cluster(node, launched, timeout=timeout)
            return {
                "node_id": node_id,
                "pid": kafka.running_pid(paths),
                "port": broker.port,
                "seconds": round(time.monotonic() - started, 3),
            }

    def pause_broker(
        self,
        node_id: int,
        seconds: float,
        *,
        on_paused: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """SIGSTOP broker ``node_id``, wait ``seconds``, SIGCONT it: always, whatever ends
        the wait (Ctrl-C, SIGTERM, SIGHUP, an error). Holds no lock while it waits."""
        state = self._require()
        paths, _ = self._broker(state, node_id)
        if kafka.running_pid(paths) is None:
            raise DevstackError(
                f"broker {node_id} is not running: `matcher devstack start-broker {node_id}`"
            )
        with _signals_interrupt():
            started = time.monotonic()
            try:
                pid = kafka.pause(paths)
                started = time.monotonic()
                if on_paused is not None:
                    on_paused(pid)
                # The wait is the point here: the broker stays stopped this long.
                deadline = started + seconds
                while (left := deadline - time.monotonic()) > 0 and kafka.running_pid(paths):
                    time.sleep(min(left, 0.25))
            finally:
                kafka.resume(paths)
        return {"node_id": node_id, "pid": pid, "paused_s": round(time.monotonic() - started, 3)}

    def resume_broker(self, node_id: int) -> dict[str, Any]:
        """SIGCONT broker ``node_id`` now (a pause that was left behind)."""
        state = self._require()
        paths, _ = self._broker(state, node_id)
        pid = kafka.running_pid(paths)
        if pid is None:
            raise DevstackError(
                f"broker {node_id} is not running: `matcher devstack start-broker {node_id}`"
            )
        return {"node_id": node_id, "pid": pid, "was_paused": kafka.resume(paths)}

    def _require_standby(self) -> State:
        state = self._require()
        if not state.mode.standby:
            flags = Mode(state.mode.brokers, True).flags()
            raise DevstackUsageError(
                f"this devstack has no Postgres standby: start over with "
                f"`matcher devstack up --fresh {flags}`"
            )
        return state

    def failover(self, *, rejoin: bool = True, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """Crash the primary (SIGKILL to the postmaster and its processes), promote the
        standby, and (with ``rejoin``) rewind the old primary into the new synchronous
        standby. Times are seconds from the kill."""
        with self._locked_existing():
            state = self._require_standby()
            old, new = state.postgres
            old_paths, new_paths = self.pg_paths(state, old), self.pg_paths(state, new)
            if new.role != "standby":
                raise DevstackError(
                    f"no standby to promote: {new.name} is {new.role}: "
                    "run `matcher devstack rejoin`"
                )
            if postgres.running_pid(old_paths) is None or postgres.running_pid(new_paths) is None:
                raise DevstackError(
                    "the primary or the standby is not running: run `matcher devstack up`"
                )
            postgres.wait_streaming(old.port, new.name, sync=True, timeout=min(timeout, 30.0))
            started = time.monotonic()
            killed = postgres.kill(old_paths, timeout=timeout)
            # The new primary names no synchronous standby: none is left to wait for.
            postgres.write_config(new_paths, new.port, postgres.replication_config(name=new.name))
            postgres.promote(new_paths, new.port, timeout=timeout)
            promoted = time.monotonic() - started
            postgres.reload(new.port, "synchronous_standby_names", "", timeout=timeout)
            new.role, old.role = "primary", "detached"
            state.postgres = [new, old]
            self._save(state)
            result: dict[str, Any] = {
                "killed": {"node": old.node, "port": old.port, "pid": killed, "signal": "SIGKILL"},
                "promoted": {"node": new.node, "port": new.port},
                "promotion_s": round(promoted, 3),
                "rejoined": False,
                "rejoin_s": None,
            }
            if rejoin:
                result["rewind"] = self._rewind(state, old, timeout)
                self._start_standby(state, timeout)
                result["rejoined"] = True
                result["rejoin_s"] = round(time.monotonic() - started, 3)
            return result

    def rejoin(self, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """Make the node that is not the primary its synchronous standby again: rewind
        a detached former primary first; start a stopped standby."""
        with self._locked_existing():
            state = self._require_standby()
            primary, other = state.postgres
            if postgres.running_pid(self.pg_paths(state, primary)) is None:
                raise DevstackError(
                    f"the primary {primary.name} is not running: run `matcher devstack up`"
                )
            started = time.monotonic()
            was = other.role
            result: dict[str, Any] = {"node": other.node, "port": other.port, "was": was}
            if was == "detached":
                result["rewind"] = self._rewind(state, other, timeout)
            self._start_standby(state, timeout)
            result["rejoin_s"] = round(time.monotonic() - started, 3)
            return result


def as_json(statuses: list[ServiceStatus]) -> list[dict[str, Any]]:
    return [asdict(s) for s in statuses]

"""A real Apache Kafka (KRaft) assembled from Maven Central jars: one combined node, or a
cluster of brokers with a dedicated controller.

The release tarball is not reachable everywhere, but Maven Central is, and the broker is
just ``kafka.Kafka`` on a classpath: a ``pom``-packaged project that depends on
``kafka_2.13`` pulls the server and its dependencies. The logging backend is not in that
POM (the tarball adds it privately), so log4j2 and its slf4j-1 binding are added here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matcher_devstack.procs import DevstackError, pid_alive, read_pid, tail, terminate, wait_until

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"
_MAIN_CLASS = "kafka.Kafka"
_HEAP = ("-Xms512m", "-Xmx512m")
# A cluster runs four JVMs on a developer's machine: brokers grow to the single node's
# heap but start smaller; the controller only keeps the metadata log.
_CLUSTER_BROKER_HEAP = ("-Xms256m", "-Xmx512m")
_CONTROLLER_HEAP = ("-Xms128m", "-Xmx256m")
# The cluster's controller: no broker uses this id.
CONTROLLER_NODE_ID = 0

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>matcher.devstack</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""

# Console to stderr, which the devstack sends to kafka.log; WARN for the chatty loggers.
_LOG4J2 = """status = warn
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stderr.ref = STDERR
logger.config.name = org.apache.kafka.common.config
logger.config.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


@dataclass(frozen=True)
class KafkaPaths:
    home: Path  # config, data, log, pid of this broker
    cache: Path  # the assembled jars, shared by every devstack on the machine

    @property
    def libs(self) -> Path:
        return self.cache / f"kafka-{KAFKA_VERSION}" / "libs"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def log(self) -> Path:
        return self.home / "kafka.log"

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def config(self) -> Path:
        return self.home / "server.properties"


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise DevstackError(
            "Java not found: Kafka needs a JDK/JRE 17 or newer "
            "(Debian: apt-get install openjdk-17-jre-headless)"
        )
    return java


def ensure_jars(paths: KafkaPaths) -> bool:
    """Assemble the broker's classpath once; return True if it had to be downloaded."""
    marker = paths.libs.parent / ".complete"
    if marker.exists():
        return False
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevstackError(
            "Maven not found: it assembles Kafka from Maven Central on first use "
            "(Debian: apt-get install maven)"
        )
    paths.cache.mkdir(parents=True, exist_ok=True)
    # Build beside the final place, then rename: concurrent first starts cannot see half.
    work = Path(tempfile.mkdtemp(prefix="kafka-jars-", dir=paths.cache))
    try:
        (work / "pom.xml").write_text(_POM.format(kafka=KAFKA_VERSION, log4j=LOG4J_VERSION))
        result = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "dependency:copy-dependencies",
                "-DoutputDirectory=libs",
                "-DincludeScope=runtime",
            ],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
            raise DevstackError(f"Maven could not fetch Kafka {KAFKA_VERSION}:\n{output}")
        if not any((work / "libs").glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
            raise DevstackError("Maven finished but the Kafka server jar is missing")
        (work / ".complete").write_text(f"kafka {KAFKA_VERSION}\nlog4j {LOG4J_VERSION}\n")
        target = paths.libs.parent
        if target.exists():  # another process won the race
            shutil.rmtree(work)
        else:
            work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return True


def _common_properties(data: Path) -> dict[str, str]:
    return {
        "log.dirs": str(data.resolve()),
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        # Few offsets partitions: the first group join creates them all.
        "offsets.topic.num.partitions": "4",
        # Tests join and leave groups all the time; do not wait for more members.
        "group.initial.rebalance.delay.ms": "0",
        # Let tests notice a killed member within seconds (clients choose their timeout).
        "group.min.session.timeout.ms": "1000",
        # The default 128 MiB cleaner buffer would eat half of a small heap.
        "log.cleaner.dedupe.buffer.size": "16777216",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }


def _replication_properties(replicas: int, min_isr: int) -> dict[str, str]:
    return {
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_isr),
    }


def single_node_properties(data: Path, port: int, controller_port: int) -> dict[str, str]:
    """The one combined broker/controller node of the default stack."""
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        **_common_properties(data),
        "default.replication.factor": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
    }


@dataclass(frozen=True)
class ClusterNode:
    """One process of a cluster: a broker (``node_id`` 1..n, ``port`` its client
    listener) or the controller (``node_id`` 0, ``port`` its controller listener)."""

    node_id: int
    port: int

    @property
    def is_controller(self) -> bool:
        return self.node_id == CONTROLLER_NODE_ID


def cluster_properties(
    node: ClusterNode, data: Path, controller_port: int, *, brokers: int
) -> dict[str, str]:
    """A node of the cluster: brokers and one dedicated controller.

    The controller is a process of its own, not a role of the brokers: with three
    combined nodes, stopping two of them would also lose the controller quorum, and the
    survivor could then not shrink its partitions' ISR; produce requests would time out
    instead of being refused with NOT_ENOUGH_REPLICAS, which is what a cluster that lost
    two brokers does. Every topic defaults to three replicas and needs two in sync.
    """
    voters = f"{CONTROLLER_NODE_ID}@127.0.0.1:{controller_port}"
    security = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    if node.is_controller:
        return {
            "process.roles": "controller",
            "node.id": str(CONTROLLER_NODE_ID),
            "controller.quorum.voters": voters,
            "listeners": f"CONTROLLER://127.0.0.1:{controller_port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": security,
            "log.dirs": str(data.resolve()),
            # A broker that stops heartbeating is fenced (leaves every ISR) in 6 s.
            "broker.session.timeout.ms": "6000",
        }
    replicas = min(3, brokers)
    return {
        "process.roles": "broker",
        "node.id": str(node.node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": security,
        "broker.heartbeat.interval.ms": "1000",
        # A follower that stopped fetching leaves the ISR in 10 s (default 30 s).
        "replica.lag.time.max.ms": "10000",
        **_common_properties(data),
        **_replication_properties(replicas, min(2, replicas)),
    }


def render_properties(properties: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in properties.items())


def _write_properties(paths: KafkaPaths, properties: dict[str, str]) -> None:
    paths.home.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(render_properties(properties))
    (paths.home / "log4j2.properties").write_text(_LOG4J2)


def _write_config(paths: KafkaPaths, port: int, controller_port: int) -> None:
    _write_properties(paths, single_node_properties(paths.data, port, controller_port))


def _java_cmd(paths: KafkaPaths, *args: str, heap: Sequence[str] = _HEAP) -> list[str]:
    log_config = (paths.home / "log4j2.properties").resolve()
    return [
        _java(),
        *heap,
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log_config}",
        "-cp",
        f"{paths.libs.resolve()}/*",
        *args,
    ]


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()


def cluster_id_of(paths: KafkaPaths) -> str | None:
    """The cluster id a formatted node's storage carries, or None if it is unformatted."""
    try:
        text = (paths.data / "meta.properties").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    return None


def _format_storage(paths: KafkaPaths, cluster_id: str | None = None) -> None:
    if (paths.data / "meta.properties").exists():
        return
    cluster_id = cluster_id or new_cluster_id()
    paths.data.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            # "--cluster-id=ID", not "-t ID": an id may start with "-" (base64url), and
            # the tool's argument parser then takes it for an option.
            *_java_cmd(paths, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}"),
            "-c",
            str(paths.config),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        output = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise DevstackError(f"Kafka storage format failed:\n{output}")


def _launch_detached(cmd: list[str], paths: KafkaPaths) -> int:
    """Start ``cmd`` as an orphan of its own session; return its pid.

    The broker outlives the command that started it, so it must not stay our child: a
    shell starts it in the background, prints its pid and exits, and init adopts it.
    """
    script = 'exec "$@" >>"$MATCHER_KAFKA_LOG" 2>&1 </dev/null & echo $!'
    result = subprocess.run(
        ["sh", "-c", f"({script})", "sh", *cmd],
        env={**os.environ, "MATCHER_KAFKA_LOG": str(paths.log)},
        cwd=paths.home,
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
    )
    return int(result.stdout.strip())


def running_pid(paths: KafkaPaths) -> int | None:
    pid = read_pid(paths.pid_file)
    return pid if pid is not None and pid_alive(pid, _MAIN_CLASS) else None


def broker_answers(bootstrap: str, timeout: float = 5.0) -> bool:
    """True when the broker answers a metadata request (not merely accepts TCP)."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> bool:
        client = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
        try:
            await asyncio.wait_for(client.start(), timeout)
            await asyncio.wait_for(client.describe_cluster(), timeout)
            return True
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), timeout)

    previous = logging.getLogger("aiokafka").level
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # refused connects are expected
    try:
        return asyncio.run(probe())
    finally:
        logging.getLogger("aiokafka").setLevel(previous)


def _launch(paths: KafkaPaths, heap: Sequence[str]) -> int:
    if paths.log.exists() and paths.log.stat().st_size > 20 * 1024 * 1024:
        paths.log.replace(paths.log.with_suffix(".log.1"))
    launched = _launch_detached(
        _java_cmd(paths, _MAIN_CLASS, str(paths.config.resolve()), heap=heap), paths
    )
    paths.pid_file.write_text(f"{launched}\n")
    return launched


def _startup_died(paths: KafkaPaths, launched: int | None) -> str | None:
    # Right after the launch the child may not yet be `java`: ask only whether it lives.
    gone = running_pid(paths) is None if launched is None else not pid_alive(launched, "")
    if gone:
        return f"Kafka exited during startup; the end of {paths.log}:\n{tail(paths.log)}"
    return None


def start(paths: KafkaPaths, port: int, controller_port: int, *, timeout: float) -> None:
    """Start the broker unless it runs; return once it answers a metadata request."""
    paths.home.mkdir(parents=True, exist_ok=True)
    ensure_jars(paths)
    bootstrap = f"127.0.0.1:{port}"
    launched: int | None = None
    if running_pid(paths) is None:
        _write_config(paths, port, controller_port)
        _format_storage(paths)
        launched = _launch(paths, _HEAP)
    else:
        resume(paths)

    def died() -> str | None:
        return _startup_died(paths, launched)

    if not wait_until(lambda: broker_answers(bootstrap), timeout=timeout, abort=died):
        raise DevstackError(
            f"Kafka did not answer a metadata request on {bootstrap} within {timeout:.0f}s; "
            f"the end of {paths.log}:\n{tail(paths.log)}"
        )


def node_answers(port: int, node_id: int, timeout: float = 5.0) -> bool:
    """True when the broker on ``port`` itself answers a metadata request that lists it
    (registered and unfenced), not merely accepts TCP; never asks another broker."""
    from aiokafka.client import AIOKafkaClient

    async def probe() -> bool:
        client = AIOKafkaClient(
            bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=int(timeout * 1000)
        )
        try:
            await asyncio.wait_for(client.bootstrap(), timeout + 1)
            return any(b.nodeId == node_id for b in client.cluster.brokers())
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), timeout)

    previous = logging.getLogger("aiokafka").level
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        return asyncio.run(probe())
    finally:
        logging.getLogger("aiokafka").setLevel(previous)


def launch_cluster(
    nodes: Sequence[tuple[KafkaPaths, ClusterNode]], controller_port: int, *, brokers: int
) -> dict[int, int | None]:
    """Launch every node of the cluster that does not run, all at once (the brokers need
    the controller, and a cold start is mostly JVM warm-up); resume a paused one. The
    nodes share one cluster id. Return each node's launched pid (None: it ran already)."""
    if not nodes:
        return {}
    ensure_jars(nodes[0][0])
    cluster_id = (
        next((found for paths, _ in nodes if (found := cluster_id_of(paths)) is not None), None)
        or new_cluster_id()
    )
    launched: dict[int, int | None] = {}
    for paths, node in nodes:
        if running_pid(paths) is not None:
            resume(paths)
            launched[node.node_id] = None
            continue
        properties = cluster_properties(node, paths.data, controller_port, brokers=brokers)
        _write_properties(paths, properties)
        _format_storage(paths, cluster_id)
        heap = _CONTROLLER_HEAP if node.is_controller else _CLUSTER_BROKER_HEAP
        launched[node.node_id] = _launch(paths, heap)
    return launched


def wait_cluster(
    nodes: Sequence[tuple[KafkaPaths, ClusterNode]],
    launched: dict[int, int | None],
    *,
    timeout: float,
) -> None:
    """Return once each broker answers a metadata request that lists it; fail at once
    when a node exits, with the end of its log."""

    def died() -> str | None:
        for paths, member in nodes:
            if (reason := _startup_died(paths, launched.get(member.node_id))) is not None:
                return reason
        return None

    deadline = time.monotonic() + timeout
    for paths, node in nodes:
        if node.is_controller:
            continue
        left = max(1.0, deadline - time.monotonic())
        port, node_id = node.port, node.node_id
        answers = functools.partial(node_answers, port, node_id)
        if not wait_until(answers, timeout=left, abort=died):
            raise DevstackError(
                f"Kafka broker {node_id} did not answer a metadata request on "
                f"127.0.0.1:{port} within {timeout:.0f}s; the end of {paths.log}:\n"
                f"{tail(paths.log)}"
            )


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, T for stopped, ...), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def is_paused(paths: KafkaPaths) -> bool:
    pid = running_pid(paths)
    return pid is not None and process_state(pid) in ("T", "t")


def pause(paths: KafkaPaths, *, timeout: float = 10.0) -> int:
    """SIGSTOP the broker; return its pid once the kernel reports it stopped."""
    pid = running_pid(paths)
    if pid is None:
        raise DevstackError(f"no broker runs from {paths.home}")
    os.kill(pid, signal.SIGSTOP)
    if not wait_until(lambda: process_state(pid) in ("T", "t", None), timeout=timeout):
        os.kill(pid, signal.SIGCONT)
        raise DevstackError(f"the broker (pid {pid}) did not stop within {timeout:.0f}s")
    return pid


def resume(paths: KafkaPaths) -> bool:
    """SIGCONT the broker; True if it was paused."""
    pid = running_pid(paths)
    if pid is None:
        return False
    paused = process_state(pid) in ("T", "t")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    return paused


def kill(paths: KafkaPaths, *, timeout: float = 30.0) -> int | None:
    """SIGKILL the broker, a crash: no controlled shutdown. Return the pid it had, once
    it is gone (None if it did not run)."""
    pid = running_pid(paths)
    if pid is None:
        paths.pid_file.unlink(missing_ok=True)
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_until(lambda: not pid_alive(pid, _MAIN_CLASS), timeout=timeout):
        raise DevstackError(f"the broker (pid {pid}) outlived SIGKILL for {timeout:.0f}s")
    paths.pid_file.unlink(missing_ok=True)
    return pid


def stop_many(all_paths: Sequence[KafkaPaths], *, timeout: float = 30.0) -> None:
    """SIGTERM every listed node at once (a paused one is resumed first), then wait for
    each; SIGKILL what outlives ``timeout``."""
    pids: list[tuple[KafkaPaths, int]] = []
    for paths in all_paths:
        pid = running_pid(paths)
        if pid is None:
            paths.pid_file.unlink(missing_ok=True)
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
        pids.append((paths, pid))
    deadline = time.monotonic() + timeout
    for paths, pid in pids:
        terminate(pid, _MAIN_CLASS, timeout=max(0.5, deadline - time.monotonic()))
        paths.pid_file.unlink(missing_ok=True)


def stop(paths: KafkaPaths, *, timeout: float = 30.0) -> None:
    stop_many([paths], timeout=timeout)

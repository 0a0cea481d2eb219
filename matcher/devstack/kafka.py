"""A real Apache Kafka broker (KRaft, one combined node) assembled from Maven Central jars.

The release tarball is not reachable everywhere, but Maven Central is, and the broker is
just ``kafka.Kafka`` on a classpath: a ``pom``-packaged project that depends on
``kafka_2.13`` pulls the server and its dependencies. The logging backend is not in that
POM (the tarball adds it privately), so log4j2 and its slf4j-1 binding are added here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from matcher.devstack.procs import DevstackError, pid_alive, read_pid, tail, terminate, wait_until

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"
_MAIN_CLASS = "kafka.Kafka"
_HEAP = ("-Xms512m", "-Xmx512m")

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


def _write_config(paths: KafkaPaths, port: int, controller_port: int) -> None:
    properties = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(paths.data.resolve()),
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "default.replication.factor": "1",
        "offsets.topic.replication.factor": "1",
        # Few offsets partitions: the first group join creates them all.
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # Tests join and leave groups all the time; do not wait for more members.
        "group.initial.rebalance.delay.ms": "0",
        # Let tests notice a killed member within seconds (clients choose their timeout).
        "group.min.session.timeout.ms": "1000",
        # The default 128 MiB cleaner buffer would eat half of a small heap.
        "log.cleaner.dedupe.buffer.size": "16777216",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    paths.config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    (paths.home / "log4j2.properties").write_text(_LOG4J2)


def _java_cmd(paths: KafkaPaths, *args: str) -> list[str]:
    log_config = (paths.home / "log4j2.properties").resolve()
    return [
        _java(),
        *_HEAP,
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log_config}",
        "-cp",
        f"{paths.libs.resolve()}/*",
        *args,
    ]


def _format_storage(paths: KafkaPaths) -> None:
    if (paths.data / "meta.properties").exists():
        return
    cluster_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
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


def start(paths: KafkaPaths, port: int, controller_port: int, *, timeout: float) -> None:
    """Start the broker unless it runs; return once it answers a metadata request."""
    paths.home.mkdir(parents=True, exist_ok=True)
    ensure_jars(paths)
    bootstrap = f"127.0.0.1:{port}"
    launched: int | None = None
    if running_pid(paths) is None:
        _write_config(paths, port, controller_port)
        _format_storage(paths)
        if paths.log.exists() and paths.log.stat().st_size > 20 * 1024 * 1024:
            paths.log.replace(paths.log.with_suffix(".log.1"))
        launched = _launch_detached(
            _java_cmd(paths, _MAIN_CLASS, str(paths.config.resolve())), paths
        )
        paths.pid_file.write_text(f"{launched}\n")

    def died() -> str | None:
        # Right after the launch the child may not yet be `java`: ask only whether it lives.
        gone = running_pid(paths) is None if launched is None else not pid_alive(launched, "")
        if gone:
            return f"Kafka exited during startup; the end of {paths.log}:\n{tail(paths.log)}"
        return None

    if not wait_until(lambda: broker_answers(bootstrap), timeout=timeout, abort=died):
        raise DevstackError(
            f"Kafka did not answer a metadata request on {bootstrap} within {timeout:.0f}s; "
            f"the end of {paths.log}:\n{tail(paths.log)}"
        )


def stop(paths: KafkaPaths, *, timeout: float = 30.0) -> None:
    pid = running_pid(paths)
    if pid is not None:
        terminate(pid, _MAIN_CLASS, timeout=timeout)
    paths.pid_file.unlink(missing_ok=True)

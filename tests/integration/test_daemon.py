"""The daemon skeleton as a process: ready on real services, clean exit on SIGTERM/SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from matcher.config import Settings
from tests.support.services import settings_env


def _start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "matcher", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_line(process: subprocess.Popen[str], needle: str, timeout: float) -> list[str]:
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    process.kill()
    raise AssertionError(f"{needle!r} not seen; output:\n{''.join(lines)}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_daemon_starts_and_stops_cleanly(settings: Settings, sig: signal.Signals) -> None:
    process = _start(settings_env(settings))
    _wait_for_line(process, "matcher ready", timeout=60)
    process.send_signal(sig)
    rest, _ = process.communicate(timeout=30)
    assert process.returncode == 0, rest
    assert "stopped" in rest


def test_daemon_refuses_to_start_without_topics(settings: Settings) -> None:
    env = settings_env(settings)
    env["MATCHER_EVENTS_TOPIC"] = "no.such.topic"
    result = subprocess.run(
        [sys.executable, "-m", "matcher", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 4  # "not migrated, or a topic missing": run matcher migrate
    assert "no.such.topic do not exist: run `matcher migrate` first" in result.stderr


def test_bad_configuration_gives_one_line_per_problem(settings: Settings) -> None:
    env = settings_env(settings)
    env.update(
        MATCHER_TOPIC_PARTITIONS="many",
        MATCHER_LOG_LEVEL="loud",
        MATCHER_KAFKA_BOOTSTRAP_SERVERS="localhost",
    )
    del env["MATCHER_DATABASE_URL"]
    result = subprocess.run(
        [sys.executable, "-m", "matcher", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 4, result.stderr
    assert all(line.startswith("matcher: configuration error: MATCHER_") for line in lines)
    joined = "\n".join(lines)
    for variable in ("TOPIC_PARTITIONS", "LOG_LEVEL", "KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL"):
        assert f"MATCHER_{variable}:" in joined

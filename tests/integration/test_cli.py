"""The CLI as a black box: the README walkthrough, run as a user would run it."""

from __future__ import annotations

import json
import subprocess
import sys

from matcher.config import Settings
from tests.helpers import DaemonProcess, process_env


def _matcher(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "matcher", *args],
        env=process_env(settings, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_walkthrough(settings: Settings) -> None:
    daemon = DaemonProcess(process_env(settings))
    daemon.wait_ready()
    try:
        emitted = _matcher(
            settings,
            "emit",
            "--tenant", "acme",
            "--type", "job.completed",
            "--correlation", "job-42",
            "--id", "evt-42",
            "--data", '{"rows": 1200}',
            "--structured",
        )  # fmt: skip
        assert emitted.returncode == 0, emitted.stderr

        added = _matcher(
            settings,
            "waits", "add",
            "--tenant", "acme", "--run", "run-7", "--position", "3",
            "--type", "job.completed", "--type", "job.failed",
            "--correlation", "job-42", "--deadline", "3600", "--json",
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        wait = json.loads(added.stdout)
        # The daemon may or may not have stored the event yet; either way it resolves.
        assert wait["state"] in ("matched", "waiting")

        tailed = _matcher(
            settings, "resumes", "tail", "--from-beginning", "--max", "1", "--timeout", "60",
            "--json",
        )  # fmt: skip
        assert tailed.returncode == 0, tailed.stderr
        [line] = tailed.stdout.splitlines()
        resume = json.loads(line)
        assert resume["wait_id"] == wait["id"]
        assert resume["run_id"] == "run-7"
        assert resume["position"] == 3
        assert resume["outcome"] == "event"
        assert resume["event"]["id"] == "evt-42"
        assert resume["event"]["data"] == {"rows": 1200}

        listed = _matcher(settings, "waits", "list", "--json", MATCHER_WAITS_LIST_RUN="run-7")
        assert [w["state"] for w in json.loads(listed.stdout)] == ["matched"]
        events = _matcher(settings, "events", "list", "--correlation", "job-42", "--json")
        assert [e["status"] for e in json.loads(events.stdout)] == ["consumed"]

        again = _matcher(settings, "waits", "cancel", wait["id"])
        assert again.returncode == 1
        assert "already matched" in again.stderr
    finally:
        assert daemon.terminate() == 0, daemon.output


def test_bad_input_gets_clear_errors(settings: Settings) -> None:
    bad_deadline = _matcher(
        settings,
        "waits", "add", "--tenant", "t", "--run", "r", "--position", "0", "--type", "x",
        "--correlation", "c", "--deadline", "tomorrow",
    )  # fmt: skip
    assert bad_deadline.returncode == 2
    assert "--deadline 'tomorrow' is neither seconds nor an ISO-8601 time" in bad_deadline.stderr

    bad_data = _matcher(
        settings, "emit", "--tenant", "t", "--type", "x", "--correlation", "c", "--data", "{",
    )  # fmt: skip
    assert bad_data.returncode == 2
    assert "--data is not JSON" in bad_data.stderr

    missing = _matcher(settings, "waits", "cancel", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode == 1
    assert "no wait" in missing.stderr

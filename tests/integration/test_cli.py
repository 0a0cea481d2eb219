"""The CLI as a black box: the quickstart's walkthrough, run as a user would run it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from matcher import __version__
from matcher.config import Settings
from tests.support.assertions import eventually
from tests.support.db import scalar
from tests.support.kafka import produce, produce_raw
from tests.support.processes import DaemonProcess, process_env, running_daemon
from tests.support.records import event


def _matcher(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "matcher", *args],
        env=process_env(settings, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.smoke
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


# The CLI as operators use it: one line and a documented exit code for every expected
# failure, --json everywhere, one timestamp format, only the settings a verb needs.

ROOT = Path(__file__).parents[2]
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z$")


def _run(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "matcher", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_line_failure(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    for word in words:
        assert word in line, line


def test_version() -> None:
    done = _run(dict(os.environ), "--version")
    assert done.returncode == 0
    assert done.stdout == f"matcher {__version__}\n"


def test_unreachable_services_fail_in_one_line_with_exit_3(settings: Settings) -> None:
    env = process_env(
        settings,
        MATCHER_DATABASE_URL="postgresql://nobody@127.0.0.1:1/nothing",
        MATCHER_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1",
    )
    for args in (
        ["explain", "run-7"],
        ["migrate"],
        ["migrate", "--no-topics"],
        ["quarantine", "replay", "1"],
        ["waits", "list"],
        ["events", "list", "--json"],
    ):
        _one_line_failure(_run(env, *args), 3, "cannot reach Postgres")
    for args in (
        ["emit", "--tenant", "acme", "--type", "job.completed", "--correlation", "c"],
        ["resumes", "tail", "--max", "1"],
    ):
        _one_line_failure(_run(env, *args), 3, "matcher: Kafka:")


def test_a_database_never_migrated_says_so_with_exit_4(settings: Settings, empty_db: str) -> None:
    env = process_env(settings, MATCHER_DATABASE_URL=empty_db, MATCHER_STARTUP_TIMEOUT_S="5")
    for args in (["waits", "list"], ["explain", "run-7"], ["events", "list"]):
        _one_line_failure(_run(env, *args), 4, "no matcher schema", "run `matcher migrate`")
    # The daemon says so before it starts (not "ready", then "a loop failed: relay").
    ran = _run(env, "run")
    _one_line_failure(ran, 4, "cannot start: the database has no matcher schema")
    assert "ready" not in ran.stdout + ran.stderr


def test_a_missing_topic_says_so_with_exit_4(settings: Settings) -> None:
    env = process_env(settings, MATCHER_EVENTS_TOPIC="no.such.events")
    emitted = _run(env, "emit", "--tenant", "acme", "--type", "t", "--correlation", "c")
    _one_line_failure(emitted, 4, "topic no.such.events does not exist", "matcher migrate")
    env = process_env(settings, MATCHER_RESUME_TOPIC="no.such.resumes")
    _one_line_failure(_run(env, "resumes", "tail", "--max", "1"), 4, "no.such.resumes")


def test_bad_option_values_are_refused_with_exit_2(settings: Settings) -> None:
    env = process_env(settings)
    for args, words in (
        (["waits", "list", "--limit", "-5"], ["--limit -5", "greater than or equal to 1"]),
        (["waits", "list", "--limit", "5000"], ["--limit 5000", "less than or equal to 1000"]),
        (["waits", "list", "--state", "bogus"], ["--state 'bogus'", "'waiting'"]),
        (["events", "list", "--status", "bogus"], ["--status 'bogus'", "'pending'"]),
        (["quarantine", "list", "--reason", "bogus"], ["--reason 'bogus'", "bad_signature"]),
        (["quarantine", "replay", "--reason", "bogus"], ["--reason 'bogus'"]),
        (["waits", "cancel", "not-a-uuid"], ["'not-a-uuid' is not a wait id"]),
        (["waits", "list", "--no-such-option"], ["No such option: --no-such-option"]),
        (["resumes", "tail", "--max", "0"], ["--max"]),
        (["waits", "add", "--tenant", "acme"], ["Missing option"]),
    ):
        _one_line_failure(_run(env, *args), 2, *words)


def test_every_verb_speaks_json(settings: Settings, tmp_path: Path) -> None:
    env = process_env(settings)
    migrated = _run(env, "migrate", "--json")
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout) == {"applied": [], "topics": []}

    emitted = _run(
        env, "emit", "--tenant", "acme", "--type", "job.completed", "--correlation", "c-json",
        "--id", "evt-json", "--json",
    )  # fmt: skip
    assert emitted.returncode == 0, emitted.stderr
    sent = json.loads(emitted.stdout)
    assert sent["id"] == "evt-json"
    assert sent["topic"] == settings.events_topic
    assert sent["partition"] >= 0
    assert sent["offset"] >= 0

    added = _run(
        env, "waits", "add", "--tenant", "acme", "--run", "r-json", "--position", "0",
        "--type", "job.completed", "--correlation", "c-other", "--json",
    )  # fmt: skip
    wait = json.loads(added.stdout)
    cancelled = _run(env, "waits", "cancel", wait["id"], "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    body = json.loads(cancelled.stdout)
    assert body["state"] == "cancelled"
    assert RFC3339_UTC.match(body["resolved_at"]), body

    # devstack down and status on a stack that is not there (no service to stop).
    stack = dict(env, MATCHER_DEVSTACK_DIR=str(tmp_path / "stack"))
    down = _run(stack, "devstack", "down", "--json")
    assert down.returncode == 0, down.stderr
    assert {s["name"] for s in json.loads(down.stdout)["services"]} == {"kafka", "postgres"}


def test_devstack_up_json_on_a_running_stack() -> None:
    """`up` is idempotent: on the project's running stack it only reports (skipped when
    the tests run against other services)."""
    from matcher_devstack.stack import Devstack

    stack = Devstack(ROOT / ".devstack")
    if stack.ports() is None or not all(s.running for s in stack.status()):
        pytest.skip("the project's devstack is not running")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    up = _run(env, "devstack", "up", "--json", cwd=ROOT / "producers" / "python")
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["env"] == stack.env()


def test_devstack_env_works_from_anywhere_inside_the_project(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".devstack").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "matcher"\n')
    ports = {"kafka": 39001, "kafka_controller": 39002, "postgres": 39003}
    (project / ".devstack" / "stack.json").write_text(json.dumps(ports))
    # A subproject with a pyproject.toml of its own, as producers/python has.
    sub = project / "producers" / "python" / "matcher_producer"
    sub.mkdir(parents=True)
    (project / "producers" / "python" / "pyproject.toml").write_text(
        '[project]\nname = "matcher-producer"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    for where in (project, project / "producers", sub):
        done = _run(env, "devstack", "env", "--json", cwd=where)
        assert done.returncode == 0, (where, done.stderr)
        assert json.loads(done.stdout)["MATCHER_KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:39001"


def test_devstack_of_a_project_is_its_own_not_one_above_it(tmp_path: Path) -> None:
    """A fresh clone (no .devstack/ yet) inside a directory that has one (a stack left in
    a parent directory) gets a stack of its own, not the one above it."""
    ports = {"kafka": 39011, "kafka_controller": 39012, "postgres": 39013}
    (tmp_path / ".devstack").mkdir()
    (tmp_path / ".devstack" / "stack.json").write_text(json.dumps(ports))
    clone = tmp_path / "clone"
    (clone / ".git").mkdir(parents=True)
    (clone / "pyproject.toml").write_text('[project]\nname = "matcher"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    own = _run(env, "devstack", "env", "--json", cwd=clone)
    assert "39011" not in own.stdout, own.stdout  # not the outer stack's addresses
    assert own.returncode != 0, own.stdout  # its own stack, not set up
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outer = _run(env, "devstack", "env", "--json", cwd=elsewhere)
    assert outer.returncode == 0, outer.stderr  # outside any project: the stack upward
    assert json.loads(outer.stdout)["MATCHER_KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:39011"


def test_postgres_verbs_need_no_kafka_settings_and_kafka_verbs_no_database(
    settings: Settings,
) -> None:
    no_kafka = process_env(settings)
    del no_kafka["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
    added = _run(
        no_kafka, "waits", "add", "--tenant", "acme", "--run", "r-pg", "--position", "0",
        "--type", "job.completed", "--correlation", "c-pg",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    for args in (
        ["waits", "list"],
        ["events", "list"],
        ["quarantine", "list"],
        ["migrate", "--no-topics"],
    ):
        done = _run(no_kafka, *args)
        assert done.returncode == 0, (args, done.stderr)
    explained = _run(no_kafka, "explain", "r-pg", "--json")
    assert explained.returncode == 0, explained.stderr
    assert (
        "consumer lag unknown: Kafka is not configured (MATCHER_KAFKA_BOOTSTRAP_SERVERS)"
        in (json.loads(explained.stdout)["reasons"])
    )
    needs_kafka = _run(no_kafka, "migrate")
    _one_line_failure(needs_kafka, 2, "MATCHER_KAFKA_BOOTSTRAP_SERVERS: required, not set")

    no_database = process_env(settings)
    del no_database["MATCHER_DATABASE_URL"]
    emitted = _run(no_database, "emit", "--tenant", "acme", "--type", "t", "--correlation", "c")
    assert emitted.returncode == 0, emitted.stderr
    _one_line_failure(_run(no_database, "waits", "list"), 2, "MATCHER_DATABASE_URL")


def test_option_environment_variables_are_named_after_the_options(settings: Settings) -> None:
    env = process_env(settings)
    _run(
        env, "waits", "add", "--tenant", "acme", "--run", "r-env", "--position", "0",
        "--type", "job.completed", "--correlation", "c-env", "--job-id", "J-env",
    )  # fmt: skip
    listed = _run(dict(env, MATCHER_WAITS_LIST_JOB_ID="J-env", MATCHER_WAITS_LIST_JSON="1"),
                  "waits", "list")  # fmt: skip
    assert [w["run_id"] for w in json.loads(listed.stdout)] == ["r-env"]
    explained = _run(dict(env, MATCHER_EXPLAIN_JSON="true"), "explain", "r-env")
    assert json.loads(explained.stdout)["run_id"] == "r-env"
    emitted = _run(
        dict(env, MATCHER_EMIT_TYPE="job.completed", MATCHER_EMIT_ID="evt-env"),
        "emit", "--tenant", "acme", "--correlation", "c-env", "--json",
    )  # fmt: skip
    assert json.loads(emitted.stdout)["id"] == "evt-env"
    helped = _run(env, "explain", "--help")
    assert "MATCHER_EXPLAIN_JSON" in helped.stdout
    assert "MATCHER_EXPLAIN_AS_JSON" not in helped.stdout


def test_emit_help_is_not_mangled_by_markup() -> None:
    helped = _run(dict(os.environ), "emit", "--help")
    assert helped.returncode == 0
    text = " ".join(helped.stdout.split())
    assert "(TOML [keys] table)" in text
    assert "a whsec_/whsk_ line or a [keys] table" in text


async def test_outputs_use_rfc3339_utc_and_quarantine_says_what_is_wrong(
    settings: Settings,
) -> None:
    """Every timestamp is RFC 3339 in UTC, whatever the database session's time zone; and
    a structured event sent as application/json (the classic CloudEvents SDK's
    to_structured) reaches `matcher quarantine list` with what is really wrong."""
    structured = {
        "specversion": "1.0",
        "id": "evt-appjson",
        "source": "billing",
        "type": "job.completed",
        "tenant": "acme",
        "correlationid": "c-appjson",
        "data": {"ok": True},
    }
    async with running_daemon(settings):
        await produce(settings, [event(correlation="c-time")])
        await produce_raw(
            settings,
            [
                (
                    b"acme\x1fc-appjson",
                    [("content-type", b"application/json")],
                    json.dumps(structured).encode(),
                )
            ],
        )
        await eventually(
            lambda: (
                scalar(settings, "SELECT count(*) FROM matcher.inbox") == 1
                and scalar(settings, "SELECT count(*) FROM matcher.quarantine") == 1
            )
        )
    # A session in another time zone: psycopg returns its timestamps with that offset.
    env = process_env(settings, PGTZ="Asia/Kolkata")
    events = json.loads(_run(env, "events", "list", "--json").stdout)
    assert RFC3339_UTC.match(events[0]["received_at"]), events[0]
    [record] = json.loads(_run(env, "quarantine", "list", "--json").stdout)
    assert RFC3339_UTC.match(record["received_at"]), record
    assert record["reason"] == "malformed"
    needs = "a structured-mode one needs content-type application/cloudevents+json"
    assert needs in record["detail"]
    assert "(content-type is 'application/json')" in record["detail"]
    text = " ".join(_run(env, "quarantine", "list").stdout.split())
    assert "malformed" in text
    waits = _run(env, "waits", "add", "--tenant", "acme", "--run", "r-time", "--position", "0",
                 "--type", "job.completed", "--correlation", "c-time", "--json")  # fmt: skip
    assert RFC3339_UTC.match(json.loads(waits.stdout)["created_at"])
    explained = json.loads(_run(env, "explain", "r-time", "--json").stdout)
    assert RFC3339_UTC.match(explained["evidence"]["wait"]["created_at"])
    listed = _run(dict(env, COLUMNS="250"), "waits", "list", "--run", "r-time")
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", listed.stdout), listed.stdout


def test_run_says_why_it_cannot_start(settings: Settings, tmp_path: Path) -> None:
    quick = {"MATCHER_STARTUP_TIMEOUT_S": "2"}

    def last_line(done: subprocess.CompletedProcess[str], code: int) -> str:
        assert done.returncode == code, (done.returncode, done.stderr)
        assert "Traceback" not in done.stderr
        assert "matcher ready" not in done.stderr + done.stdout
        return done.stderr.strip().splitlines()[-1]

    no_kafka = process_env(settings, MATCHER_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1", **quick)
    assert "cannot start: Kafka at 127.0.0.1:1 did not answer" in last_line(
        _run(no_kafka, "run"), 3
    )
    no_db = process_env(settings, MATCHER_DATABASE_URL="postgresql://x@127.0.0.1:1/x", **quick)
    assert "cannot start: Postgres did not answer" in last_line(_run(no_db, "run"), 3)
    no_topic = process_env(settings, MATCHER_EVENTS_TOPIC="no.such.events", **quick)
    assert "run `matcher migrate`" in last_line(_run(no_topic, "run"), 4)
    unsigned = process_env(settings, MATCHER_ALLOW_UNSIGNED="false", **quick)
    assert "MATCHER_PRODUCERS_FILE is not set" in last_line(_run(unsigned, "run"), 2)
    broken = tmp_path / "producers.toml"
    broken.write_text("[producers.x\n")
    bad_file = process_env(settings, MATCHER_PRODUCERS_FILE=str(broken), **quick)
    assert "cannot start" in last_line(_run(bad_file, "run"), 2)
    broken.write_bytes(b"# caf\xe9\n")  # a Latin-1 comment: valid TOML, but not UTF-8
    not_utf8 = f"cannot start: producers file {broken}: not valid UTF-8: byte 0xe9 at offset 5"
    assert not_utf8 in last_line(_run(bad_file, "run"), 2)


# Sender-chosen text as a terminal would get it: an erase, a window title, a colour, a
# line break, a bidi override, rich markup, and a literal escape that must not read as one.
HOSTILE = (
    "inj\x1b[2J\x1b]0;PWNED\x07\x1b[31m\n\t\u202e[red]x[/red][link=https://e.example]l[/link]"
    "lit\\x07"
)
RAW_CONTROLS = ("\x1b", "\x07", "\u202e", "\n\t")


def _shown_escaped(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    for raw in RAW_CONTROLS:
        assert raw not in done.stdout, done.stdout
    assert "\\x1b[2J\\x1b]0;PWNED\\x07\\x1b[31m\\n\\t\\u202e" in done.stdout, done.stdout
    assert "[red]x[/red][link=https://e.example]l[/link]" in done.stdout, done.stdout
    assert "lit\\\\x07" in done.stdout, done.stdout  # the backslash itself escaped
    return done.stdout


@pytest.mark.timeout(180)
async def test_stored_text_reaches_the_terminal_escaped(settings: Settings) -> None:
    """An event and a quarantined record whose ids, source and tenant hold terminal
    escapes: every table and line shows them escaped, and --json gives them back exact."""
    env = process_env(settings, COLUMNS="2000")
    added = _run(env, "waits", "add", "--tenant", HOSTILE, "--run", "r-esc", "--position",
                 "0", "--type", "job.completed", "--correlation", HOSTILE)  # fmt: skip
    assert added.returncode == 0, added.stderr
    unsigned = [
        ("ce_specversion", b"1.0"),
        ("ce_id", HOSTILE.encode()),
        ("ce_source", HOSTILE.encode()),
        ("ce_tenant", HOSTILE.encode()),
        ("ce_correlationid", HOSTILE.encode()),
    ]  # no ce_type: quarantined as malformed, with the attributes it did have
    async with running_daemon(settings):
        await produce(settings, [event(HOSTILE, HOSTILE, source=HOSTILE, event_id=HOSTILE)])
        await produce_raw(settings, [(None, unsigned, b"{}")])
        await eventually(
            lambda: (
                scalar(settings, "SELECT count(*) FROM matcher.inbox") == 1
                and scalar(settings, "SELECT count(*) FROM matcher.quarantine") == 1
            )
        )
    [record] = json.loads(_run(env, "quarantine", "list", "--json").stdout)
    assert (record["producer"], record["event_id"], record["tenant"]) == (HOSTILE,) * 3
    [stored] = json.loads(_run(env, "events", "list", "--json").stdout)
    assert stored["correlation_id"] == HOSTILE
    _shown_escaped(_run(env, "quarantine", "list"))
    _shown_escaped(_run(env, "events", "list"))
    _shown_escaped(_run(env, "waits", "list"))
    _shown_escaped(_run(env, "explain", "r-esc"))
    # An infinite --timeout is no timeout (it was an OverflowError).
    tailed = _run(env, "resumes", "tail", "--from-beginning", "--max", "1", "--timeout", "inf")
    assert _shown_escaped(tailed).count("\n") == 1


BIG = "1180591620717411303424"  # 2**70: past a bigint


def test_out_of_range_and_undecodable_input_fail_in_one_line_with_exit_2(
    settings: Settings,
) -> None:
    env = process_env(settings)
    add = ["waits", "add", "--tenant", "acme", "--run", "r", "--type", "job.completed",
           "--correlation", "c"]  # fmt: skip
    for args, words in (
        (["quarantine", "replay", BIG], ["'record_id'", "less than or equal to"]),
        (["quarantine", "replay", "--", "-1"], ["'record_id'", "greater than or equal to 1"]),
        ([*add, "--position", BIG], [f"--position {BIG}", "less than or equal to"]),
        ([*add, "--position", "0", "--deadline", "1" + "0" * 20], ["past the year 9999"]),
        ([*add, "--position", "0", "--deadline", "inf"], ["past the year 9999"]),
        ([*add, "--position", "0", "--deadline", "-5"], ["more than 0 seconds"]),
        ([*add, "--position", "0", "--deadline", "0"], ["more than 0 seconds"]),
        ([*add, "--position", "0", "--deadline", "2000-01-01T00:00Z"], ["in the future"]),
        ([*add, "--position", "0", "--deadline", "9999-12-31T23:00-05:00"], ["year 9999"]),
        (["explain", "\udcff\udcfe"], ["RUN '\\udcff\\udcfe'", "valid string"]),
        (["explain", "RUN", "--tenant", "\udcff"], ["--tenant '\\udcff'", "valid string"]),
        (["reconcile", "--reconciler", "os:getcwd", "--limit", BIG], ["--limit"]),
        (["reconcile", "--reconciler", "os:getcwd", "--older-than", "1e300"], ["--older-than"]),
    ):
        _one_line_failure(_run(env, *args), 2, *words)
    bad_url = dict(env, MATCHER_DATABASE_URL="postgresql://%zz@")
    for args in (["waits", "list"], ["run"]):
        _one_line_failure(
            _run(bad_url, *args), 2, "configuration error: MATCHER_DATABASE_URL", "percent"
        )

"""The worker API in SQL is the API for every language: a worker with only psql and kcat
does the whole flow (register, event, resume, verify, advance), and the Python SDK, which
calls the same functions, gives the same answers as calling them directly."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from matcher_devstack.postgres import find_bindir

from matcher.config import Settings
from matcher.domain.launches import Launch, LaunchSpec
from matcher.domain.resume import read_resume
from matcher.domain.waits import Wait, WaitSpec
from matcher.sdk import (
    advance,
    cancel_wait,
    committed_resume,
    get_launch,
    get_wait,
    parse_resume,
    record_job_id,
    record_launch,
    register_wait,
    unadvanced_resolutions,
    verify_resume,
)
from tests.support.assertions import env_flag, eventually
from tests.support.db import db, scalar
from tests.support.handlers import create_app_tables
from tests.support.kafka import produce, read_resume_messages
from tests.support.processes import installed_tool, running_daemon
from tests.support.records import event

EXAMPLES = env_flag("MATCHER_TEST_PROPERTY_EXAMPLES", 150)
pytestmark = pytest.mark.timeout(180 + EXAMPLES // 2)


@pytest.fixture(scope="module")
def kcat() -> str:
    return installed_tool("install-kcat")


@pytest.fixture(scope="module")
def psql() -> str:
    found = find_bindir() / "psql"
    if found.exists():
        return str(found)
    on_path = shutil.which("psql")
    if on_path is None:
        pytest.fail("psql is not installed (Debian: apt-get install postgresql-client)")
    return on_path


def _psql(psql: str, settings: Settings, sql: str, **variables: str) -> str:
    """``sql`` through psql, its variables given as psql variables (quoted by psql itself,
    ``:'name'``); the output unaligned, tuples only. A failure raises, with psql's message
    (verbose: the SQLSTATE in it)."""
    assigned = [arg for name, value in variables.items() for arg in ("-v", f"{name}={value}")]
    done = subprocess.run(
        [psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose",
         *assigned, "-d", settings.database_url.get_secret_value()],
        input=sql, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip())
    return done.stdout.strip()


def _kcat_event(kcat: str, settings: Settings, correlation: str) -> None:
    """A completion event in CloudEvents structured mode, as any producer would write it
    (unsigned: the test daemon accepts those)."""
    value = json.dumps({
        "specversion": "1.0", "id": str(uuid.uuid4()), "source": "batch-svc",
        "type": "job.completed", "tenant": "acme", "correlationid": correlation,
        "datacontenttype": "application/json", "data": {"rows": 1200},
    })  # fmt: skip
    subprocess.run(
        [kcat, "-P", "-b", settings.kafka_bootstrap_servers, "-t", settings.events_topic,
         "-k", correlation, "-H", "content-type=application/cloudevents+json", "-D", "\x1e"],
        input=value.encode() + b"\x1e", capture_output=True, timeout=60, check=True,
    )  # fmt: skip


def _kcat_resume(kcat: str, settings: Settings) -> str:
    """The first message of the resume topic, exactly as published."""
    done = subprocess.run(
        [kcat, "-C", "-b", settings.kafka_bootstrap_servers, "-t", settings.resume_topic,
         "-o", "beginning", "-c", "1", "-e", "-q", "-f", "%s"],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.decode()


async def test_a_worker_in_plain_sql_does_what_the_sdk_does(
    settings: Settings, kcat: str, psql: str
) -> None:
    with db(settings) as conn:
        create_app_tables(conn)
    register = """
        SELECT matcher.register_wait_v1(
            tenant => 'acme', run_id => 'sql-run', "position" => 0,
            event_types => ARRAY['job.completed', 'job.failed'],
            correlation_id => 'sql-job', deadline => now() + interval '1 hour');
    """
    registered = json.loads(_psql(psql, settings, register))
    assert registered["state"] == "waiting"
    async with running_daemon(settings):
        _kcat_event(kcat, settings, "sql-job")
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.resolutions "
                                     "WHERE published") == 1,
            timeout=60, what="the resume published",
        )  # fmt: skip
    message = _kcat_resume(kcat, settings)
    verified = json.loads(
        _psql(psql, settings, "SELECT matcher.verify_resume_v1(:'msg');", msg=message)
    )
    assert (verified["run_id"], verified["outcome"]) == ("sql-run", "event")
    assert verified["event"]["data"] == {"rows": 1200}
    # The run's next step: its own write, only when this transaction advanced the run.
    step = """
        BEGIN;
        SELECT matcher.advance_v1(:'msg') AS result \\gset
        \\echo :result
        SELECT :'result' = 'advanced' AS moved \\gset
        \\if :moved
            INSERT INTO app_effects (run_id, resolution_id)
            VALUES ((:'msg'::jsonb) -> 'data' ->> 'run_id',
                    ((:'msg'::jsonb) -> 'data' ->> 'resolution_id')::uuid);
        \\endif
        COMMIT;
    """
    assert _psql(psql, settings, step, msg=message) == "advanced"
    assert _psql(psql, settings, step, msg=message) == "duplicate"
    assert scalar(settings, "SELECT count(*) FROM app_effects") == 1
    committed = _psql(
        psql, settings, "SELECT matcher.committed_resume_v1(:'id');", id=registered["id"]
    )
    assert committed == message  # the database alone gives the resume back, byte for byte
    forged = message.replace('"sql-run"', '"other-run"')
    with pytest.raises(RuntimeError, match="MR001"):
        _psql(psql, settings, "SELECT matcher.advance_v1(:'msg');", msg=forged)


def _sql(conn: psycopg.Connection[Any], function: str, **args: Any) -> Any:
    """One API function called directly, by named arguments, its one value; a refusal as
    (SQLSTATE, message)."""
    named = ", ".join(f'"{name}" => %({name})s' for name in args)
    try:
        with conn.transaction():
            row = conn.execute(f"SELECT matcher.{function}({named})".encode(), args).fetchone()
    except psycopg.Error as exc:
        return (exc.sqlstate, (exc.diag.message_primary or "").removeprefix("matcher: "))
    assert row is not None
    return row[0]


def _sdk(call: Any, *args: Any) -> Any:
    """One SDK call; a refusal as (its exception type, message)."""
    try:
        return call(*args)
    except (ValueError, LookupError) as exc:
        return (type(exc).__name__, str(exc))


_REFUSALS = {"22023": "ValueError", "P0002": "LookupError", "MR001": "UnverifiedResume"}


def _same_refusal(by_sdk: Any, by_sql: Any) -> None:
    assert isinstance(by_sdk, tuple), by_sdk
    assert isinstance(by_sql, tuple), by_sql
    assert by_sdk == (_REFUSALS[by_sql[0]], by_sql[1])


def _anonymous(message: str) -> str:
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", message)


def _without_ids(model: Wait | Launch) -> dict[str, Any]:
    return model.model_dump(exclude={"id", "wait_id", "created_at", "updated_at",
                                     "correlation_id", "idempotency_key", "run_id"})  # fmt: skip


def test_the_sdk_and_direct_sql_give_the_same_answers_for_waits_and_launches(
    settings: Settings,
) -> None:
    deadline = datetime.now(UTC) + timedelta(hours=1)
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        spec: dict[str, Any] = {"tenant": "acme", "position": 2, "event_types": ["job.completed"],
                "deadline": deadline}  # fmt: skip
        by_sdk = register_wait(conn, WaitSpec(run_id="sdk", correlation_id="c-sdk", **spec))
        by_sql = Wait.model_validate(
            _sql(conn, "register_wait_v1", run_id="sql", correlation_id="c-sql", **spec)
        )
        assert _without_ids(by_sdk) == _without_ids(by_sql)
        assert get_wait(conn, by_sql.id) == Wait.model_validate(
            _sql(conn, "get_wait_v1", wait_id=by_sql.id)
        )
        assert get_wait(conn, uuid.uuid4()) is None
        assert _sql(conn, "get_wait_v1", wait_id=uuid.uuid4()) is None
        # Refusals: the same check, the same words.
        _same_refusal(
            _sdk(register_wait, conn, WaitSpec.model_construct(
                **(spec | {"run_id": "x", "correlation_id": " ", "external_job_id": None,
                           "id": None}))),
            _sql(conn, "register_wait_v1", run_id="x", correlation_id=" ", **spec),
        )  # fmt: skip
        # Cancel: true once, then false.
        assert [cancel_wait(conn, by_sdk.id), cancel_wait(conn, by_sdk.id)] == [
            _sql(conn, "cancel_wait_v1", wait_id=by_sql.id),
            _sql(conn, "cancel_wait_v1", wait_id=by_sql.id),
        ]
        # Launches: a retry answers the first launch; job ids once, then a conflict.
        launch = {"tenant": "acme", "position": 0, "event_types": ["job.completed"]}
        first = record_launch(conn, LaunchSpec(run_id="sdk-l", **launch))
        again = record_launch(conn, LaunchSpec(run_id="sdk-l", **launch))
        sql_first = Launch.model_validate(_sql(conn, "record_launch_v1", run_id="sql-l", **launch))
        sql_again = Launch.model_validate(_sql(conn, "record_launch_v1", run_id="sql-l", **launch))
        assert (first.id == again.id, sql_first.id == sql_again.id) == (True, True)
        assert _without_ids(first) == _without_ids(sql_first)
        for job in ("job-1", "job-1", "job-2"):
            assert record_job_id(conn, first.id, job) == _sql(
                conn, "record_job_id_v1", launch_id=sql_first.id, external_job_id=job
            )
        assert get_launch(conn, sql_first.id) == Launch.model_validate(
            _sql(conn, "get_launch_v1", launch_id=sql_first.id)
        )
        unknown = uuid.uuid4()
        _same_refusal(
            _sdk(record_job_id, conn, unknown, "job-3"),
            _sql(conn, "record_job_id_v1", launch_id=unknown, external_job_id="job-3"),
        )


async def test_the_sdk_and_direct_sql_give_the_same_answers_for_resumes(
    settings: Settings,
) -> None:
    with db(settings) as conn:
        waits = [
            register_wait(conn, WaitSpec(tenant="acme", run_id=run, position=0,
                                         event_types=["job.completed"], correlation_id=run))
            for run in ("by-sdk", "by-sql")
        ]  # fmt: skip
    async with running_daemon(settings):
        await produce(settings, [event(correlation=w.correlation_id) for w in waits])
        messages = await read_resume_messages(settings, at_least=2)
    by_run = {parse_resume(m).run_id: m for m in messages}
    sdk_resume, sql_message = parse_resume(by_run["by-sdk"]), by_run["by-sql"].decode()
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        # Reading back from the database: the same resume either way.
        for wait in waits:
            assert committed_resume(conn, wait.id) == read_resume(
                _sql(conn, "committed_resume_v1", wait_id=wait.id)
            )
        listed = unadvanced_resolutions(conn)
        direct = conn.execute(
            "SELECT message FROM matcher.unadvanced_resolutions_v1("
            "committed_before => now(), committed_after => '-infinity', max_rows => 100)"
        ).fetchall()
        assert [u.resume for u in listed] == [read_resume(row[0]) for row in direct]
        assert len(listed) == 2
        # Verify and advance: the SDK's booleans are the functions' answers.
        verify_resume(conn, sdk_resume)
        assert _sql(conn, "verify_resume_v1", message=sql_message)["run_id"] == "by-sql"
        assert [advance(conn, sdk_resume), advance(conn, sdk_resume)] == [
            _sql(conn, "advance_v1", message=sql_message) == "advanced",
            _sql(conn, "advance_v1", message=sql_message) == "advanced",
        ]
        assert unadvanced_resolutions(conn) == []
        # A forged resume: refused by both, in the same words.
        forged_sdk = parse_resume(by_run["by-sdk"].replace(b'"by-sdk"', b'"by-sdx"'))
        forged_sql = sql_message.replace('"by-sql"', '"by-sqx"')
        refused = _sdk(verify_resume, conn, forged_sdk)
        by_sql = _sql(conn, "verify_resume_v1", message=forged_sql)
        assert refused[0] == "UnverifiedResume"
        assert by_sql[0] == "MR001"
        assert _anonymous(refused[1]) == _anonymous(by_sql[1])


# Text near every edge the identifier check has: white space of every kind, NUL, long
# multi-byte text around 512 bytes.
_SPACES = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())
_identifiers = st.one_of(
    st.text(alphabet=st.sampled_from(_SPACES + "a\x00é\u3042"), max_size=6),
    st.text(max_size=20),
    st.integers(min_value=500, max_value=520).map(lambda n: "a" * n),
    st.integers(min_value=250, max_value=262).map(lambda n: "é" * n),
    st.integers(min_value=168, max_value=174).map(lambda n: "\u3042" * n),
)


def _accepted_by_sdk(conn: psycopg.Connection[Any], run_id: str, types: list[str]) -> Any:
    try:
        spec = WaitSpec(tenant="acme", run_id=run_id, position=0, event_types=types,
                        correlation_id="c")  # fmt: skip
        return register_wait(conn, spec).event_types
    except (ValueError, psycopg.Error):
        return None


def _accepted_by_sql(conn: psycopg.Connection[Any], run_id: str, types: list[str]) -> Any:
    try:
        found = _sql(conn, "register_wait_v1", tenant="acme", run_id=run_id, position=0,
                     event_types=types, correlation_id="c")  # fmt: skip
    except UnicodeEncodeError:  # a lone surrogate: no driver can send it
        return None
    return None if isinstance(found, tuple) else found["event_types"]


@hypothesis_settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(run_id=_identifiers, types=st.lists(_identifiers, min_size=0, max_size=4))
def test_the_sdk_and_sql_accept_the_same_identifiers_and_store_them_alike(
    settings: Settings, run_id: str, types: list[str]
) -> None:
    """Whatever text a caller gives, the SDK and a direct call refuse or store it alike
    (event types sorted the same way, by code point, whatever the database's collation)."""
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        by_sdk = _accepted_by_sdk(conn, run_id, types)
        by_sql = _accepted_by_sql(conn, run_id, types)
    assert by_sdk == by_sql, (run_id, types)

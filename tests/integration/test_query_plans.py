"""The hot queries stay on their indexes when the tables are big (EXPLAIN, not timing)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.rows import args_row
from psycopg.types.json import Jsonb

from matcher.store import outbox
from matcher.store.pipelined import pipelined_transaction
from matcher.store.sql import query
from tests.support.services import Services, create_database, drop_database, with_database

ROWS = 60_000


@pytest.fixture(scope="module")
def big(services: Services, template_db: str) -> Iterator[psycopg.Connection[Any]]:
    """One database of big tables for the whole module: the plans are only EXPLAINed,
    never run, so the tests cannot change what the next one sees (filling it once per
    test cost over a minute)."""
    name = f"matcher_t_{uuid.uuid4().hex[:12]}"
    create_database(services, name, template=template_db)
    try:
        url = with_database(services.database_url, name)
        with psycopg.connect(url, autocommit=True) as conn:
            _fill(conn)
            yield conn
    finally:
        drop_database(services, name)


def _fill(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO matcher.waits (id, tenant, run_id, position, event_types, correlation_id,"
        " state, created_at, resolved_at, resolution, deadline, resolution_id, outcome)"
        " SELECT gen_random_uuid(), 't' || (g %% 50), 'run-' || g, 0, ARRAY['done'], 'c-' || g,"
        " CASE WHEN g %% 100 = 0 THEN 'waiting' ELSE 'matched' END, now() - interval '1 day',"
        " CASE WHEN g %% 100 = 0 THEN NULL ELSE now() END,"
        " CASE WHEN g %% 100 = 0 THEN NULL ELSE 'event' END,"
        " now() + (g || ' seconds')::interval,"
        " CASE WHEN g %% 100 = 0 THEN NULL ELSE gen_random_uuid() END,"
        " CASE WHEN g %% 100 = 0 THEN NULL ELSE 'event' END"
        " FROM generate_series(1, %s) AS g",
        [ROWS],
    )
    # Spread over the 15 days a default window keeps, so lookups meet every partition.
    conn.execute("SELECT matcher.ensure_inbox_partitions(now() - interval '14 days', now())")
    conn.execute(
        "INSERT INTO matcher.inbox (producer, event_id, tenant, type, correlation_id,"
        " external_job_id, received_at, kafka_topic, kafka_partition, kafka_offset, data, status)"
        " SELECT 'p', 'e-' || g, 't' || (g %% 50), 'done', 'c-' || g, 'job-' || g,"
        " now() - make_interval(days => g %% 15), 'events', g %% 6, g, '{}',"
        " CASE WHEN g %% 100 = 1 THEN 'pending' ELSE 'consumed' END"
        " FROM generate_series(1, %s) AS g",
        [ROWS],
    )
    conn.execute(
        "INSERT INTO matcher.event_ids (producer, event_id, received_at)"
        " SELECT producer, event_id, received_at FROM matcher.inbox"
    )
    conn.execute(
        "INSERT INTO matcher.resume_queue (wait_id)"
        " SELECT id FROM matcher.waits WHERE state = 'matched' AND run_id LIKE '%%7'"
    )
    for table in ("waits", "inbox", "event_ids", "resume_queue", "open_waits"):
        conn.execute(f"VACUUM ANALYZE matcher.{table}".encode())


def _nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from _nodes(value)
    elif isinstance(plan, list):
        for item in plan:
            yield from _nodes(item)


def _scans(plan: Any) -> list[tuple[str, str]]:
    return [(n["Node Type"], n["Relation Name"]) for n in _nodes(plan) if "Relation Name" in n]


def _explain(conn: psycopg.Connection[Any], sql: str, params: Any) -> list[tuple[str, str]]:
    row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}".encode(), params).fetchone()
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return _scans(plan)


KEYS = {"tenant": ["t1", "t2"], "correlation_id": ["c-1", "c-2"]}
HOT = [
    ("rematch", "lock_wait_keys", KEYS),
    ("rematch", "waits_for_keys", KEYS),
    ("resolve", "sweep_deadlines", {"limit": 1000}),
    ("outbox", "claim_unpublished", {"limit": 500}),
    ("maintenance", "expire_pending", {"retention": timedelta(days=7), "limit": 5000}),
    ("maintenance", "expired_days", {"keep": timedelta(days=14)}),
    (
        "maintenance",
        "day_still_needed",
        {"starts": datetime(2026, 1, 1, tzinfo=UTC), "ends": datetime(2026, 1, 2, tzinfo=UTC)},
    ),
    ("explain", "events_by_correlation", {"correlation_ids": ["c-1"], "condition": None}),
    ("explain", "waits_of_run", {"run_id": "run-1", "tenant": None}),
    ("stats", "gauges", {}),
]
BIG_TABLES = {"waits", "inbox", "event_ids", "resume_queue", "open_waits"}


@pytest.mark.parametrize(("module", "name", "params"), HOT, ids=[f"{m}.{n}" for m, n, _ in HOT])
def test_hot_query_uses_indexes(
    big: psycopg.Connection[Any], module: str, name: str, params: Any
) -> None:
    scans = _explain(big, query(module, name), params)
    sequential = _big_tables_scanned(big, scans)
    # The queue and the open waits are read whole where the question is about all of them
    # (the queue is short but for an outage; the open waits are what a partial index on
    # waiting waits held).
    if name in ("day_still_needed", "gauges"):
        sequential = [t for t in sequential if t not in ("resume_queue", "open_waits")]
    assert sequential == [], f"{module}.{name} scans {sequential} sequentially: {scans}"


def _big_tables_scanned(big: psycopg.Connection[Any], scans: list[tuple[str, str]]) -> list[str]:
    """The big tables ``scans`` reads sequentially. A day of the inbox is scanned as a
    table of its own; the days to come are empty, and a sequential scan of nothing costs
    nothing."""
    empty = {
        row[0]
        for row in big.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'matcher'::regnamespace"
            " AND relname ~ '^inbox_p' AND reltuples <= 0"
        )
    }
    return [
        table
        for node, table in scans
        if node == "Seq Scan"
        and re.sub(r"_p\d{8}$", "", table) in BIG_TABLES
        and table not in empty
    ]


def test_forgetting_a_days_ids_walks_the_indexes(big: psycopg.Connection[Any]) -> None:
    # The janitor's keyset over one day, deleting through event_ids' primary key.
    day = (datetime.now(UTC) - timedelta(days=3)).strftime("inbox_p%Y%m%d")
    statement = pgsql.SQL(query("maintenance", "forget_day_ids")).format(
        day=pgsql.Identifier("matcher", day)
    )
    params = {
        "after_producer": "p",
        "after_event_id": "e-1",
        "limit": 5000,
        "starts": datetime(2026, 1, 1, tzinfo=UTC),
        "ends": datetime(2026, 1, 2, tzinfo=UTC),
    }
    scans = _explain(big, statement.as_string(big), params)
    sequential = _big_tables_scanned(big, scans)
    assert sequential == [], f"forget_day_ids scans {sequential} sequentially: {scans}"


# The operator console's queries (matcher.store.browsing), on the same big tables.
UUID1 = "00000000-0000-0000-0000-000000000001"
PAGE = {"limit": 51, "offset": 0}
WAITS_FILTERS = {"tenant": None, "state": None, "correlation_id": None, "job_id": None}
CONSOLE = [
    ("oldest_waiting", {"limit": 200}),
    ("events_of_correlations", {"correlation_ids": ["c-1", "c-2"], "limit": 5000}),
    ("quarantine_of_correlations", {"correlation_ids": ["c-1"], "limit": 5000}),
    ("queued_keys", {"correlation_ids": ["c-1"]}),
    ("quarantine_last_hour", {}),
    ("waiting_oldest_first", {"tenant": None, **PAGE}),
    ("waiting_newest_first", {"tenant": "t1", **PAGE}),
    ("waits_by_run", {**WAITS_FILTERS, "run_id": "run-1", "newest": False, **PAGE}),
    ("waits_by_correlation", {**WAITS_FILTERS, "correlation_id": "c-1", "newest": True, **PAGE}),
    ("waits_by_job", {**WAITS_FILTERS, "job_id": "job-1", "newest": False, **PAGE}),
    ("waits_by_ids", {"ids": [UUID1]}),
    ("run_progress", {"tenant": "t1", "run_id": "run-1"}),
    ("launches_of_run", {"tenant": "t1", "run_id": "run-1", "limit": 50}),
    ("audit_of_launches", {"ids": [UUID1], "limit": 500}),
    ("events_by_correlation_page", {"correlation_id": "c-1", "job_id": None, **PAGE}),
    ("events_by_job_page", {"job_id": "job-1", **PAGE}),
    ("events_pending_page", PAGE),
    ("quarantine_page", {"reason": None, "producer": None, "correlation_id": None, **PAGE}),
    ("quarantine_page", {"reason": "malformed", "producer": "p", "correlation_id": None, **PAGE}),
    ("quarantine_page", {"reason": None, "producer": None, "correlation_id": "c-1", **PAGE}),
    ("worker_failures_of_waits", {"tenants": ["t1"], "run_ids": ["run-1"], "ids": [UUID1]}),
    ("unreplayed_with_reason", {"reason": "malformed"}),
]
CONSOLE_TABLES = BIG_TABLES | {"quarantine", "launches", "launch_audit"}


@pytest.fixture(scope="module")
def big_console(big: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    big.execute(
        "INSERT INTO matcher.quarantine (received_at, kafka_topic, kafka_partition,"
        " kafka_offset, reason, producer, correlation_id)"
        " SELECT now() - make_interval(mins => g %% 5000), 'events', g %% 6, g,"
        " CASE WHEN g %% 10 = 0 THEN 'malformed' ELSE 'bad_signature' END, 'p', 'c-' || g"
        " FROM generate_series(1, %s) AS g",
        [ROWS],
    )
    big.execute("VACUUM ANALYZE matcher.quarantine")
    return big


@pytest.mark.parametrize(
    ("name", "params"), CONSOLE, ids=[f"console.{n}.{i}" for i, (n, _) in enumerate(CONSOLE)]
)
def test_console_query_uses_indexes(
    big_console: psycopg.Connection[Any], name: str, params: Any
) -> None:
    scans = _explain(big_console, query("browsing", name), params)
    empty = {
        row[0]
        for row in big_console.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'matcher'::regnamespace"
            " AND relname ~ '^inbox_p' AND reltuples <= 0"
        )
    }
    sequential = [
        table
        for node, table in scans
        if node == "Seq Scan"
        and re.sub(r"_p\d{8}$", "", table) in CONSOLE_TABLES
        and table not in empty
    ]
    if params.get("tenant") is not None:
        # The fixture's 2,000 open waits fit a few pages: filtered by tenant, reading them
        # all beats walking their index (a million would not).
        sequential = [t for t in sequential if t != "open_waits"]
    assert sequential == [], f"console.{name} scans {sequential} sequentially: {scans}"


def _sql_functions(conn: psycopg.Connection[Any]) -> list[str]:
    """matcher's functions written in SQL (the planner can inline these; PL/pgSQL ones
    it cannot, and they are called on purpose)."""
    return [
        row[0]
        for row in conn.execute(
            "SELECT p.proname FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang"
            " WHERE p.pronamespace = 'matcher'::regnamespace AND l.lanname = 'sql'"
        )
    ]


@pytest.mark.parametrize(("module", "name", "params"), HOT, ids=[f"{m}.{n}" for m, n, _ in HOT])
def test_hot_query_inlines_its_sql_functions(
    big: psycopg.Connection[Any], module: str, name: str, params: Any
) -> None:
    """A SQL function left as a call runs through the SQL-function executor for every
    row: matcher.rfc3339, declared IMMUTABLE over a STABLE body, was never inlined, and
    its six calls per resume message were 40% of the relay's claim."""
    row = big.execute(
        f"EXPLAIN (VERBOSE, FORMAT JSON) {query(module, name)}".encode(), params
    ).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], str) else json.dumps(row[0])
    called = [f for f in _sql_functions(big) if re.search(rf"\b{re.escape(f)}\(", plan)]
    assert called == [], f"{module}.{name} calls {called} instead of inlining them"


# An ingest batch: half of it new events for the waiting waits of the big tables, a
# quarter new events on keys without waits, a quarter ids stored before (duplicates).
INGEST_BATCH = 400


def _ingest_params(conn: psycopg.Connection[Any]) -> dict[str, list[Any]]:
    keys = conn.execute(
        "SELECT tenant, correlation_id FROM matcher.waits WHERE state = 'waiting' LIMIT %s",
        [INGEST_BATCH // 2],
    ).fetchall()
    keys += [("t1", f"no-wait-{n}") for n in range(INGEST_BATCH // 4)]
    ids = [("p", f"new-{uuid.uuid4().hex}") for _ in keys]
    ids += [("p", f"e-{n}") for n in range(1, INGEST_BATCH // 4 + 1)]
    keys += [("t1", f"c-{n}") for n in range(1, INGEST_BATCH // 4 + 1)]
    return _batch_params(ids, keys)


def _batch_params(ids: list[tuple[str, str]], keys: list[tuple[str, str]]) -> dict[str, list[Any]]:
    """matcher.ingest_events' arguments for events of these (producer, id) and keys."""
    count = len(ids)
    return {
        "producer": [p for p, _ in ids],
        "event_id": [e for _, e in ids],
        "tenant": [t for t, _ in keys],
        "type": ["done"] * count,
        "correlation_id": [c for _, c in keys],
        "external_job_id": [None] * count,
        "occurred_at": [None] * count,
        "topic": ["events"] * count,
        "partition": [0] * count,
        "offset": list(range(count)),
        "data": [Jsonb({})] * count,
        "trace_parent": [None] * count,
    }


# auto_explain's settings for a session whose plans a test reads: every statement's plan,
# as run (row counts without timing), in JSON, sent to the client as a notice.
AUTO_EXPLAIN = (
    "log_min_duration = 0", "log_analyze = on", "log_timing = off", "log_format = json",
    "log_level = notice",
)  # fmt: skip


def _plan_collector(plans: list[Any]) -> Callable[[psycopg.errors.Diagnostic], None]:
    """A notice handler that appends each plan auto_explain sends to ``plans``."""

    def collect(notice: psycopg.errors.Diagnostic) -> None:
        text = notice.message_primary
        if text and text.startswith("duration"):
            plans.append(json.loads(text.split("\n", 1)[1]))

    return collect


def _nested_plans(
    conn: psycopg.Connection[Any], params: dict[str, list[Any]]
) -> tuple[list[Any], tuple[Any, ...]]:
    """The plans of the statements matcher.ingest_events runs, as it ran them (with
    auto_explain, in a transaction rolled back), after five calls: PL/pgSQL keeps a
    statement's generic plan from then on (the function forces generic plans)."""
    plans: list[Any] = []
    conn.add_notice_handler(_plan_collector(plans))
    with conn.transaction(force_rollback=True):
        # The fill's waits were queued for their first look (a rematch pass would take
        # them): taken out, so that their events are decided here.
        conn.execute("DELETE FROM matcher.match_queue")
        for _ in range(5):
            with conn.transaction(force_rollback=True):
                conn.execute(query("ingest", "ingest_events"), params)
        conn.execute("LOAD 'auto_explain'")
        for setting in (*AUTO_EXPLAIN, "log_nested_statements = on"):
            conn.execute(f"SET LOCAL auto_explain.{setting}".encode())
        row = conn.execute(query("ingest", "ingest_events"), params).fetchone()
    assert row is not None
    return plans, row


def _quadratic_nodes(plan: Any) -> list[str]:
    """Plan nodes that went through far more rows than the batch has, over all their
    loops (EXPLAIN gives a looped node's rows per loop): a nested loop over two
    intermediate results, or a subquery run for each event over one of them, which a
    generic plan falls into when it takes each for a row (see migration 0016)."""
    found: list[str] = []
    for node in _nodes(plan):
        rows = _rows_through(node)
        if rows > 10 * INGEST_BATCH:
            found.append(f"{node['Node Type']} went through {rows:.0f} rows")
    return found


def test_ingest_statements_use_indexes_and_no_quadratic_plan(
    big: psycopg.Connection[Any],
) -> None:
    params = _ingest_params(big)
    plans, counts = _nested_plans(big, params)
    statements = [p["Query Text"] for p in plans]
    assert len(plans) >= 6, f"expected the function's statements, got {statements}"
    for plan in plans:
        scans = _scans(plan["Plan"])
        # The fixture's open waits (2,000) fit a few pages, which a plan may read whole
        # to delete a batch's; the rows-read bound below still holds it.
        sequential = [t for n, t in scans if n == "Seq Scan" and t in BIG_TABLES - {"open_waits"}]
        assert sequential == [], f"{plan['Query Text'][:80]} scans {sequential}: {scans}"
        quadratic = _quadratic_nodes(plan["Plan"])
        assert quadratic == [], f"{plan['Query Text'][:80]}: {quadratic}"
    # The batch was decided as built: the waiting waits' events matched, the rest stored
    # pending, the known ids recognised as duplicates.
    accepted, duplicates, matched, late, deferred = counts
    assert (accepted, duplicates, matched, late, deferred) == (
        INGEST_BATCH * 3 // 4,
        INGEST_BATCH // 4,
        INGEST_BATCH // 2,
        0,
        0,
    )


def test_comparing_duplicates_reads_each_stored_event_by_its_key(
    big: psycopg.Connection[Any],
) -> None:
    """The look-up of conflicting duplicates (a batch with duplicates only) goes to each
    stored event by index, through the id's row and its day, not over the inbox; run as
    the batch's own rows (a quarter of them ids stored before), it finds none of them
    different but the ones made different here."""
    params = _ingest_params(big)
    sql = query("ingest", "conflicting_duplicates")
    with big.transaction(force_rollback=True):
        scans = _explain(big, sql, params)
        sequential = _big_tables_scanned(big, scans)
        assert sequential == [], f"conflicting_duplicates scans {sequential}: {scans}"
        stored = {
            (row[0], row[1]): row[2:]
            for row in big.execute(
                "SELECT producer, event_id, tenant, correlation_id, external_job_id, data"
                " FROM matcher.inbox"
                " WHERE producer = 'p' AND event_id = ANY(%s)",
                [params["event_id"]],
            )
        }
        assert len(stored) == INGEST_BATCH // 4  # the duplicates' stored events
        # The duplicates as stored, but two: one with other data, one with another key.
        same: dict[str, list[Any]] = {
            "tenant": [], "correlation_id": [], "external_job_id": [], "data": []
        }  # fmt: skip
        for n, key in enumerate(zip(params["producer"], params["event_id"], strict=True)):
            tenant, correlation, job, data = stored.get(key, ("t1", f"x-{n}", None, {}))
            same["tenant"].append(tenant)
            same["correlation_id"].append(correlation)
            same["external_job_id"].append(job)
            same["data"].append(Jsonb(data))
        first, second = [n for n, k in enumerate(params["event_id"]) if k.startswith("e-")][:2]
        same["data"][first] = Jsonb({"other": True})
        same["correlation_id"][second] = "another"
        found = big.execute(sql.encode(), params | same).fetchall()
    assert found == [(first + 1,), (second + 1,)]


def test_a_small_batch_reads_few_rows_when_statistics_are_stale(db_url: str) -> None:
    """A burst of waits registered since the last ANALYZE (a benchmark registers its waits
    first; so may a busy day) left the statistics counting a few waiting waits, and the
    resolution's kept plan read every waiting wait for each batch: 1.3 ms of a 2.2 ms
    ingest call at 500 events/s (migration 0017). Whatever the statistics say, a batch of
    two reads a few rows per statement."""
    waits = 8_000
    with psycopg.connect(db_url, autocommit=True) as conn:
        # Never analyzed: the planner knows the table only by its size on disk.
        conn.execute("ALTER TABLE matcher.waits SET (autovacuum_enabled = off)")
        conn.execute(
            "INSERT INTO matcher.waits (id, tenant, run_id, position, event_types,"
            " correlation_id) SELECT gen_random_uuid(), 't', 'run-' || g, 0, ARRAY['done'],"
            " 'c-' || g FROM generate_series(1, %s) AS g",
            [waits],
        )
        keys = [("t", "c-7"), ("t", "c-7001")]
        ids = [("p", f"new-{uuid.uuid4().hex}") for _ in keys]
        plans, counts = _nested_plans(conn, _batch_params(ids, keys))
    assert counts[2] == 2, f"both events should have matched: {counts}"
    resolving = [p for p in plans if "UPDATE matcher.waits" in p["Query Text"]]
    assert resolving, "the resolution's plan was not captured"
    for plan in plans:
        heavy = [
            f"{node['Node Type']} {node.get('Relation Name', '')}: {rows:.0f} rows"
            for node in _nodes(plan["Plan"])
            if (rows := _rows_through(node)) > 50
        ]
        assert heavy == [], f"{plan['Query Text'][:80]!r} read {heavy}"


def _rows_through(node: dict[str, Any]) -> float:
    """The rows a plan node went through, over all its loops."""
    per_loop = sum(
        node.get(k, 0)
        for k in ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter")
    )
    return float(per_loop * node.get("Actual Loops", 1))


async def test_the_relays_claim_reads_few_rows_after_the_queue_grew(db_url: str) -> None:
    """The relay claims on pooled connections that live up to an hour. A plan kept from
    their first claims, made while the tables were near empty, would read every wait for
    each batch once they had grown (a relay behind, Kafka down): whatever the session saw
    first, the relay's claim of two reads a few rows."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # Never analyzed: the planner knows the tables only by their size on disk.
        for table in ("resume_queue", "waits"):
            await conn.execute(f"ALTER TABLE matcher.{table} SET (autovacuum_enabled = off)")
        for _ in range(12):
            await _queued(conn, 2)
            assert len(await _claim(conn, [])) == 2
        await _queued(conn, 8000)
        plans: list[Any] = []
        conn.add_notice_handler(_plan_collector(plans))
        claimed = await _claim(
            conn,
            ["LOAD 'auto_explain'"]
            + [f"SET LOCAL auto_explain.{setting}" for setting in AUTO_EXPLAIN],
        )
    assert len(claimed) == 2, f"two rows should be claimed: {claimed}"
    claims = [p for p in plans if "DELETE FROM matcher.resume_queue" in p["Query Text"]]
    assert claims, f"the claim's plan was not captured: {[p['Query Text'][:60] for p in plans]}"
    heavy = [
        f"{node['Node Type']} {node.get('Relation Name', '')}: {rows_:.0f} rows"
        for node in _nodes(claims[0]["Plan"])
        if (rows_ := _rows_through(node)) > 50
    ]
    assert heavy == [], f"the claim read {heavy}"


async def _claim(conn: psycopg.AsyncConnection[Any], first: list[str]) -> list[outbox.Claimed]:
    """The relay's claim of two, in its own kind of transaction, after ``first``."""
    async with (
        pipelined_transaction(conn) as pipeline,
        conn.cursor(row_factory=args_row(outbox.Claimed)) as cur,
    ):
        for statement in first:
            await conn.execute(statement.encode())
        return await outbox.claim_unpublished(cur, pipeline, 2)


async def _queued(conn: psycopg.AsyncConnection[Any], count: int) -> None:
    """``count`` resolved waits, each with its resume queued."""
    await conn.execute(
        "WITH w AS ("
        " INSERT INTO matcher.waits (id, tenant, run_id, position, event_types, correlation_id,"
        " state, resolved_at, resolution, resolution_id, outcome)"
        " SELECT gen_random_uuid(), 't', 'run-' || gen_random_uuid(), 0, ARRAY['done'], 'c',"
        " 'cancelled', now(), 'cancel', gen_random_uuid(), 'cancelled'"
        " FROM generate_series(1, %(count)s) RETURNING id)"
        " INSERT INTO matcher.resume_queue (wait_id) SELECT id FROM w",
        {"count": count},
    )

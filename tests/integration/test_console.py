"""The operator console (/console) of a running daemon: sign-in, sessions and CSRF, the
security headers, pages over real data, escaping of hostile text, and replay."""

from __future__ import annotations

import asyncio
import html
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import markupsafe
import psycopg
import pytest

from matcher.config import Settings
from matcher.domain.waits import WaitSpec
from matcher.sdk import register_wait
from tests.support.db import scalar
from tests.support.kafka import produce, produce_raw
from tests.support.processes import DaemonProcess, process_env
from tests.support.records import event
from tests.support.services import Services, own_database, own_settings

TOKEN = "console-token-for-tests-0123456789abcdef"
PAYLOAD = '"><img src=x onerror=alert(1)><script>alert(1)</script>'
# A right-to-left override and a zero-width space: "exe.png" shown as "user\u202egnp.exe".
BIDI = "user\u202egnp.exe\u200b"
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)


@dataclass
class Console:
    url: str
    settings: Settings


def _until(check: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout}s")
        time.sleep(0.05)


def _seed(settings: Settings) -> None:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for run, correlation in [
            ("run-mismatch", "c-mismatch"), ("run-xss", "c-xss"), ("run-parked", "c-parked"),
        ]:  # fmt: skip
            register_wait(
                conn,
                WaitSpec(
                    tenant="acme",
                    run_id=run,
                    position=0,
                    event_types=["job.completed"],
                    correlation_id=correlation,
                ),
            )
        register_wait(
            conn,
            WaitSpec.model_validate({
                "tenant": "acme", "run_id": "run-fan-in", "position": 0, "rule": "all",
                "conditions": [{"event_types": ["job.completed"], "correlation_id": c}
                               for c in ("c-fan-1", "c-fan-2")],
            }),
        )  # fmt: skip
    bad_headers = [
        ("ce_id", PAYLOAD.encode()),
        ("x-evil", PAYLOAD.encode()),
        ("x-bidi", BIDI.encode()),
        ("x-literal", b"\\u200b"),  # the six characters, as text
    ]
    asyncio.run(
        produce(
            settings,
            [
                event(tenant="globex", correlation="c-mismatch"),
                event(correlation="c-parked"),
                event(
                    correlation="c-xss", type_="job.progress", data={"note": PAYLOAD, "who": BIDI}
                ),
            ],
        )
    )
    asyncio.run(
        produce_raw(
            settings,
            [
                (b"k", bad_headers, b"{not json " + PAYLOAD.encode()),
                (b"k", [("ce_id", b"bin")], b"\xff\xfe\x00binary"),
            ],
        )
    )
    _until(lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 3, "stored")
    _until(lambda: scalar(settings, "SELECT count(*) FROM matcher.quarantine") == 2, "kept")
    _park(settings, "run-parked")


def _park(settings: Settings, run: str) -> None:
    """A worker's handler failed on the run's resume, once, with max_attempts 1: parked."""
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        conn.execute(
            "SELECT matcher.record_worker_failure_v1(matcher.committed_resume_v1(w.id), "
            "'RuntimeError: the ledger refuses ' || %s, 1) FROM matcher.waits AS w "
            "WHERE w.run_id = %s",
            [PAYLOAD, run],
        )


@pytest.fixture(scope="module")
def console(services: Services, template_db: str) -> Iterator[Console]:
    with (
        own_database(services, template_db) as url,
        own_settings(services, url, admin_token=TOKEN) as settings,
    ):
        daemon = DaemonProcess(process_env(settings, MATCHER_ADMIN_TOKEN=TOKEN))
        daemon.wait_ready()
        try:
            _seed(settings)
            yield Console(daemon.admin_url(), settings)
        finally:
            assert daemon.terminate() == 0, daemon.output


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    return found.group(1)


@pytest.fixture
def signed_in(console: Console) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=console.url, timeout=30) as http:
        answer = http.post("/console/sign-in", data={"token": TOKEN, "next": "/console/runs"})
        assert answer.status_code == 303
        assert answer.headers["location"] == "/console/runs"
        yield http


def test_sign_in_sets_a_strict_http_only_cookie(console: Console) -> None:
    with httpx.Client(base_url=console.url, timeout=30) as http:
        form = http.get("/console/sign-in", params={"next": "/console/events"})
        assert form.status_code == 200
        assert '<label for="token">Admin token</label>' in form.text
        assert 'name="next" value="/console/events"' in form.text
        wrong = http.post("/console/sign-in", data={"token": "nope", "next": "/console"})
        assert wrong.status_code == 401
        assert "That token is not valid." in wrong.text
        assert "set-cookie" not in wrong.headers
        right = http.post("/console/sign-in", data={"token": TOKEN, "next": "/console/events"})
        assert right.status_code == 303
        assert right.headers["location"] == "/console/events"
        cookie = right.headers["set-cookie"]
        assert cookie.startswith("matcher_console=")
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
        assert "Secure" not in cookie  # plain http here
        assert http.get("/console/events").status_code == 200


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/console", "/v1/waits", "/\\evil.example"]
)
def test_next_never_leaves_the_console(console: Console, target: str) -> None:
    with httpx.Client(base_url=console.url, timeout=30) as http:
        answer = http.post("/console/sign-in", data={"token": TOKEN, "next": target})
        assert answer.status_code == 303
        assert answer.headers["location"] == "/console"


def test_a_sign_in_body_is_bounded_while_read(console: Console) -> None:
    """The answer comes once the bound is passed, not after the whole body: a server that
    buffered first would still be waiting for the rest of this one."""
    host, port = console.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /console/sign-in HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"a" * 32768
        for _ in range(4):  # 128 KiB of an endless body, then silence
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]


def test_unauthenticated_requests_are_redirected_or_refused(console: Console) -> None:
    with httpx.Client(base_url=console.url, timeout=30) as http:
        answer = http.get("/console/runs", params={"state": "waiting"})
        assert answer.status_code == 303
        assert (
            answer.headers["location"]
            == "/console/sign-in?next=%2Fconsole%2Fruns%3Fstate%3Dwaiting"
        )
        assert answer.headers["content-security-policy"] == CSP
        assert http.post("/console/quarantine/replay", data={"ids": "1"}).status_code == 403
        http.cookies.set("matcher_console", "9999999999.x.deadbeef")
        assert http.get("/console").status_code == 303
        http.cookies.clear()
        # The bearer header works for the console too (curl).
        bearer = http.get("/console", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200
        assert http.get("/v1/waits", headers={"Authorization": f"Bearer {TOKEN}"}).is_success


def test_csrf_is_required(signed_in: httpx.Client) -> None:
    assert signed_in.post("/console/quarantine/replay", data={"ids": "1"}).status_code == 403
    wrong = {"ids": "1", "csrf": "0" * 64}
    assert signed_in.post("/console/quarantine/replay", data=wrong).status_code == 403
    assert signed_in.post("/console/sign-out", data={}).status_code == 403
    page = signed_in.get("/console/quarantine").text
    out = signed_in.post("/console/sign-out", data={"csrf": _csrf(page)})
    assert out.status_code == 303
    assert out.headers["location"] == "/console/sign-in"
    signed_in.cookies.clear()
    assert signed_in.get("/console").status_code == 303


def test_headers_and_overview(signed_in: httpx.Client) -> None:
    page = signed_in.get("/console")
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == CSP
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert page.headers["cache-control"] == "no-store"
    assert "<script" not in page.text
    assert '<nav aria-label="Console">' in page.text
    assert '<main id="content">' in page.text
    for verdict in ("missing_signal", "mismatch", "backlog", "waiting"):
        assert f'id="verdict-{verdict}"' in page.text
    mismatch = re.search(
        r'id="verdict-mismatch" href="([^"]+)"><span class="figure">(\d+)', page.text
    )
    assert mismatch, page.text
    assert mismatch.group(1) == "/console/runs?verdict=mismatch"
    assert int(mismatch.group(2)) == 2  # other tenant, other type
    assert 'href="/console/quarantine?reason=malformed"' in page.text
    listed = signed_in.get("/console/runs", params={"verdict": "mismatch"})
    assert "run-mismatch" in listed.text
    assert "run-xss" in listed.text
    css = signed_in.get("/console/static/console.css")
    assert css.headers["content-type"].startswith("text/css")


def test_a_run_with_a_mismatched_tenant_shows_mismatch(signed_in: httpx.Client) -> None:
    page = signed_in.get("/console/runs/run-mismatch", params={"tenant": "acme"})
    assert page.status_code == 200
    verdict = page.text.split('<section id="verdict"', 1)[1].split("</section>", 1)[0]
    assert ">mismatch<" in verdict
    assert "tenant &#39;globex&#39;" in verdict
    assert "mismatched_tenant" in page.text
    assert "registered" in page.text
    missing = signed_in.get("/console/runs/no-such-run")
    assert missing.status_code == 404
    assert missing.headers["content-security-policy"] == CSP


def test_a_fan_in_run_shows_its_conditions(signed_in: httpx.Client) -> None:
    page = signed_in.get("/console/runs/run-fan-in", params={"tenant": "acme"})
    assert page.status_code == 200
    assert "Conditions: 0 of 2 met, 2 needed" in page.text
    assert "0 of 2 conditions met (all needed): waiting for job.completed on" in page.text
    assert 'href="/console/events?correlation_id=c-fan-2"' in page.text


def test_a_parked_run_is_listed_and_explained(signed_in: httpx.Client, console: Console) -> None:
    listed = signed_in.get("/console/runs", params={"verdict": "parked"})
    assert listed.status_code == 200
    assert "run-parked" in listed.text
    assert "run-mismatch" not in listed.text
    page = signed_in.get("/console/runs/run-parked", params={"tenant": "acme"})
    verdict = page.text.split('<section id="verdict"', 1)[1].split("</section>", 1)[0]
    assert ">parked<" in verdict
    assert "the ledger refuses" in verdict
    assert "<img src=x" not in page.text  # the handler's error is stored text: escaped
    api = signed_in.get(
        "/v1/runs/run-parked/explain",
        params={"tenant": "acme"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert api.status_code == 200
    assert api.json()["verdict"] == "parked"
    assert api.json()["evidence"]["resume"]["worker"]["attempts"] == 1


def test_hostile_text_is_escaped(signed_in: httpx.Client) -> None:
    escaped = str(markupsafe.escape(PAYLOAD))
    for path in (
        "/console/events?correlation_id=c-xss",
        "/console/quarantine",
        "/console/runs/run-xss",
    ):
        page = signed_in.get(path)
        assert page.status_code == 200, path
        assert PAYLOAD not in page.text, path
        assert "<img" not in page.text, path
        assert "<script" not in page.text, path
    quarantine = signed_in.get("/console/quarantine").text
    assert escaped in quarantine
    assert "ff fe 00" in quarantine  # the binary value, as hex
    events = signed_in.get("/console/events", params={"correlation_id": "c-xss"}).text
    assert str(markupsafe.escape(PAYLOAD.replace('"', '\\"'))) in events
    # Format characters are shown, not obeyed: the page does not read reversed. Each is
    # marked, so it reads apart from a stored text that spells its escape.
    revealed = (
        'user<span class="revealed" title="RIGHT-TO-LEFT OVERRIDE">\\u202e</span>gnp.exe'
        '<span class="revealed" title="ZERO WIDTH SPACE">\\u200b</span>'
    )
    for shown in (quarantine, events):
        assert "\u202e" not in shown
        assert "\u200b" not in shown
        assert revealed in shown
    assert "<dt>x-literal</dt><dd>\\u200b</dd>" in quarantine
    # A form's field keeps the text itself, so filtering again filters by the same text.
    runs = signed_in.get("/console/runs", params={"tenant": BIDI}).text
    assert f'name="tenant" value="{BIDI}"' in runs
    # A link built from hostile text stays one encoded parameter.
    runs = signed_in.get("/console/runs", params={"tenant": PAYLOAD}).text
    assert PAYLOAD not in runs


def test_pagination_is_bounded(signed_in: httpx.Client) -> None:
    page = signed_in.get("/console/quarantine", params={"limit": 100000})
    assert page.status_code == 200
    one = signed_in.get("/console/quarantine", params={"limit": 1})
    assert one.text.count('name="ids"') == 1
    following = re.search(r'href="([^"]+)" rel="next">Next', one.text)
    assert following, one.text
    second = signed_in.get(html.unescape(following.group(1)))
    assert second.text.count('name="ids"') == 1
    assert 'rel="prev">Previous' in second.text
    assert signed_in.get("/console/runs", params={"limit": "lots"}).status_code == 400
    assert signed_in.get("/console/runs", params={"state": "bogus"}).status_code == 400


def test_replay_asks_then_reports(signed_in: httpx.Client, console: Console) -> None:
    page = signed_in.get("/console/quarantine", params={"reason": "malformed"}).text
    ids = re.findall(r'name="ids" value="(\d+)"', page)
    assert ids
    csrf = _csrf(page)
    ask = signed_in.post("/console/quarantine/replay", data={"csrf": csrf, "ids": ids})
    assert ask.status_code == 200
    assert f"Replay {len(ids)} records?" in ask.text
    assert 'name="confirm" value="yes"' in ask.text
    before = scalar(console.settings, "SELECT count(*) FROM matcher.quarantine")
    done = signed_in.post(
        "/console/quarantine/replay", data={"csrf": csrf, "ids": ids, "confirm": "yes"}
    )
    assert done.status_code == 200
    for record in ids:
        assert f'id="outcome-{record}"' in done.text
    assert "still rejected: malformed" in done.text
    assert scalar(console.settings, "SELECT count(*) FROM matcher.quarantine") == before


def test_the_runs_list_has_a_verdict_column(signed_in: httpx.Client) -> None:
    page = signed_in.get("/console/runs").text  # waiting waits, unfiltered by verdict
    assert '<th scope="col">Verdict</th>' in page
    row = re.search(r"<tr>\s*<td><a [^>]*>run-mismatch</a>.*?</tr>", page, re.S)
    assert row, page
    assert "<td>mismatch</td>" in row.group(0)
    row = re.search(r"<tr>\s*<td><a [^>]*>run-fan-in</a>.*?</tr>", page, re.S)
    assert row, page
    assert "<td>missing_signal</td>" in row.group(0) or "<td>waiting</td>" in row.group(0)


def test_signed_out_pages_show_no_navigation(console: Console) -> None:
    with httpx.Client(base_url=console.url, timeout=30) as http:
        page = http.get("/console/sign-in").text
        assert "<nav" not in page
        assert 'href="/console/runs"' not in page
        assert '<link rel="icon"' in page


def test_the_favicon_is_served(console: Console) -> None:
    with httpx.Client(base_url=console.url, timeout=30) as http:
        for path in ("/favicon.ico", "/console/static/favicon.svg"):
            answer = http.get(path)
            assert answer.status_code == 200, path
            assert answer.headers["content-type"].startswith("image/svg+xml"), path
            assert answer.content.lstrip().startswith(b"<svg"), path
            assert len(answer.content) < 1024, path


def test_quarantine_filters_by_correlation_id(signed_in: httpx.Client) -> None:
    page = signed_in.get("/console/quarantine", params={"correlation_id": "no-such-key"})
    assert page.status_code == 200
    assert 'name="correlation_id" value="no-such-key"' in page.text
    assert "No quarantined records." in page.text
    assert 'name="ids"' not in page.text

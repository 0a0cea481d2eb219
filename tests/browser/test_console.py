"""The operator console in a real browser: Playwright driving Debian's Chromium against the
real daemon, with real data in Postgres and Kafka.

Chromium comes from scripts/install-chromium (Debian's package; installed when we may,
else the tests fail with one line saying how). ``MATCHER_TEST_SCREENSHOTS_DIR`` makes the
tests save the docs' screenshots there (``make screenshots``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import threading
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from axe_playwright_python.sync_playwright import Axe
from matcher_producer.event import CompletionEvent as ProducerEvent
from matcher_producer.event import encode
from matcher_producer.signing import SigningKey, sign_record
from playwright.sync_api import Browser, Dialog, Page, sync_playwright

from matcher.config import Settings
from matcher.domain.waits import WaitSpec
from matcher.sdk import register_wait
from tests.support.db import scalar
from tests.support.kafka import started
from tests.support.processes import DaemonProcess, installed_tool, process_env
from tests.support.services import Services, own_database, own_settings

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).parents[2]
T = TypeVar("T")
TOKEN = "console-token-for-tests-0123456789abcdef"
K1 = "whsec_" + base64.b64encode(b"console-key-one-0123456789abcdef").decode()
K2 = "whsec_" + base64.b64encode(b"console-key-two-0123456789abcdef").decode()
XSS_SCRIPT = "<script>alert(1)</script>"
XSS_IMG = '"><img src=x onerror=alert(2)>'
REFUSAL = (
    '[{"via": "webhook", "producer": "billing-svc", "reason": "bad_signature", '
    '"detail": "no signature matches an active key of the producer", "http_status": 401, '
    '"event_id": "evt-9", "type": "job.completed", "tenant": "acme", '
    '"correlation_id": "c-refused"}]'
)
# GitHub-sized bodies: 50 events of about 15 KB of JSON each, on one correlation id.
BIG_EVENTS = 50
BIG_DATA = {
    "repository": {"full_name": "acme/widgets", "description": "x" * 200},
    "commits": [{"id": f"{i:040x}", "message": "fix the build " * 20} for i in range(50)],
}


def _producers(keys: dict[str, str]) -> str:
    entries = "".join(
        f'[[producers."billing-svc".keys]]\nid = "{k}"\nhmac_secret = "{v}"\n'
        for k, v in keys.items()
    )
    return (
        '[producers."billing-svc"]\ntenants = ["acme", "globex"]\n'
        'types = ["job.completed", "job.progress"]\n' + entries
    )


@dataclass
class Console:
    url: str
    settings: Settings
    producers: Path
    held: AIOKafkaProducer | None = None  # the open transaction behind the backlog
    daemon: DaemonProcess | None = None


@pytest.fixture(scope="module")
def chromium() -> str:
    return installed_tool("install-chromium")


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        # As root Chromium needs --no-sandbox; the pages it loads are ours.
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        launched = playwright.chromium.launch(executable_path=chromium, args=args)
        try:
            yield launched
        finally:
            launched.close()


def _signed(key: str, *, headers: list[tuple[str, bytes]] | None = None, **fields: Any) -> Any:
    e = ProducerEvent(source="billing-svc", **fields)
    record = sign_record(encode(e), e.id, [SigningKey.parse("k", key)])
    return record.key, record.headers + (headers or []), record.value


def _register(settings: Settings, run_id: str, correlation: str) -> None:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        register_wait(
            conn,
            WaitSpec(tenant="acme", run_id=run_id, position=0, event_types=["job.completed"],
                     correlation_id=correlation),
        )  # fmt: skip


async def _send(settings: Settings, records: list[Any]) -> None:
    producer = AIOKafkaProducer(**settings.kafka_client_options(), acks="all")
    async with started(producer):
        for key, headers, value in records:
            await producer.send_and_wait(settings.events_topic, value, key=key, headers=headers)


async def _hold_open(settings: Settings, record: Any) -> AIOKafkaProducer:
    """An event in a transaction left open: the daemon (read_committed) cannot read past
    it, while the log's end includes it: consumer lag on that partition, a backlog."""
    producer = AIOKafkaProducer(
        **settings.kafka_client_options(), transactional_id=f"held-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()
    await producer.begin_transaction()
    key, headers, value = record
    await producer.send_and_wait(settings.events_topic, value, key=key, headers=headers)
    return producer


def _scenario(settings: Settings) -> None:
    for run_id, correlation in [("r-mismatch", "c-mismatch"), ("r-backlog", "c-backlog"),
                                ("r-xss", "c-xss"), ("r-replay", "c-replay"),
                                ("r-quarantined", "c-quarantined"),
                                ("r-refused", "c-refused")]:  # fmt: skip
        _register(settings, run_id, correlation)
    # A delivery the ingress refused, as it records one (tests/integration/test_refusals.py
    # drives the ingress itself): the run's only trace.
    scalar(settings, "SELECT matcher.record_refusals_v1(%s::jsonb)", (REFUSAL,))
    _Loop.shared.run(
        _send(
            settings,
            [
                _signed(K1, type="job.completed", tenant="globex", correlation_id="c-mismatch"),
                _signed(K1, type="job.progress", tenant="acme", correlation_id="c-xss",
                        data={"note": XSS_SCRIPT, "other": XSS_IMG}),
                _signed(K2, type="job.completed", tenant="acme", correlation_id="c-replay",
                        headers=[("x-note", XSS_IMG.encode())]),
                # Never replayed: the run page links to its record.
                _signed(K2, type="job.completed", tenant="acme", correlation_id="c-quarantined"),
                *(_signed(K1, type="job.progress", tenant="acme", correlation_id="c-big",
                          data=BIG_DATA) for _ in range(BIG_EVENTS)),
            ],
        )
    )  # fmt: skip


@pytest.fixture(scope="module")
def console(
    services: Services, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    producers = tmp_path_factory.mktemp("console") / "producers.toml"
    producers.write_text(_producers({"k1": K1}))
    with (
        own_database(services, template_db) as url,
        own_settings(
            services, url, producers_file=producers, allow_unsigned=False, admin_token=TOKEN,
            producers_reload_interval_s=0.2,
        ) as settings,
    ):  # fmt: skip
        yield from _console(settings, producers)


def _console(settings: Settings, producers: Path) -> Iterator[Console]:
    """The daemon, with the scenario's runs and a transaction held open for the backlog."""
    loop = _Loop.shared = _Loop()
    env = process_env(
        settings, MATCHER_ADMIN_TOKEN=TOKEN, MATCHER_PRODUCERS_FILE=str(producers),
        MATCHER_PRODUCERS_RELOAD_INTERVAL_S="0.2",
    )  # fmt: skip
    daemon = DaemonProcess(env)
    daemon.wait_ready()
    found = Console(daemon.admin_url(), settings, producers, daemon=daemon)
    try:
        _scenario(settings)
        _until(lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 2 + BIG_EVENTS
               and scalar(settings, "SELECT count(*) FROM matcher.quarantine") == 2)  # fmt: skip
        found.held = loop.run(
            _hold_open(settings, _signed(K1, type="job.completed", tenant="acme",
                                         correlation_id="c-backlog"))
        )  # fmt: skip
        yield found
    finally:
        if found.held is not None:
            with contextlib.suppress(Exception):
                loop.run(found.held.abort_transaction())
                loop.run(found.held.stop())
        loop.close()
        assert daemon.terminate() == 0, daemon.output[-3000:]


class _Loop:
    """An event loop of its own thread: Playwright's sync API runs one in the test's."""

    shared: ClassVar[_Loop]

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _until(check: Any, timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    dialogs: list[str] = []

    def refuse(dialog: Dialog) -> None:  # alert() would mean a script ran
        dialogs.append(dialog.message)
        dialog.dismiss()

    opened.on("dialog", refuse)
    try:
        yield opened
    finally:
        context.close()
    assert dialogs == [], f"a script ran: {dialogs}"


def _sign_in(page: Page, console: Console, token: str = TOKEN) -> None:
    page.goto(f"{console.url}/console/sign-in")
    page.get_by_label("Admin token").fill(token)
    page.get_by_role("button", name="Sign in").click()


def _screenshot(page: Page, name: str) -> None:
    target = os.environ.get("MATCHER_TEST_SCREENSHOTS_DIR")
    if target:  # the whole page, unless long (the images stay small)
        tall = page.evaluate("document.documentElement.scrollHeight") > 2000
        page.screenshot(path=str(Path(target) / name), full_page=not tall)


def test_signed_out_is_sent_to_sign_in_and_a_wrong_token_is_refused(
    page: Page, console: Console
) -> None:
    page.goto(f"{console.url}/console/runs")
    assert "/console/sign-in" in page.url
    _sign_in(page, console, token="wrong")
    assert page.get_by_text("That token is not valid.").is_visible()
    _sign_in(page, console)
    assert page.url.rstrip("/").endswith("/console")
    assert int(page.locator("#verdict-mismatch").inner_text().split()[0]) >= 1
    page.get_by_role("button", name="Sign out").click()
    page.goto(f"{console.url}/console")
    assert "/console/sign-in" in page.url


def test_a_run_whose_event_came_with_the_wrong_tenant_is_a_mismatch(
    page: Page, console: Console
) -> None:
    _sign_in(page, console)
    page.goto(f"{console.url}/console/runs?verdict=mismatch")
    page.get_by_role("link", name="r-mismatch").click()
    verdict = page.locator("#verdict")
    assert "mismatch" in verdict.inner_text()
    assert "tenant" in verdict.inner_text()


def test_a_run_whose_event_sits_behind_lag_is_backlog(page: Page, console: Console) -> None:
    _sign_in(page, console)
    page.goto(f"{console.url}/console/runs/r-backlog")
    assert "backlog" in page.locator("#verdict").inner_text()


def test_hostile_data_and_headers_are_shown_as_text(page: Page, console: Console) -> None:
    _sign_in(page, console)
    for path in (
        "/console/runs/r-xss",
        "/console/quarantine",
        "/console/events?correlation_id=c-xss",
    ):
        page.goto(console.url + path)
        assert page.locator("img[onerror]").count() == 0
        assert page.locator("script").count() == 0
    page.goto(f"{console.url}/console/quarantine")
    assert XSS_IMG in page.locator("main").inner_text()  # the header, as text
    page.goto(f"{console.url}/console/events?correlation_id=c-xss")
    shown = page.locator("main").inner_text()  # the data, as text
    assert XSS_SCRIPT in shown
    assert XSS_IMG.replace('"', '\\"') in shown  # inside a JSON string


def test_a_quarantined_record_replayed_after_its_key_is_added_resolves_the_run(
    page: Page, console: Console
) -> None:
    console.producers.write_text(_producers({"k1": K1, "k2": K2}))  # the key fix
    _sign_in(page, console)
    page.goto(f"{console.url}/console/quarantine?reason=bad_signature")
    page.locator("tr", has_text="c-replay").get_by_role("checkbox").check()
    page.get_by_role("button", name="Replay selected").click()
    assert "Replay 1 record" in page.locator("main").inner_text()
    page.get_by_role("button", name="Replay", exact=True).click()  # the confirmation
    assert "accepted" in page.locator("main").inner_text()
    _until(
        lambda: (
            scalar(console.settings, "SELECT state FROM matcher.waits WHERE run_id = 'r-replay'")
            == "matched"
        )
    )
    page.goto(f"{console.url}/console/runs/r-replay")
    assert "resolved_by_event" in page.locator("#verdict").inner_text()


def test_keyboard_and_labels(page: Page, console: Console) -> None:
    page.goto(f"{console.url}/console/sign-in")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent").strip() == "Skip to content"
    _sign_in(page, console)
    page.goto(f"{console.url}/console/runs")
    unlabelled = page.evaluate(
        "[...document.querySelectorAll('input:not([type=hidden]), select')]"
        ".filter(e => e.labels.length === 0 && !e.getAttribute('aria-label')).length"
    )
    assert unlabelled == 0
    for _ in range(12):  # the navigation is reachable by keyboard
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent").strip() == "Quarantine":
            break
    else:
        raise AssertionError("no Quarantine link reached with Tab")
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/quarantine**")


@pytest.mark.parametrize("width", [1280, 390])
def test_readable_at_desktop_and_phone_widths(
    browser: Browser, console: Console, width: int
) -> None:
    context = browser.new_context(viewport={"width": width, "height": 800})
    page = context.new_page()
    try:
        _sign_in(page, console)
        for path in (
            "/console",
            "/console/runs",
            "/console/runs/r-mismatch",
            "/console/quarantine",
        ):
            page.goto(console.url + path)
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 1, f"{path} is {overflow}px wider than {width}px"
    finally:
        context.close()


@contextlib.contextmanager
def _at_width(browser: Browser, width: int, height: int = 800) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": width, "height": height})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    try:
        yield opened
    finally:
        context.close()


def test_a_run_links_to_the_record_its_event_was_quarantined_as(
    page: Page, console: Console
) -> None:
    _sign_in(page, console)
    page.goto(f"{console.url}/console/runs/r-quarantined")
    assert "bad_signature" in page.locator("#verdict").inner_text()
    link = page.locator("#related a", has_text="bad_signature")
    assert link.count() == 1
    link.click()
    page.wait_for_url("**/console/quarantine?correlation_id=c-quarantined*")
    assert page.get_by_label("Correlation id").input_value() == "c-quarantined"
    rows = page.locator("main table tbody tr")
    assert rows.count() == 1
    assert "c-quarantined" in rows.first.inner_text()
    assert page.locator("tr:target").count() == 1  # the record linked to, highlighted


def test_big_payloads_are_collapsed_to_one_line(page: Page, console: Console) -> None:
    _sign_in(page, console)
    page.goto(f"{console.url}/console/events?correlation_id=c-big")
    assert page.locator("main table tbody tr").count() == BIG_EVENTS
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 6000, f"50 events make the page {height}px tall"
    data = page.locator("main table tbody tr").first.locator("details")
    assert not data.locator("pre").is_visible()
    data.locator("summary").click()
    assert "fix the build" in data.locator("pre").inner_text()


# Cells whose text is one word (no space) laid out on more than one line.
BROKEN_WORDS = """() => {
  const broken = [];
  for (const cell of document.querySelectorAll('main td, main th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const word = node.textContent.trim();
      if (!word || /\\s/.test(word) || word.length > 40) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      if (lines.size > 1) broken.push(word);
    }
  }
  return broken;
}"""


@pytest.mark.parametrize("width", [1280, 390])
def test_words_do_not_break_inside_table_cells(
    browser: Browser, console: Console, width: int
) -> None:
    with _at_width(browser, width) as page:
        _sign_in(page, console)
        for path in (
            "/console/runs",
            "/console/runs/r-mismatch",
            "/console/events",
            "/console/quarantine",
        ):
            page.goto(console.url + path)
            assert page.evaluate(BROKEN_WORDS) == [], f"{path} at {width}px"


def test_ids_are_truncated_and_results_come_first_on_a_phone(
    browser: Browser, console: Console
) -> None:
    with _at_width(browser, 390) as page:
        _sign_in(page, console)
        for path in ("/console/runs", "/console/events", "/console/quarantine"):
            page.goto(console.url + path)
            top = page.locator("main table tbody tr").first.bounding_box()
            assert top is not None
            assert top["y"] < 800, f"{path}: the first result is {top['y']}px down"
        page.goto(f"{console.url}/console/runs")
        assert not page.get_by_label("Tenant").is_visible()  # the filters, folded
        page.locator("details.filters > summary").click()
        assert page.get_by_label("Tenant").is_visible()
        page.goto(f"{console.url}/console/runs/r-mismatch")
        wait_id = scalar(
            console.settings, "SELECT id FROM matcher.waits WHERE run_id = 'r-mismatch'"
        )
        shown = page.locator(f'input.id[value="{wait_id}"]')
        assert shown.get_attribute("title") == str(wait_id)
        assert shown.get_attribute("readonly") is not None  # selectable, copyable, in Tab order
        box = shown.bounding_box()
        assert box is not None
        assert box["width"] < 150, box
        assert box["height"] < 40, box


def test_the_runs_list_shows_every_verdict(page: Page, console: Console) -> None:
    _sign_in(page, console)
    page.goto(f"{console.url}/console/runs")
    assert page.get_by_label("Tenant").is_visible()  # the filters, open on a wide screen
    headers = page.locator("main table thead th").all_inner_texts()
    assert "Verdict" in headers
    column = headers.index("Verdict")
    row = page.locator("main table tbody tr", has_text="r-mismatch")
    assert row.locator("td").nth(column).inner_text().strip() == "mismatch"
    row = page.locator("main table tbody tr", has_text="r-backlog")
    assert row.locator("td").nth(column).inner_text().strip() == "backlog"


def test_signed_out_pages_have_no_navigation_and_there_is_a_favicon(
    page: Page, console: Console
) -> None:
    page.goto(f"{console.url}/console/sign-in")
    assert page.locator('nav[aria-label="Console"]').count() == 0
    icon = page.locator('link[rel="icon"]').get_attribute("href")
    assert icon is not None
    answer = page.request.get(console.url + icon)
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("image/svg+xml")
    assert page.request.get(f"{console.url}/favicon.ico").status == 200


def test_a_run_links_to_the_delivery_the_ingress_refused(page: Page, console: Console) -> None:
    _sign_in(page, console)
    page.goto(f"{console.url}/console/runs/r-refused")
    assert "refused by the ingress" in page.locator("#verdict").inner_text()
    link = page.locator("#related a", has_text="bad_signature")
    assert link.count() == 1
    link.click()
    page.wait_for_url("**/console/refusals?correlation_id=c-refused*")
    rows = page.locator("main table tbody tr")
    assert rows.count() == 1
    assert "whsec wrong secret" not in rows.first.inner_text()
    assert "correlation id: c-refused" in rows.first.inner_text()
    assert page.locator("tr:target").count() == 1


# The console's pages, by the name of their screenshot.
PAGES = {
    "overview": "/console",
    "runs": "/console/runs",
    "run": "/console/runs/r-mismatch",
    "run-quarantined": "/console/runs/r-quarantined",
    "events": "/console/events",
    "quarantine": "/console/quarantine",
    "run-refused": "/console/runs/r-refused",
    "refusals": "/console/refusals",
}
SERIOUS = ("serious", "critical")


def _violations(page: Page) -> list[str]:
    found = Axe().run(page).response["violations"]
    return [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:5]}"
        for v in found
        if v["impact"] in SERIOUS
    ]


@pytest.mark.parametrize("width", [1280, 390])
def test_no_serious_accessibility_violations(
    browser: Browser, console: Console, width: int
) -> None:
    """axe-core over every page, signed out and in; the docs' screenshots are taken here."""
    with _at_width(browser, width) as page:
        page.goto(f"{console.url}/console/sign-in")
        problems = {"sign-in": _violations(page)}
        _screenshot(page, f"sign-in-{width}.png")
        _sign_in(page, console)
        for name, path in PAGES.items():
            page.goto(console.url + path)
            problems[name] = _violations(page)
            _screenshot(page, f"{name}-{width}.png")
        assert {k: v for k, v in problems.items() if v} == {}

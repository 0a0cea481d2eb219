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
                                ("r-xss", "c-xss"), ("r-replay", "c-replay")]:  # fmt: skip
        _register(settings, run_id, correlation)
    _Loop.shared.run(
        _send(
            settings,
            [
                _signed(K1, type="job.completed", tenant="globex", correlation_id="c-mismatch"),
                _signed(K1, type="job.progress", tenant="acme", correlation_id="c-xss",
                        data={"note": XSS_SCRIPT, "other": XSS_IMG}),
                _signed(K2, type="job.completed", tenant="acme", correlation_id="c-replay",
                        headers=[("x-note", XSS_IMG.encode())]),
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
        _until(lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 2
               and scalar(settings, "SELECT count(*) FROM matcher.quarantine") == 1)  # fmt: skip
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
    if target:
        page.screenshot(path=str(Path(target) / name), full_page=True)


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
    _screenshot(page, "console-overview.png")
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
    _screenshot(page, "console-run.png")


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

"""The producers file as read from disk: whatever makes it unusable is a RegistryError
naming the file, at start and on reload, and a reload keeps the last good registry.

A Latin-1 byte in a comment once escaped as a UnicodeDecodeError: a traceback at start,
and on reload the end of the watch loop (the daemon stopped; the ingress stopped
reloading and died at the next SIGHUP).
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from matcher.auth.registry import RegistryError, load_registry
from matcher.auth.registry_watch import RegistryHolder
from matcher.config import KafkaSettings
from tests.support.assertions import eventually

pytestmark = pytest.mark.timeout(30)

KEY = "whsec_" + base64.b64encode(b"k1-secret-of-the-billing-service").decode()
GOOD = f"""
[producers."billing-svc"]
tenants = ["acme"]
types = ["job.completed"]
[[producers."billing-svc".keys]]
id = "k1"
hmac_secret = "{KEY}"
"""
# "# café" in Latin-1: 0xe9 is not UTF-8 (a lead byte without its continuation).
LATIN1 = b"# caf\xe9\n" + GOOD.replace("billing-svc", "other-svc").encode()
LATIN1_OFFSET = 5


def _write(path: Path, content: str | bytes) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(content.encode() if isinstance(content, str) else content)
    tmp.replace(path)  # atomic, as config management tools do it
    return path


def _holder(path: Path) -> tuple[RegistryHolder, Counter, Gauge]:
    metrics = CollectorRegistry()
    reloads = Counter("reloads", "", ["result"], registry=metrics)
    failing = Gauge("failing", "", registry=metrics)
    settings = KafkaSettings(
        kafka_bootstrap_servers="k:9092", producers_file=path, producers_reload_interval_s=0.05
    )
    return (
        RegistryHolder(
            settings.producers_file, settings.producers_reload_interval_s, reloads, failing
        ),
        reloads,
        failing,
    )


def test_a_file_that_is_not_utf8_is_a_registry_error_naming_file_and_offset(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "producers.toml", LATIN1)
    with pytest.raises(RegistryError) as raised:
        load_registry(path)
    message = str(raised.value)
    assert message == (
        f"producers file {path}: not valid UTF-8: byte 0xe9 at offset {LATIN1_OFFSET}"
        " (invalid continuation byte)"
    )


def test_a_schema_that_is_unreadable_or_not_utf8_is_a_registry_error(tmp_path: Path) -> None:
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    path = _write(tmp_path / "producers.toml", 'schema_dir = "schemas"\n' + GOOD)
    _write(schemas / "job.completed.json", b'{"description": "caf\xe9"}')
    with pytest.raises(RegistryError, match=r"^schema .*job\.completed\.json: not valid UTF-8"):
        load_registry(path)
    named = _write(tmp_path / "named.toml", '[schemas]\n"job.completed" = "missing.json"\n' + GOOD)
    with pytest.raises(RegistryError, match=r"^cannot read schema .*missing\.json: No such file"):
        load_registry(named)


def test_a_file_that_is_not_utf8_stops_the_start_with_a_registry_error(tmp_path: Path) -> None:
    holder, _, _ = _holder(_write(tmp_path / "producers.toml", LATIN1))
    with pytest.raises(RegistryError, match="not valid UTF-8"):
        holder.load_initial()


def test_a_reload_of_a_file_that_is_not_utf8_keeps_the_last_good_registry(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "producers.toml", GOOD)
    holder, reloads, failing = _holder(path)
    holder.load_initial()
    good = holder.current
    _write(path, LATIN1)
    assert holder.reload("SIGHUP") is False
    assert holder.current is good
    assert reloads.labels("failed")._value.get() == 1
    assert failing._value.get() == 1


async def test_the_watch_outlives_a_file_that_is_not_utf8_and_takes_the_next_good_one(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "producers.toml", GOOD)
    holder, reloads, failing = _holder(path)
    holder.load_initial()
    stop = asyncio.Event()
    watch = asyncio.create_task(holder.watch(stop))
    try:
        _write(path, LATIN1)
        await eventually(lambda: reloads.labels("failed")._value.get() >= 1, timeout=10)
        assert not watch.done()
        assert set(holder.current.producers) == {"billing-svc"}
        # Another size, so the change shows even where mtimes are coarse.
        _write(path, GOOD.replace("billing-svc", "payroll-svc") + "\n# fixed\n")
        await eventually(lambda: set(holder.current.producers) == {"payroll-svc"}, timeout=10)
        assert failing._value.get() == 0
    finally:
        stop.set()
        await asyncio.wait_for(watch, 5)


def test_the_reason_is_one_line_for_a_json_schema_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text(json.dumps({"type": "object"})[:-1])
    path = _write(tmp_path / "producers.toml", '[schemas]\n"job.completed" = "bad.json"\n' + GOOD)
    with pytest.raises(RegistryError) as raised:
        load_registry(path)
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith(f"schema {tmp_path / 'bad.json'}: ")


async def test_the_watch_outlives_an_unforeseen_failure_of_a_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a reload raises is logged and counted; the watch, and SIGHUP, go on."""
    path = _write(tmp_path / "producers.toml", GOOD)
    holder, reloads, failing = _holder(path)
    holder.load_initial()
    good = holder.current

    def broken(_: Path) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("matcher.auth.registry_watch.load_registry", broken)
    stop = asyncio.Event()
    watch = asyncio.create_task(holder.watch(stop))
    try:
        _write(path, GOOD + "\n# changed\n")
        await eventually(lambda: reloads.labels("failed")._value.get() >= 1, timeout=10)
        assert not watch.done()
        assert holder.current is good
        assert failing._value.get() == 1
    finally:
        stop.set()
        await asyncio.wait_for(watch, 5)


def test_the_callback_producer_name_is_reserved(tmp_path: Path) -> None:
    """Callback events are stored as producer "callback" with the wait's id as event id: a
    registered producer of that name could take a wait's callback before it is used."""
    path = tmp_path / "producers.toml"
    path.write_text('[producers."callback"]\ntenants = ["acme"]\ntypes = ["job.completed"]\n')
    with pytest.raises(RegistryError, match="'callback' is reserved for callback URLs"):
        load_registry(path)

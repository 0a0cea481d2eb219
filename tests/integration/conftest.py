"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from matcher.config import Settings
from tests.support import ingress as webhook_ingress
from tests.support.processes import IngressProcess
from tests.support.producers import K1, producers_file


@pytest.fixture
def secure(settings: Settings, tmp_path: Path) -> Settings:
    return settings.model_copy(
        update={
            "allow_unsigned": False,
            "producers_file": producers_file(tmp_path, {"k1": K1}),
            "max_event_bytes": 8192,
            "producers_reload_interval_s": 0.2,
        }
    )


@pytest.fixture
def webhooks_secure(settings: Settings, tmp_path: Path) -> Settings:
    """Settings with the webhook senders' producers (tests/support/webhooks.py), signatures
    required."""
    return settings.model_copy(
        update={
            "producers_file": webhook_ingress.producers_file(tmp_path),
            "allow_unsigned": False,
        }
    )


@pytest.fixture
def ingress(webhooks_secure: Settings) -> Iterator[IngressProcess]:
    """The ingress for those producers, with a 2 s read timeout."""
    with webhook_ingress.running_ingress(
        webhooks_secure, MATCHER_INGRESS_READ_TIMEOUT_S="2"
    ) as process:
        yield process

"""A signed producer for tests ("billing-svc" with HMAC keys and a payload schema): its
producers file, its signed records, and waits for them."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import psycopg
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import KafkaRecord, SigningKey, encode, sign_record

from matcher.config import Settings
from matcher.domain.waits import WaitSpec
from matcher.sdk import register_wait

K1 = "whsec_" + base64.b64encode(b"k1-secret-of-the-billing-service").decode()
K2 = "whsec_" + base64.b64encode(b"k2-secret-of-the-billing-service").decode()
STRANGER = "whsec_" + base64.b64encode(b"a-key-nobody-has-registered-here").decode()

SCHEMA = {
    "type": "object",
    "required": ["rows"],
    "properties": {"rows": {"type": "integer", "minimum": 0}},
}


def producers_file(
    directory: Path, keys: dict[str, str], *, broken: bool = False, latin1: bool = False
) -> Path:
    path = directory / "producers.toml"
    (directory / "schemas").mkdir(exist_ok=True)
    (directory / "schemas" / "job.completed.json").write_text(json.dumps(SCHEMA))
    key_lines = "\n".join(
        f'[[producers."billing-svc".keys]]\nid = "{k}"\nhmac_secret = "{v}"'
        for k, v in keys.items()
    )
    text = f"""
schema_dir = "schemas"

[producers."billing-svc"]
tenants = ["acme"]
types = ["job.completed", "job.failed"]
{key_lines}
"""
    if broken:
        text += "\n[producers.oops\n"
    tmp = path.with_suffix(".tmp")
    # latin1: valid TOML but for one byte that is not UTF-8 (a comment written in Latin-1).
    tmp.write_bytes(text.encode() + (b"# caf\xe9\n" if latin1 else b""))
    tmp.replace(path)  # atomic, as config management tools do it
    return path


def signed(
    key: str | None = K1,
    *,
    structured: bool = False,
    timestamp: int | None = None,
    **fields: object,
) -> tuple[ProducerEvent, KafkaRecord]:
    values: dict[str, object] = {
        "source": "billing-svc",
        "type": "job.completed",
        "tenant": "acme",
        "correlation_id": f"c-{uuid.uuid4().hex[:8]}",
        "data": {"rows": 7},
    }
    values.update(fields)
    event = ProducerEvent(**values)  # type: ignore[arg-type]
    record = encode(event, structured=structured)
    if key is not None:
        record = sign_record(record, event.id, [SigningKey.parse("k", key)], timestamp)
    return event, record


def wait_for(settings: Settings, event: ProducerEvent, tenant: str | None = None) -> None:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        register_wait(
            conn,
            WaitSpec(
                tenant=tenant or event.tenant,
                run_id=f"run-{event.correlation_id}",
                position=0,
                event_types=["job.completed", "job.failed", "job.progress"],
                correlation_id=event.correlation_id,
            ),
        )

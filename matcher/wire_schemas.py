"""The files of ``schemas/``: JSON Schemas generated from the pydantic models, and the
signature test vectors. ``make schemas`` writes them; a test fails when they drift.

    python -m matcher.wire_schemas schemas/
"""

from __future__ import annotations

import base64
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import SigningKey, binary_content, encode, sign_record
from pydantic import BaseModel

from matcher.auth.registry import ProducersFile
from matcher.domain.events import REASONS, CompletionEvent
from matcher.domain.launches import Launch
from matcher.domain.resume import ResumeCloudEvent
from matcher.domain.waits import Wait, WaitSpec

_MODELS: dict[str, tuple[type[BaseModel], str]] = {
    "completion-event.schema.json": (
        CompletionEvent,
        "A completion event: CloudEvents 1.0 (structured mode shown; in binary mode the "
        "attributes travel as ce_* Kafka headers and data is the value).",
    ),
    "resume.schema.json": (ResumeCloudEvent, "A message of the resume topic."),
    "wait-spec.schema.json": (WaitSpec, "What a run waits for (matcher.sdk.register_wait)."),
    "wait.schema.json": (
        Wait,
        "A wait as stored: what register_wait_v1 and get_wait_v1 answer (docs: the worker API).",
    ),
    "launch.schema.json": (
        Launch,
        "A launch intent as stored: what record_launch_v1 and get_launch_v1 answer.",
    ),
    "producers-file.schema.json": (ProducersFile, "The producers file (TOML), as JSON Schema."),
}

# Fixed inputs, so the vectors never change unless the definition does.
_HMAC_KEY = "whsec_" + base64.b64encode(bytes(range(32))).decode()
_ED25519_SEED = bytes(range(100, 132))
_TIMESTAMP = 1767225600  # 2026-01-01T00:00:00Z


def _schema(model: type[BaseModel], description: str) -> str:
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **model.model_json_schema(mode="validation"),
    }
    schema["description"] = description
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def _vectors() -> str:
    ed_secret = "whsk_" + base64.b64encode(_ED25519_SEED).decode()
    ed_public = (
        Ed25519PrivateKey.from_private_bytes(_ED25519_SEED)
        .public_key()
        .public_bytes(Encoding.Raw, PublicFormat.Raw)
    )
    event = ProducerEvent(
        source="billing-svc",
        type="job.completed",
        tenant="acme",
        correlation_id="corr-42",
        job_id="job-7",
        data={"rows": 1200, "status": "ok"},
        id="evt-0001",
        time=datetime(2025, 12, 31, 23, 59, 30, tzinfo=UTC),
    )
    cases = []
    for mode in ("binary", "structured"):
        for scheme, key_text in (("hmac-sha256", _HMAC_KEY), ("ed25519", ed_secret)):
            record = encode(event, structured=mode == "structured")
            signed = sign_record(record, event.id, [SigningKey.parse("k1", key_text)], _TIMESTAMP)
            headers = dict(signed.headers)
            cases.append(
                {
                    "name": f"{mode}-{scheme}",
                    "mode": mode,
                    "scheme": scheme,
                    "signing_key": key_text,
                    "verifying_key": key_text
                    if scheme == "hmac-sha256"
                    else "whpk_" + base64.b64encode(ed_public).decode(),
                    "kafka_key_utf8": signed.key.decode(),
                    "headers": [[k, v.decode()] for k, v in record.headers],
                    "value_utf8": signed.value.decode(),
                    "webhook_id": headers["webhook-id"].decode(),
                    "webhook_timestamp": headers["webhook-timestamp"].decode(),
                    "signed_bytes_base64": base64.b64encode(
                        event.id.encode()
                        + b"."
                        + str(_TIMESTAMP).encode()
                        + b"."
                        + (
                            signed.value
                            if mode == "structured"
                            else binary_content(record.headers, record.value)
                        )
                    ).decode(),
                    "webhook_signature": headers["webhook-signature"].decode(),
                }
            )
    vectors = {
        "definition": "schemas/signatures.md",
        "note": "verify each case with the clock set to its webhook_timestamp",
        "cases": cases,
    }
    return json.dumps(vectors, indent=2) + "\n"


def _openapi() -> str:
    from matcher.admin.http import create_app
    from matcher.admin.state import AdminState
    from matcher.config import Settings

    async def unused() -> bool:
        return False

    settings = Settings(
        kafka_bootstrap_servers="localhost:9092", database_url="postgresql://localhost/matcher"
    )
    app = create_app(AdminState(settings, None, lambda: None, unused))  # type: ignore[arg-type]
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


def _reasons() -> str:
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": "The reason codes of matcher.quarantine (and of the dead-letter "
        "topic's matcher-reason header), each with what it means.",
        "type": "string",
        "enum": sorted(REASONS),
        "x-meanings": dict(sorted(REASONS.items())),
    }
    return json.dumps(document, indent=2) + "\n"


def generate() -> dict[str, str]:
    files = {name: _schema(model, text) for name, (model, text) in _MODELS.items()}
    files["quarantine-reasons.json"] = _reasons()
    files["openapi.json"] = _openapi()
    files["signature-vectors.json"] = _vectors()
    return files


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")
    target.mkdir(parents=True, exist_ok=True)
    for name, text in generate().items():
        (target / name).write_text(text)
        print(f"wrote {target / name}")


if __name__ == "__main__":
    main()

"""The producer SDK on its own (no matcher import): the shared vectors, keys, encoding."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from matcher_producer import CompletionEvent, SigningKey, binary_content, encode, sign_record
from matcher_producer.cli import load_key

VECTORS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[3] / "schemas" / "signature-vectors.json").read_text()
)["cases"]


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_sdk_reproduces_each_vector(case: dict[str, Any]) -> None:
    headers = [(k, v.encode()) for k, v in case["headers"]]
    value = case["value_utf8"].encode()
    content = value if case["mode"] == "structured" else binary_content(headers, value)
    message = f"{case['webhook_id']}.{case['webhook_timestamp']}.".encode() + content
    assert base64.b64encode(message).decode() == case["signed_bytes_base64"]
    key = SigningKey.parse("k1", case["signing_key"])
    assert key.sign(message) == case["webhook_signature"]


def test_signing_adds_the_three_headers_and_one_signature_per_key() -> None:
    event = CompletionEvent(source="s", type="t", tenant="a", correlation_id="c", data={"x": 1})
    keys = [
        SigningKey.parse("old", "whsec_" + base64.b64encode(b"o" * 32).decode()),
        SigningKey.parse("new", "whsk_" + base64.b64encode(b"s" * 32).decode()),
    ]
    signed = sign_record(encode(event), event.id, keys, timestamp=1_700_000_000)
    headers = dict(signed.headers)
    assert headers["webhook-id"] == event.id.encode()
    assert headers["webhook-timestamp"] == b"1700000000"
    versions = [s.split(",")[0] for s in headers["webhook-signature"].decode().split(" ")]
    assert versions == ["v1", "v1a"]
    assert signed.key == b"a\x1fc"


@pytest.mark.parametrize("structured", [False, True])
def test_encoding(structured: bool) -> None:
    event = CompletionEvent(
        source="s", type="t", tenant="a", correlation_id="c", job_id="j", data=[1, 2]
    )
    record = encode(event, structured=structured)
    headers = dict(record.headers)
    if structured:
        assert headers == {"content-type": b"application/cloudevents+json"}
        body = json.loads(record.value)
        assert (body["tenant"], body["correlationid"], body["jobid"]) == ("a", "c", "j")
        assert body["data"] == [1, 2]
    else:
        assert headers["ce_tenant"] == b"a"
        assert headers["ce_correlationid"] == b"c"
        assert json.loads(record.value) == [1, 2]


def test_bad_keys_are_refused() -> None:
    for text in ("plain", "whsec_", "whsec_%%%", "whsk_" + base64.b64encode(b"short").decode()):
        with pytest.raises(ValueError, match=r"key|secret|base64|bytes|Non-base64|Incorrect"):
            SigningKey.parse("k", text)


def test_key_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "whsec_" + base64.b64encode(b"z" * 32).decode()
    single = tmp_path / "billing.key"
    single.write_text(secret + "\n")
    assert load_key(None, str(single)).id == "billing"
    ring = tmp_path / "ring.toml"
    ring.write_text(f'[keys]\nk1 = "{secret}"\nk2 = "{secret}"\n')
    assert load_key("k2", str(ring)).id == "k2"
    with pytest.raises(ValueError, match="choose one with --key-id"):
        load_key(None, str(ring))
    with pytest.raises(ValueError, match="no key 'k3'"):
        load_key("k3", str(ring))
    monkeypatch.setenv("MATCHER_EMIT_KEY", secret)
    assert load_key(None, None).hmac_secret == b"z" * 32

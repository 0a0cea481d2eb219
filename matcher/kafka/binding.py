"""The CloudEvents Kafka protocol binding: Kafka records in, validated events out.

Binary mode (``ce_*`` headers, the data as the value) and structured mode
(``content-type: application/cloudevents+json``, the whole event as the value) are both
read by the CloudEvents SDK; the result is then validated as a ``CompletionEvent``.
Anything that fails becomes a ``Rejection`` with a reason code and a readable detail,
plus whatever identifying attributes could still be read, for operators and ``explain``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from pydantic import ValidationError

from matcher.auth.check import Policy, check_event, check_size, is_structured
from matcher.auth.registry import Registry
from matcher.domain.events import CompletionEvent, Rejection

_FORMAT = JSONFormat()
# What reading a bad message raises, in the SDK or in json. A NameError or the like is a
# bug of ours and must stop the daemon, not quarantine every message as "malformed".
_UNREADABLE = (
    BaseCloudEventException,
    ValueError,  # json, dates, UnicodeDecodeError
    TypeError,
    KeyError,
    AttributeError,
    IndexError,
)
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
Headers = Sequence[tuple[str, bytes | None]]


def _header_dict(headers: Headers) -> dict[str, bytes]:
    return {name: value or b"" for name, value in headers}


def _peek(headers: dict[str, bytes], value: bytes | None) -> dict[str, str]:
    """Best effort: the identifying attributes of a message that failed to parse."""
    names = {
        "source": "producer",
        "id": "event_id",
        "tenant": "tenant",
        "type": "type",
        "correlationid": "correlation_id",
    }
    found: dict[str, str] = {}
    for attr, column in names.items():
        raw = headers.get(f"ce_{attr}")
        if raw:
            found[column] = raw.decode("utf-8", "replace")[:512]
    if not found and value:
        try:
            envelope = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            return found
        if isinstance(envelope, dict):
            for attr, column in names.items():
                item = envelope.get(attr)
                if isinstance(item, str) and item:
                    found[column] = item[:512]
    return found


def _json_data(data: Any) -> Any:
    if isinstance(data, bytes | bytearray):
        if not data:
            return None
        return json.loads(data)  # ValueError (or UnicodeDecodeError) when it is not JSON
    return data


def _is_json_type(content_type: str | None) -> bool:
    if not content_type:
        return True  # JSON is what completion events carry; say so or not
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json") or media == "text/json"


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


_EXTENSION_NAME = re.compile(r"[a-z0-9]+")
_REQUIRED = ("specversion", "id", "source", "type")


def _fast_binary(header_map: dict[str, bytes], value: bytes | None) -> CompletionEvent | None:
    """The common case of binary mode, read without the SDK (a fifth of ingest's CPU).

    Only a well-formed event passes here; anything unusual returns None and goes through
    the SDK, so the accepted events and every rejection's wording stay the SDK's.
    """
    attributes: dict[str, Any] = {}
    try:
        for name, raw in header_map.items():
            lowered = name.lower()
            if lowered.startswith("ce_"):
                attr = lowered[3:]
                if not _EXTENSION_NAME.fullmatch(attr):
                    return None
                text = raw.decode("utf-8")
                if not text or attr in ("dataschema", "subject"):
                    return None  # rare; the SDK has rules for these
                # fromisoformat, not pydantic, reads the time: pydantic also takes a bare
                # number as epoch seconds, which the SDK (and RFC 3339) refuse.
                if attr == "time":
                    when = datetime.fromisoformat(text)
                    if when.tzinfo is None:
                        return None  # RFC 3339 times carry an offset
                    attributes[attr] = when
                else:
                    attributes[attr] = text
            elif lowered == "content-type":
                content_type = raw.decode("utf-8")
                if not content_type or not _is_json_type(content_type):
                    return None
                attributes["datacontenttype"] = content_type
        if attributes.get("specversion") != "1.0" or not all(
            attributes.get(name) for name in _REQUIRED
        ):
            return None
        attributes["data"] = _json_data(value or b"")
        return CompletionEvent.model_validate(attributes)
    except (ValueError, ValidationError):
        return None


def parse_record(
    headers: Headers, key: bytes | None, value: bytes | None
) -> CompletionEvent | Rejection:
    """Read one Kafka record as a completion event, or say why it is not one."""
    header_map = _header_dict(headers)
    if not is_structured(header_map):
        fast = _fast_binary(header_map, value)
        if fast is not None:
            return fast
    return parse_with_sdk(header_map, key, value)


def parse_with_sdk(
    header_map: dict[str, bytes], key: bytes | None, value: bytes | None
) -> CompletionEvent | Rejection:
    """Every mode and every failure, read by the CloudEvents SDK."""
    message = ce_kafka.KafkaMessage(headers=header_map, key=key, value=value or b"")
    content_type = header_map.get("content-type", b"").decode("utf-8", "replace")
    structured = is_structured(header_map)
    try:
        if structured:
            envelope = json.loads(value or b"")
            if not isinstance(envelope, dict):
                return Rejection("malformed", "a structured-mode event must be a JSON object")
        present = (
            set(envelope)
            if structured
            else {name.lower()[3:] for name in header_map if name.lower().startswith("ce_")}
        )
        # The SDK invents an id (and assumes a specversion) when there is none; an invented
        # id would make every redelivery of the event a new event.
        missing = [name for name in _REQUIRED if name not in present]
        if missing:
            return Rejection(
                "malformed",
                f"required attribute(s) missing: {', '.join(missing)}",
                _peek(header_map, value),
            )
        event = ce_kafka.from_kafka(message, _FORMAT)
        attributes = dict(event.get_attributes())
        attributes.pop("partitionkey", None)  # the SDK's name for the Kafka key
        if structured:
            if "time" not in present:
                attributes.pop("time", None)  # the SDK invents one; we record only facts
            attributes["data"] = _json_data(event.get_data())
        else:
            if "time" not in present:
                attributes.pop("time", None)
            if not _is_json_type(content_type):
                return Rejection(
                    "malformed",
                    f"data must be JSON, not {content_type!r}",
                    _peek(header_map, value),
                )
            attributes["data"] = _json_data(value or b"")
        return CompletionEvent.model_validate(attributes)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'event'}: "
            + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()
        )
        return Rejection("malformed", problems[:500], _peek(header_map, value))
    except _UNREADABLE as exc:
        return Rejection("malformed", _short(exc), _peek(header_map, value))


def inspect_record(
    headers: Headers,
    key: bytes | None,
    value: bytes | None,
    registry: Registry,
    policy: Policy,
    now: datetime,
) -> CompletionEvent | Rejection:
    """The whole gate: size, CloudEvent shape, signature, tenant and type, payload schema.

    ``now`` is the moment the record is judged at: the present for live traffic, the
    original arrival for a replay from quarantine (so a replay is judged as the event
    would have been, had the registry been right at the time).
    """
    header_map = _header_dict(headers)
    too_large = check_size(header_map, key, value, policy)
    if too_large is not None:
        return Rejection(too_large.reason, too_large.detail, _peek(header_map, None))
    parsed = parse_record(headers, key, value)
    if isinstance(parsed, Rejection):
        return parsed
    refused = check_event(parsed, header_map, value or b"", registry, policy, now)
    return parsed if refused is None else refused

"""Reading resume messages from the resume topic."""

from __future__ import annotations

import hashlib
import json

from matcher.domain.resume import RESUME_TYPE, ResumeData


class NotAResume(ValueError):
    pass


def parse_resume(value: bytes | str) -> ResumeData:
    """The resume carried by one message of the resume topic (a JSON CloudEvent)."""
    try:
        envelope = json.loads(value)
    except ValueError as exc:
        raise NotAResume(f"not JSON: {exc}") from exc
    if not isinstance(envelope, dict) or envelope.get("type") != RESUME_TYPE:
        raise NotAResume(f"not a {RESUME_TYPE} CloudEvent")
    resume = ResumeData.model_validate(envelope.get("data"))
    raw = value.encode() if isinstance(value, str) else value
    resume._message_sha256 = hashlib.sha256(raw).digest()
    return resume

"""Reading resume messages from the resume topic."""

from __future__ import annotations

from matcher.domain.resume import NotAResume, ResumeData, read_resume


def parse_resume(value: bytes | str) -> ResumeData:
    """The resume carried by one message of the resume topic (a JSON CloudEvent); raises
    ``NotAResume`` for anything else. The resume keeps the message it was read from: the
    worker API verifies and advances by it."""
    return read_resume(value)


__all__ = ["NotAResume", "parse_resume"]

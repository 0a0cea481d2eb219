"""Build, sign and publish completion events for matcher."""

from matcher_producer.event import CompletionEvent, KafkaRecord, encode
from matcher_producer.http import sign_http
from matcher_producer.publisher import EventPublisher
from matcher_producer.signing import SigningKey, binary_content, sign_record

__all__ = [
    "CompletionEvent",
    "EventPublisher",
    "KafkaRecord",
    "SigningKey",
    "binary_content",
    "encode",
    "sign_http",
    "sign_record",
]

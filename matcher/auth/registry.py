"""The producer registry: which producers exist, what they may say, and their keys.

A TOML file (``MATCHER_PRODUCERS_FILE``)::

    [producers."billing-svc"]          # the CloudEvents `source`
    tenants = ["acme", "globex"]       # tenants it may speak for ("*": any)
    types = ["job.completed", "job.failed"]
    [[producers."billing-svc".keys]]
    id = "k1"
    hmac_secret = "whsec_..."          # or: ed25519_public_key = "whpk_..."

    [schemas]                          # optional: payload JSON Schema per event type,
    "job.completed" = "schemas/job-completed.json"   # paths relative to this file
    # or: schema_dir = "schemas"  (files named <type>.json)

Several keys may be listed at once: that is how a key is rotated (add the new key, move
the producers to it, remove the old one).

A producer that sends plain JSON webhooks rather than CloudEvents (through ``matcher
ingress``) has a ``webhook`` table: its signature scheme and the mapping from its body to
the event (``matcher.auth.webhooks``)::

    [producers."openai"]
    tenants = ["acme"]
    types = ["batch.completed"]
    webhook.scheme = "standard-webhooks"      # or "github", "stripe"
    webhook.mapping = { type = "{/type}", correlationid = "{/data/id}", tenant = "acme" }
    [[producers."openai".keys]]
    id = "k1"
    hmac_secret = "whsec_..."                 # github and stripe: secret = "<as configured>"
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from matcher.auth.signatures import MAX_KEYS_PER_PRODUCER, VerifyingKey, decode_key
from matcher.auth.webhooks import (
    BUILT_IN_DROPS,
    DropRule,
    Scheme,
    WebhookMapping,
    compile_drop_rule,
    compile_mapping,
)
from matcher.domain.callbacks import CALLBACK_PRODUCER


class RegistryError(Exception):
    """The producers file is unusable; the message lists every problem."""


class KeySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="Names the key in logs; unique per producer.")
    hmac_secret: str | None = Field(default=None, description="whsec_ + base64 secret.")
    ed25519_public_key: str | None = Field(default=None, description="whpk_ + base64 key.")
    secret: str | None = Field(
        default=None,
        description="A github or stripe webhook's signing secret, exactly as the sender shows it.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> KeySpec:
        given = [self.hmac_secret, self.ed25519_public_key, self.secret]
        if sum(k is not None for k in given) != 1:
            raise ValueError("give exactly one of hmac_secret, ed25519_public_key or secret")
        if self.secret is not None and not self.secret:
            raise ValueError("secret is empty")
        if self.hmac_secret is not None:
            decode_key(self.hmac_secret, "whsec_")
        if (
            self.ed25519_public_key is not None
            and len(decode_key(self.ed25519_public_key, "whpk_")) != 32
        ):
            raise ValueError("ed25519_public_key must hold 32 bytes")
        return self

    def verifying_key(self) -> VerifyingKey:
        if self.secret is not None:  # used as the sender uses it: its UTF-8 bytes
            return VerifyingKey(self.id, hmac_secret=self.secret.encode())
        if self.hmac_secret is not None:
            return VerifyingKey(self.id, hmac_secret=decode_key(self.hmac_secret, "whsec_"))
        assert self.ed25519_public_key is not None
        public = Ed25519PublicKey.from_public_bytes(decode_key(self.ed25519_public_key, "whpk_"))
        return VerifyingKey(self.id, ed25519_public_key=public)


class MappingSpec(BaseModel):
    """Templates (``matcher.auth.webhooks``) for the event's attributes."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        default=None,
        description="The event id (the dedupe key). Default: {header:webhook-id} for "
        "standard-webhooks, {/id} for stripe; required for github.",
    )
    type: str = Field(description='The event type, e.g. "{/type}".')
    tenant: str = Field(description='A fixed tenant ("acme") or one from the body.')
    correlationid: str = Field(description='What the wait waits for, e.g. "{/data/id}".')
    jobid: str | None = Field(default=None, description="The external job's id (optional).")
    time: str | None = Field(
        default=None,
        description="When the job finished (optional): an RFC 3339 time, or Unix seconds (an "
        'integer or a string of digits, e.g. "{/created}" for Stripe).',
    )


MAX_DROP_RULES = 16


class DropRuleSpec(BaseModel):
    """A delivery to acknowledge (200) and not forward: matched on a body pointer or a
    signed header, after the signature is verified."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(
        pattern=r"^[a-z0-9_]{1,40}$",
        description="The rule's name: the drop counter's label and the answer's word.",
    )
    field: str = Field(description='A body pointer ("/action") or a signed header ("header:x").')
    in_: list[str] | None = Field(
        default=None,
        alias="in",
        min_length=1,
        max_length=64,
        description="Drop when the value is one of these.",
    )
    not_in: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Drop when the value is none of these (an empty list would drop all).",
    )
    present: bool | None = Field(
        default=None, description="Drop when the field is there (true) or absent (false)."
    )

    @model_validator(mode="after")
    def _one_test(self) -> DropRuleSpec:
        given = [t for t in ("in", "not_in", "present") if self._test(t) is not None]
        if len(given) != 1:
            raise ValueError(
                f"drop {self.name!r}: give exactly one of in, not_in, present (given: "
                f"{', '.join(given) or 'none'})"
            )
        return self

    def _test(self, name: str) -> object:
        return {"in": self.in_, "not_in": self.not_in, "present": self.present}[name]

    def compiled(self, scheme: Scheme) -> DropRule:
        if self.present is not None:
            return compile_drop_rule(scheme, self.name, self.field, None, not self.present)
        negate = self.not_in is not None
        values = self.not_in if negate else self.in_
        return compile_drop_rule(scheme, self.name, self.field, values, negate)


class WebhookSpec(BaseModel):
    """A producer that sends plain JSON webhooks, not CloudEvents."""

    model_config = ConfigDict(extra="forbid")

    scheme: Scheme = Field(description="How the sender signs: standard-webhooks, github, stripe.")
    mapping: MappingSpec
    drop: list[DropRuleSpec] = Field(
        default_factory=list,
        max_length=MAX_DROP_RULES,
        description="Deliveries to acknowledge and not forward (github: ping is built in).",
    )

    @field_validator("drop")
    @classmethod
    def _unique_drop_names(cls, rules: list[DropRuleSpec]) -> list[DropRuleSpec]:
        names = [r.name for r in rules]
        if len(names) != len(set(names)):
            raise ValueError("drop rule names must be unique within a producer")
        if "ping" in names:
            raise ValueError("drop rule name 'ping' is GitHub's built-in one: name it otherwise")
        return rules

    def compiled(self) -> Webhook:
        return Webhook(
            self.scheme,
            compile_mapping(self.scheme, self.mapping.model_dump()),
            BUILT_IN_DROPS[self.scheme] + tuple(r.compiled(self.scheme) for r in self.drop),
        )


class ProducerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: list[str] = Field(min_length=1, description='Tenants it may speak for; "*": any.')
    types: list[str] = Field(min_length=1, description='Event types it may send; "*": any.')
    keys: list[KeySpec] = Field(default_factory=list)
    webhook: WebhookSpec | None = Field(
        default=None, description="Set for plain JSON webhooks; absent: CloudEvents."
    )

    @field_validator("keys")
    @classmethod
    def _unique_ids(cls, keys: list[KeySpec]) -> list[KeySpec]:
        ids = [k.id for k in keys]
        if len(ids) != len(set(ids)):
            raise ValueError("key ids must be unique within a producer")
        if len(keys) > MAX_KEYS_PER_PRODUCER:
            raise ValueError(
                f"{len(keys)} keys; a producer has at most {MAX_KEYS_PER_PRODUCER} (a rotation "
                "needs two at a time): every key is a verification that any record claiming "
                "this producer costs, signed or not"
            )
        return keys

    @model_validator(mode="after")
    def _keys_fit_the_scheme(self) -> ProducerSpec:
        scheme = self.webhook.scheme if self.webhook is not None else None
        raw = scheme in ("github", "stripe")
        for key in self.keys:
            if raw and key.secret is None:
                raise ValueError(f'key {key.id!r}: a {scheme} key is a secret = "..."')
            if not raw and key.secret is not None:
                raise ValueError(
                    f"key {key.id!r}: secret is for github and stripe webhooks; Standard "
                    "Webhooks keys are hmac_secret (whsec_) or ed25519_public_key (whpk_)"
                )
        if self.webhook is not None:
            self.webhook.compiled()
        return self


@dataclass(frozen=True)
class Webhook:
    """How a plain-webhook producer signs, and how its body maps to an event."""

    scheme: Scheme
    mapping: WebhookMapping
    drop: tuple[DropRule, ...] = ()  # the built-in ones first


class ProducersFile(BaseModel):
    """The whole producers file."""

    model_config = ConfigDict(extra="forbid")

    producers: dict[str, ProducerSpec] = Field(default_factory=dict)
    schemas: dict[str, str] = Field(
        default_factory=dict, description="Event type to JSON Schema file."
    )
    schema_dir: str | None = Field(
        default=None, description="A directory of <event type>.json JSON Schemas."
    )

    @field_validator("producers")
    @classmethod
    def _no_reserved_name(cls, value: dict[str, ProducerSpec]) -> dict[str, ProducerSpec]:
        # Callback events are stored under this producer, their ids the waits' ids: a
        # producer of that name could take a wait's callback before it is used.
        if CALLBACK_PRODUCER in value:
            raise ValueError(
                f"{CALLBACK_PRODUCER!r} is reserved for callback URLs: name the producer otherwise"
            )
        return value


@dataclass(frozen=True)
class Producer:
    source: str
    tenants: frozenset[str]
    types: frozenset[str]
    keys: tuple[VerifyingKey, ...]
    webhook: Webhook | None = None  # None: it sends CloudEvents

    def may_speak_for(self, tenant: str) -> bool:
        return "*" in self.tenants or tenant in self.tenants

    def may_send(self, event_type: str) -> bool:
        return "*" in self.types or event_type in self.types


@dataclass(frozen=True)
class Registry:
    producers: dict[str, Producer] = field(default_factory=dict)
    schemas: dict[str, Draft202012Validator] = field(default_factory=dict)
    origin: str = "(empty)"


def _problems(exc: ValidationError) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: "
        + str(e["msg"]).removeprefix("Value error, ")
        for e in exc.errors()
    ]


def _read_text(path: Path, what: str) -> str:
    """The file's text; whatever makes it unreadable is a RegistryError saying why in one line.

    Read as bytes and decoded here, so a byte that is not UTF-8 (a Latin-1 comment) names
    the file and where, rather than escaping as a UnicodeDecodeError that would end a
    reload loop or the command.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RegistryError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start]
        raise RegistryError(
            f"{what} {path}: not valid UTF-8: byte 0x{bad:02x} at offset {exc.start} ({exc.reason})"
        ) from exc


def _load_schema(path: Path) -> Draft202012Validator:
    text = _read_text(path, "schema")
    try:
        schema: Any = json.loads(text)
        Draft202012Validator.check_schema(schema)
    except ValueError as exc:
        raise RegistryError(f"schema {path}: {exc}") from exc
    except SchemaError as exc:
        raise RegistryError(f"schema {path}: not a valid JSON Schema: {exc.message}") from exc
    return Draft202012Validator(schema)


def parse_registry(text: str, base: Path, origin: str = "(text)") -> Registry:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{origin}: not valid TOML: {exc}") from exc
    try:
        spec = ProducersFile.model_validate(raw)
    except ValidationError as exc:
        raise RegistryError(f"{origin}: " + "; ".join(_problems(exc))) from exc
    schemas: dict[str, Draft202012Validator] = {}
    if spec.schema_dir is not None:
        directory = (base / spec.schema_dir).resolve()
        if not directory.is_dir():
            raise RegistryError(f"{origin}: schema_dir {directory} is not a directory")
        for path in sorted(directory.glob("*.json")):
            schemas[path.stem] = _load_schema(path)
    for event_type, relative in spec.schemas.items():
        schemas[event_type] = _load_schema((base / relative).resolve())
    producers = {
        source: Producer(
            source=source,
            tenants=frozenset(p.tenants),
            types=frozenset(p.types),
            keys=tuple(k.verifying_key() for k in p.keys),
            webhook=None if p.webhook is None else p.webhook.compiled(),
        )
        for source, p in spec.producers.items()
    }
    return Registry(producers=producers, schemas=schemas, origin=origin)


def load_registry(path: Path) -> Registry:
    text = _read_text(path, "producers file")
    return parse_registry(text, path.parent, origin=str(path))

"""Configuration validation: defaults, and one clear line per bad value."""

from __future__ import annotations

import pytest

from matcher.config import ConfigError, Settings, load_settings

GOOD = {
    "MATCHER_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
    "MATCHER_DATABASE_URL": "postgresql://u:hunter2@db:5432/matcher",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("MATCHER_"):
            monkeypatch.delenv(key)


def _load(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for key, value in {**GOOD, **env}.items():
        monkeypatch.setenv(key, value)
    return load_settings()


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _load(monkeypatch)
    assert settings.events_topic == "matcher.events"
    assert settings.resume_topic == "matcher.resumes"
    assert settings.topic_partitions == 6
    assert settings.consumer_group == "matcher"
    assert settings.kafka_client_options() == {
        "bootstrap_servers": "127.0.0.1:9092",
        "security_protocol": "PLAINTEXT",
    }


def test_every_problem_is_reported_on_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(
            monkeypatch,
            MATCHER_TOPIC_PARTITIONS="0",
            MATCHER_EVENTS_TOPIC="bad topic!",
            MATCHER_LOG_FORMAT="xml",
        )
    problems = caught.value.problems
    assert len(problems) == 3
    assert problems[0].startswith("MATCHER_EVENTS_TOPIC:")
    assert "'bad topic!'" in problems[0]
    assert any(p.startswith("MATCHER_TOPIC_PARTITIONS:") and "'0'" in p for p in problems)
    assert any(p.startswith("MATCHER_LOG_FORMAT:") for p in problems)


def test_missing_required_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert sorted(caught.value.problems) == [
        "MATCHER_DATABASE_URL: required, not set",
        "MATCHER_KAFKA_BOOTSTRAP_SERVERS: required, not set",
    ]


def test_secrets_never_appear_in_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(monkeypatch, MATCHER_DATABASE_URL="mysql://u:hunter2@db/x")
    assert "hunter2" not in str(caught.value)
    assert caught.value.problems == ["MATCHER_DATABASE_URL: must be a postgresql:// URI"]


@pytest.mark.parametrize("servers", ["", "host", "host:0", "host:99999", "a:1,b", " , "])
def test_bootstrap_servers_are_host_port(monkeypatch: pytest.MonkeyPatch, servers: str) -> None:
    with pytest.raises(ConfigError, match="MATCHER_KAFKA_BOOTSTRAP_SERVERS"):
        _load(monkeypatch, MATCHER_KAFKA_BOOTSTRAP_SERVERS=servers)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"MATCHER_EVENTS_TOPIC": "same", "MATCHER_RESUME_TOPIC": "same"}, "different topics"),
        ({"MATCHER_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext"}, "SASL_MECHANISM is required"),
        ({"MATCHER_DB_POOL_MIN_SIZE": "9", "MATCHER_DB_POOL_MAX_SIZE": "3"}, "must not exceed"),
    ],
)
def test_cross_field_rules(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        _load(monkeypatch, **env)


def test_sasl_passes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _load(
        monkeypatch,
        MATCHER_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        MATCHER_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
        MATCHER_KAFKA_SASL_USERNAME="svc",
        MATCHER_KAFKA_SASL_PASSWORD="pw",
    )
    options = settings.kafka_client_options()
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_password"] == "pw"


def test_daemon_connections_get_failover_defaults_the_url_does_not_set() -> None:
    from psycopg.conninfo import conninfo_to_dict

    multi = "postgresql://matcher@h1:5432,h2:5433/matcher?target_session_attrs=read-write"
    found = conninfo_to_dict(
        Settings(kafka_bootstrap_servers="k:9092", database_url=multi).database_conninfo()
    )
    assert found["host"] == "h1,h2"
    assert found["port"] == "5432,5433"
    assert found["target_session_attrs"] == "read-write"
    assert (found["connect_timeout"], found["keepalives"]) == ("5", "1")
    mine = "postgresql://matcher@h1/matcher?connect_timeout=30&keepalives=0"
    found = conninfo_to_dict(
        Settings(kafka_bootstrap_servers="k:9092", database_url=mine).database_conninfo()
    )
    assert (found["connect_timeout"], found["keepalives"]) == ("30", "0")  # the URL's own


def test_topics_with_three_replicas_want_two_in_sync() -> None:
    from matcher.kafka.topics import _with_durability

    assert _with_durability({}, 3) == {"min.insync.replicas": "2"}
    assert _with_durability({"min.insync.replicas": "3"}, 5) == {"min.insync.replicas": "3"}
    assert _with_durability({"retention.ms": "1"}, 1) == {"retention.ms": "1"}


def test_a_request_never_waits_longer_than_its_call() -> None:
    settings = Settings(kafka_bootstrap_servers="k:9092", database_url="postgresql://u@h/d")
    assert settings.kafka_request_timeout_ms == 5000
    assert settings.request_timeout_ms(30.0) == 5000  # the request's own bound
    assert settings.request_timeout_ms(1.5) == 1500  # the call's, when shorter

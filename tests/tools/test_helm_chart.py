"""The Helm chart (helm/matcher), rendered with `helm template` and checked object by object.

helm comes from scripts/install-helm (built once with `go install`, then cached), so these
tests need Go the first time and nothing but the cache afterwards. `make chart-check` runs
scripts/check-chart itself; these tests check what it cannot see: the objects, one by one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from tests.tools.chart import (
    CHART,
    OPS,
    Doc,
    config_map,
    container,
    daemon_settings,
    of_kind,
    one,
    pod_spec,
    render,
    render_error,
    secret_env,
)

# The first run on a machine builds helm from source (up to 20 minutes, bounded in the
# fixture): longer than the default test timeout.
pytestmark = pytest.mark.timeout(1500)


def alert_groups() -> Any:
    return yaml.safe_load((OPS / "prometheus" / "alerts.yaml").read_text())["groups"]


# The copies the chart ships.


@pytest.mark.parametrize(
    ("original", "copy"),
    [
        ("prometheus/alerts.yaml", "alerts.yaml"),
        ("grafana/matcher-dashboard.json", "matcher-dashboard.json"),
    ],
)
def test_chart_files_are_byte_identical_to_ops_originals(original: str, copy: str) -> None:
    assert (CHART / "files" / copy).read_bytes() == (OPS / original).read_bytes(), (
        f"helm/matcher/files/{copy} has drifted from ops/{original}: copy it again"
    )


# The daemon.


def test_default_render_has_exactly_the_expected_objects(default_docs: list[Doc]) -> None:
    kinds = sorted(d["kind"] for d in default_docs)
    assert kinds == sorted(
        ["ConfigMap", "ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Service",
         "ServiceAccount", "ServiceAccount"]
    )  # fmt: skip
    for doc in default_docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "matcher"
        assert labels["app.kubernetes.io/instance"] == "matcher"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == "0.1.0"


def test_deployment_runs_matcher_run_with_the_admin_port_and_probes(any_docs: list[Doc]) -> None:
    deployment = one(any_docs, "Deployment", "daemon")
    c = container(deployment)
    assert [*c["command"], *c["args"]] == ["matcher", "run"]
    assert c["image"] == "ghcr.io/matcher/matcher:0.1.0"
    assert c["ports"] == [{"name": "admin", "containerPort": 9464, "protocol": "TCP"}]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "admin"}, probe
    assert c["startupProbe"]["httpGet"]["port"] == "admin"
    assert c["resources"]["requests"] == {"cpu": "250m", "memory": "256Mi"}
    assert c["resources"]["limits"]["memory"] == "512Mi"
    assert daemon_settings(any_docs)["MATCHER_ADMIN_ADDRESS"] == "0.0.0.0:9464"


def test_settings_come_from_the_configmap_and_secrets_from_secrets(
    default_docs: list[Doc],
) -> None:
    settings = daemon_settings(default_docs)
    assert settings["MATCHER_KAFKA_BOOTSTRAP_SERVERS"] == "kafka-0.kafka:9092,kafka-1.kafka:9092"
    assert settings["MATCHER_LOG_FORMAT"] == "json"
    assert settings["MATCHER_ALLOW_UNSIGNED"] == "false"
    assert settings["MATCHER_EVENTS_TOPIC"] == "matcher.events"
    assert settings["MATCHER_RESUME_TOPIC"] == "matcher.resumes"
    assert settings["MATCHER_TOPIC_PARTITIONS"] == "6"
    assert settings["MATCHER_CONSUMER_GROUP"] == "matcher"
    assert settings["MATCHER_INBOX_RETENTION"] == "P7D"
    assert all(isinstance(v, str) for v in settings.values()), "ConfigMap values are strings"
    for secret in ("MATCHER_DATABASE_URL", "MATCHER_KAFKA_SASL_PASSWORD", "MATCHER_ADMIN_TOKEN"):
        assert secret not in settings
    refs = secret_env(container(one(default_docs, "Deployment", "daemon")))
    assert refs == {"MATCHER_DATABASE_URL": ("matcher-database", "url")}


def test_sasl_ssl_takes_the_password_and_tls_files_from_their_secrets(
    all_on_docs: list[Doc],
) -> None:
    settings = daemon_settings(all_on_docs)
    assert settings["MATCHER_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert settings["MATCHER_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert settings["MATCHER_KAFKA_SASL_USERNAME"] == "matcher"
    deployment = one(all_on_docs, "Deployment", "daemon")
    c = container(deployment)
    refs = secret_env(c)
    assert refs["MATCHER_KAFKA_SASL_PASSWORD"] == ("matcher-kafka", "sasl-password")
    assert refs["MATCHER_ADMIN_TOKEN"] == ("matcher-admin", "token")
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["kafka-tls"]["secret"]["secretName"] == "matcher-kafka-tls"
    tls_dir = mounts["kafka-tls"]["mountPath"]
    assert mounts["kafka-tls"]["readOnly"] is True
    for variable, key in (("CAFILE", "ca.crt"), ("CERTFILE", "tls.crt"), ("KEYFILE", "tls.key")):
        assert settings[f"MATCHER_KAFKA_SSL_{variable}"] == f"{tls_dir}/{key}"


def test_plaintext_kafka_has_no_sasl_or_tls_settings(default_docs: list[Doc]) -> None:
    settings = daemon_settings(default_docs)
    assert not [k for k in settings if "SASL" in k or "SSL_" in k]
    daemon = container(one(default_docs, "Deployment", "daemon"))
    assert "MATCHER_KAFKA_SASL_PASSWORD" not in secret_env(daemon)


def test_producer_registry_is_mounted_where_the_setting_points(any_docs: list[Doc]) -> None:
    deployment = one(any_docs, "Deployment", "daemon")
    path = Path(daemon_settings(any_docs)["MATCHER_PRODUCERS_FILE"])
    mounts = {m["name"]: m for m in container(deployment)["volumeMounts"]}
    volume = {v["name"]: v for v in pod_spec(deployment)["volumes"]}["producers"]
    assert Path(mounts["producers"]["mountPath"]) == path.parent
    assert "subPath" not in mounts["producers"], "a subPath mount never sees Secret updates"
    assert volume["secret"]["secretName"] == "matcher-producers"
    assert volume["secret"]["items"] == [{"key": "producers.toml", "path": path.name}]


def test_security_context_is_locked_down(any_docs: list[Doc]) -> None:
    # The webhook ingress's Deployment too, where it is on (the all-on values).
    for workload in (*of_kind(any_docs, "Deployment"), one(any_docs, "Job")):
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["securityContext"]["fsGroup"] == 10001
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        sc = container(workload)["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        # The root filesystem is read-only: /tmp must be a volume.
        tmp = [m for m in container(workload)["volumeMounts"] if m["mountPath"] == "/tmp"]  # noqa: S108
        assert len(tmp) == 1
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[tmp[0]["name"]]
    accounts = of_kind(any_docs, "ServiceAccount")
    assert accounts
    assert all(a["automountServiceAccountToken"] is False for a in accounts)


def test_grace_period_outlasts_the_shutdown_timeout(any_docs: list[Doc]) -> None:
    grace = pod_spec(one(any_docs, "Deployment", "daemon"))["terminationGracePeriodSeconds"]
    shutdown = float(daemon_settings(any_docs)["MATCHER_SHUTDOWN_TIMEOUT_S"])
    assert isinstance(grace, int)
    assert grace > shutdown


def test_grace_period_defaults_to_the_shutdown_timeout_plus_a_margin(helm: str) -> None:
    docs = render(helm, {"shutdownTimeoutSeconds": 100})
    assert pod_spec(one(docs, "Deployment", "daemon"))["terminationGracePeriodSeconds"] == 115


def test_grace_period_not_longer_than_shutdown_timeout_fails(helm: str) -> None:
    error = render_error(helm, {"shutdownTimeoutSeconds": 60, "terminationGracePeriodSeconds": 60})
    assert "terminationGracePeriodSeconds (60) must be longer than shutdownTimeoutSeconds" in error


def test_config_changes_roll_the_pods(helm: str, default_docs: list[Doc]) -> None:
    def checksum(docs: list[Doc]) -> str:
        template = one(docs, "Deployment", "daemon")["spec"]["template"]
        return cast(str, template["metadata"]["annotations"]["checksum/config"])

    changed = render(helm, {"log": {"level": "DEBUG"}})
    assert checksum(changed) != checksum(default_docs)
    assert checksum(render(helm)) == checksum(default_docs)


def test_service_targets_the_admin_port_of_the_daemon_pods(any_docs: list[Doc]) -> None:
    service = one(any_docs, "Service", "daemon")
    deployment = one(any_docs, "Deployment", "daemon")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "admin", "port": 9464, "targetPort": "admin", "protocol": "TCP"}
    ]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    job_labels = one(any_docs, "Job")["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= job_labels.items()


def test_pod_disruption_budget_allows_one_down(default_docs: list[Doc]) -> None:
    pdb = one(default_docs, "PodDisruptionBudget", "daemon")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == one(default_docs, "Deployment", "daemon")["spec"]["selector"]


def test_extra_config_is_passed_through_as_strings(all_on_docs: list[Doc]) -> None:
    settings = daemon_settings(all_on_docs)
    assert settings["MATCHER_INGEST_BATCH_MAX"] == "1000"
    assert settings["MATCHER_SIGNATURE_TOLERANCE_S"] == "120"


def test_large_numbers_are_not_rendered_in_exponent_form(helm: str) -> None:
    settings = daemon_settings(render(helm, {"config": {"MATCHER_MAX_EVENT_BYTES": 2000000}}))
    assert settings["MATCHER_MAX_EVENT_BYTES"] == "2000000"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"MATCHER_DATABASE_URL": "postgresql://x"}, "secrets do not belong in the ConfigMap"),
        ({"MATCHER_LOG_LEVEL": "DEBUG"}, "the chart sets this variable from its own values"),
    ],
)
def test_config_cannot_carry_secrets_or_shadow_chart_values(
    helm: str, config: dict[str, str], message: str
) -> None:
    assert message in render_error(helm, {"config": config})


# Render-time refusals.


def test_missing_database_secret_fails_with_a_clear_message(helm: str) -> None:
    error = render_error(helm, {"database": {"url": {"existingSecret": ""}}})
    assert "database.url.existingSecret is required" in error


def test_missing_bootstrap_servers_fails_with_a_clear_message(helm: str) -> None:
    error = render_error(helm, {"kafka": {"bootstrapServers": ""}})
    assert "kafka.bootstrapServers is required" in error


def test_missing_producer_registry_fails_unless_unsigned_is_allowed(helm: str) -> None:
    error = render_error(helm, {"producers": {"existingSecret": ""}})
    assert "producers.existingSecret is required" in error
    docs = render(helm, {"producers": {"existingSecret": "", "allowUnsigned": True}})
    settings = daemon_settings(docs)
    assert settings["MATCHER_ALLOW_UNSIGNED"] == "true"
    assert "MATCHER_PRODUCERS_FILE" not in settings


def test_sasl_without_a_password_secret_fails(helm: str) -> None:
    sasl = {"securityProtocol": "SASL_SSL", "sasl": {"mechanism": "PLAIN", "username": "u"}}
    error = render_error(helm, {"kafka": sasl})
    assert "kafka.sasl.password.existingSecret is required" in error


def test_schema_rejects_unknown_enum_values(helm: str) -> None:
    error = render_error(helm, {"kafka": {"securityProtocol": "TLS"}})
    assert "securityProtocol" in error


# The migration hook.


def test_migration_job_is_a_hook_running_matcher_migrate(any_docs: list[Doc]) -> None:
    job = one(any_docs, "Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert "helm.sh/hook-weight" in annotations
    assert job["spec"]["backoffLimit"] >= 0
    assert job["spec"]["activeDeadlineSeconds"] > 0
    c = container(job)
    assert [*c["command"], *c["args"]][:2] == ["matcher", "migrate"]
    assert pod_spec(job)["restartPolicy"] == "Never"


def test_migration_job_has_the_daemon_settings_without_the_configmap(
    any_docs: list[Doc],
) -> None:
    # On first install the hook runs before the ConfigMap exists: its env must be inline.
    job_container = container(one(any_docs, "Job"))
    assert "envFrom" not in job_container
    inline = {v["name"]: v["value"] for v in job_container["env"] if "value" in v}
    inline.pop("TZ", None)  # extraEnv of the all-on values
    assert inline == daemon_settings(any_docs)
    daemon = container(one(any_docs, "Deployment", "daemon"))
    assert secret_env(job_container) == secret_env(daemon)
    assert job_container["volumeMounts"] == daemon["volumeMounts"]


def test_migration_hook_objects_exist_before_the_job(helm: str, default_docs: list[Doc]) -> None:
    def weight(doc: Doc) -> int:
        return int(doc["metadata"]["annotations"]["helm.sh/hook-weight"])

    job = one(default_docs, "Job")
    account = one(default_docs, "ServiceAccount", component="migrate")
    assert pod_spec(job)["serviceAccountName"] == account["metadata"]["name"]
    assert weight(account) < weight(job)
    dev = render(
        helm,
        {"database": {"url": {"existingSecret": ""}},
         "createSecret": {"enabled": True, "databaseUrl": "postgresql://u:p@db/app"}},
    )  # fmt: skip
    secret = one(dev, "Secret")
    assert weight(secret) < weight(one(dev, "Job"))
    assert secret_env(container(one(dev, "Job")))["MATCHER_DATABASE_URL"] == (
        secret["metadata"]["name"],
        "database-url",
    )


def test_no_secret_is_created_by_default(any_docs: list[Doc]) -> None:
    assert of_kind(any_docs, "Secret") == []


def test_topics_can_be_left_to_someone_else(all_on_docs: list[Doc]) -> None:
    assert container(one(all_on_docs, "Job"))["args"] == ["migrate", "--no-topics"]


# Optional parts.


@pytest.mark.parametrize(
    ("kind", "switch"),
    [
        ("ServiceMonitor", "serviceMonitor"),
        ("PrometheusRule", "prometheusRule"),
        ("ScaledObject", "keda"),
    ],
)
def test_optional_objects_only_when_enabled(
    default_docs: list[Doc], all_on_docs: list[Doc], kind: str, switch: str
) -> None:
    assert of_kind(default_docs, kind) == [], f"{kind} rendered with {switch} off"
    assert of_kind(all_on_docs, kind), f"{kind} missing with {switch} on"


def test_dashboard_configmap_carries_the_ops_dashboard(any_docs: list[Doc]) -> None:
    dashboards = [
        d for d in of_kind(any_docs, "ConfigMap") if "matcher-dashboard.json" in d["data"]
    ]
    assert len(dashboards) == 1
    dashboard = dashboards[0]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    expected = json.loads((OPS / "grafana" / "matcher-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["matcher-dashboard.json"]) == expected


def test_dashboard_can_be_turned_off(helm: str) -> None:
    docs = render(helm, {"dashboard": {"enabled": False}})
    assert [config_map(docs)] == of_kind(docs, "ConfigMap")


def test_prometheus_rule_groups_equal_the_ops_rules(all_on_docs: list[Doc]) -> None:
    rule = one(all_on_docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"]["groups"] == alert_groups()
    # The rules' own templates must reach Prometheus unrendered.
    assert "{{ $value }}" in json.dumps(rule["spec"])


def test_service_monitor_scrapes_admin_metrics_with_the_admin_token(
    all_on_docs: list[Doc],
) -> None:
    monitor = one(all_on_docs, "ServiceMonitor", "daemon")
    service = one(all_on_docs, "Service", "daemon")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "admin"
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "matcher-admin", "key": "token"},
    }


def test_service_monitor_without_a_token_sends_none(helm: str) -> None:
    docs = render(helm, {"serviceMonitor": {"enabled": True}})
    [endpoint] = one(docs, "ServiceMonitor", "daemon")["spec"]["endpoints"]
    assert "authorization" not in endpoint


def test_keda_scales_on_the_group_lag_and_owns_the_replicas(all_on_docs: list[Doc]) -> None:
    scaled = one(all_on_docs, "ScaledObject")
    deployment = one(all_on_docs, "Deployment", "daemon")
    settings = daemon_settings(all_on_docs)
    assert "replicas" not in deployment["spec"], "KEDA owns the replica count"
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["maxReplicaCount"] <= int(settings["MATCHER_TOPIC_PARTITIONS"])
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == settings["MATCHER_CONSUMER_GROUP"]
    assert trigger["metadata"]["topic"] == settings["MATCHER_EVENTS_TOPIC"]
    assert trigger["metadata"]["bootstrapServers"] == settings["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
    assert trigger["metadata"]["sasl"] == "scram_sha512"
    auth = one(all_on_docs, "TriggerAuthentication")
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert refs["password"] == ("matcher-kafka", "sasl-password")


def test_replicas_are_set_when_keda_is_off(default_docs: list[Doc]) -> None:
    assert one(default_docs, "Deployment", "daemon")["spec"]["replicas"] == 2


def test_keda_max_replicas_above_partitions_fails(helm: str) -> None:
    error = render_error(helm, {"keda": {"enabled": True, "maxReplicaCount": 7}})
    assert "keda.maxReplicaCount (7) must not exceed kafka.topicPartitions (6)" in error


def test_replicas_above_partitions_fail_like_the_keda_maximum(helm: str) -> None:
    error = render_error(helm, {"replicas": 7})
    assert "replicas (7) must not exceed kafka.topicPartitions (6)" in error
    # As many daemons as partitions is fine; with KEDA on, replicas is KEDA's.
    render(helm, {"replicas": 6})
    render(helm, {"replicas": 12, "kafka": {"topicPartitions": 12}})
    render(helm, {"replicas": 7, "keda": {"enabled": True}})


def test_lint_without_values_shows_the_friendly_messages(helm: str) -> None:
    """Helm's lint mode never fails on required values; it must still say which ones are
    missing, not crash on the empty Secret reference (reflect: slice index out of range)."""
    linted = subprocess.run(
        [helm, "lint", str(CHART)], capture_output=True, text=True, check=False, timeout=120
    )
    output = linted.stdout + linted.stderr
    assert "reflect" not in output, output
    assert "database.url.existingSecret is required" in output
    assert "kafka.bootstrapServers is required" in output
    assert "producers.existingSecret is required" in output
    assert linted.returncode == 0, output

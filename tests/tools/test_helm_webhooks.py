"""The webhook ingress in the chart (webhooks.*): `matcher ingress` with Kafka and the
producer registry but no database, behind a Service, an optional autoscaler and budget, and
an optional Kubernetes Ingress that exposes the webhook path and nothing else."""

from __future__ import annotations

import json
from typing import cast

import pytest

from tests.tools.chart import (
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

# The first run on a machine builds helm from source (bounded in the fixture).
pytestmark = pytest.mark.timeout(1500)

ON: Doc = {"webhooks": {"enabled": True}}


def on(**webhooks: object) -> Doc:
    return {"webhooks": {"enabled": True, **webhooks}}


@pytest.fixture(scope="session")
def hooks_docs(helm: str) -> list[Doc]:
    """The minimum values with the ingress switched on, all else at its default."""
    return render(helm, ON)


@pytest.fixture(params=["defaults", "all-on"])
def with_hooks(
    request: pytest.FixtureRequest, hooks_docs: list[Doc], all_on_docs: list[Doc]
) -> list[Doc]:
    return hooks_docs if request.param == "defaults" else all_on_docs


def ingress_deployment(docs: list[Doc]) -> Doc:
    return one(docs, "Deployment", "webhooks")


def ingress_settings(docs: list[Doc]) -> dict[str, str]:
    """The ingress's ConfigMap data, checked to be what its container loads."""
    cm = config_map(docs, "webhooks")
    env_from = container(ingress_deployment(docs))["envFrom"]
    assert env_from == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
    return cast(dict[str, str], cm["data"])


def prefix_matches(prefix: str, path: str) -> bool:
    """Kubernetes pathType Prefix: element-wise on /-separated parts."""
    wanted = [p for p in prefix.split("/") if p]
    return [p for p in path.split("/") if p][: len(wanted)] == wanted


def test_the_ingress_is_off_by_default(default_docs: list[Doc]) -> None:
    components = {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in default_docs}
    assert "webhooks" not in components


def test_the_ingress_runs_matcher_ingress_with_probes_on_its_port(with_hooks: list[Doc]) -> None:
    deployment = ingress_deployment(with_hooks)
    c = container(deployment)
    assert [*c["command"], *c["args"]] == ["matcher", "ingress"]
    daemon = container(one(with_hooks, "Deployment", "daemon"))
    assert c["image"] == daemon["image"]
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert c[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    assert ingress_settings(with_hooks)["MATCHER_INGRESS_ADDRESS"] == "0.0.0.0:8080"


def test_the_ingress_settings_have_the_documented_defaults(hooks_docs: list[Doc]) -> None:
    settings = ingress_settings(hooks_docs)
    assert settings["MATCHER_INGRESS_MAX_CONCURRENCY"] == "64"
    assert settings["MATCHER_INGRESS_READ_TIMEOUT_S"] == "10"
    assert settings["MATCHER_INGRESS_DRAIN_TIMEOUT_S"] == "20"
    assert all(isinstance(v, str) for v in settings.values()), "ConfigMap values are strings"
    deployment = ingress_deployment(hooks_docs)
    assert deployment["spec"]["replicas"] == 2
    c = container(deployment)
    assert c["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "5"]}}
    # The preStop sleep (5) and the drain (20) both count against the grace period.
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 35
    assert c["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"createSecret": {"enabled": True, "databaseUrl": "postgresql://u:p@db/app"}},
    ],
    ids=["existing-secret", "dev-secret"],
)
def test_the_ingress_has_no_database_access(helm: str, extra: Doc, all_on_docs: list[Doc]) -> None:
    for docs in (render(helm, {**ON, **extra}), all_on_docs):
        deployment = ingress_deployment(docs)
        c = container(deployment)
        assert "MATCHER_DATABASE_URL" not in {v["name"] for v in c.get("env", [])}
        settings = ingress_settings(docs)
        assert not [k for k in settings if "DATABASE" in k or k.startswith("MATCHER_DB_")]
        # No reference at all to the database Secret, or to the dev Secret's database key.
        text = json.dumps([deployment, config_map(docs, "webhooks")])
        assert "matcher-database" not in text
        assert "database-url" not in text
        assert "MATCHER_DATABASE_URL" not in text
        # Nor to the admin token, which only the daemon's API takes.
        assert "MATCHER_ADMIN_TOKEN" not in text


def test_the_ingress_reads_kafka_and_the_registry_as_the_daemon_does(
    all_on_docs: list[Doc],
) -> None:
    settings = ingress_settings(all_on_docs)
    daemon = daemon_settings(all_on_docs)
    shared = [k for k in daemon if k.startswith("MATCHER_KAFKA_")]
    shared += ["MATCHER_EVENTS_TOPIC", "MATCHER_PRODUCERS_FILE", "MATCHER_ALLOW_UNSIGNED"]
    shared += ["MATCHER_LOG_LEVEL", "MATCHER_LOG_FORMAT"]
    assert "MATCHER_KAFKA_SSL_CERTFILE" in shared
    assert {k: settings[k] for k in shared} == {k: daemon[k] for k in shared}
    ingress = container(ingress_deployment(all_on_docs))
    daemon_container = container(one(all_on_docs, "Deployment", "daemon"))
    refs = secret_env(ingress)
    assert refs == {"MATCHER_KAFKA_SASL_PASSWORD": ("matcher-kafka", "sasl-password")}
    assert (
        refs["MATCHER_KAFKA_SASL_PASSWORD"]
        == (secret_env(daemon_container)["MATCHER_KAFKA_SASL_PASSWORD"])
    )
    # The same Secret files where the settings point, without the daemon's extra volumes.
    mounts = {m["name"]: m for m in ingress["volumeMounts"]}
    assert set(mounts) == {"tmp", "producers", "kafka-tls"}
    daemon_mounts = {m["name"]: m for m in daemon_container["volumeMounts"]}
    assert all(mounts[name] == daemon_mounts[name] for name in mounts)
    volumes = {v["name"]: v for v in pod_spec(ingress_deployment(all_on_docs))["volumes"]}
    daemon_volumes = {
        v["name"]: v for v in pod_spec(one(all_on_docs, "Deployment", "daemon"))["volumes"]
    }
    assert all(volumes[name] == daemon_volumes[name] for name in volumes)


def test_shared_config_reaches_the_ingress_and_its_own_config_wins(helm: str) -> None:
    docs = render(
        helm,
        {
            "config": {"MATCHER_SIGNATURE_TOLERANCE_S": 120, "MATCHER_MAX_EVENT_BYTES": 2000000},
            **on(config={"MATCHER_MAX_EVENT_BYTES": 65536, "MATCHER_INGRESS_MAX_CONNECTIONS": 9}),
        },
    )
    settings = ingress_settings(docs)
    assert settings["MATCHER_SIGNATURE_TOLERANCE_S"] == "120"
    assert settings["MATCHER_MAX_EVENT_BYTES"] == "65536"
    assert settings["MATCHER_INGRESS_MAX_CONNECTIONS"] == "9"
    assert daemon_settings(docs)["MATCHER_MAX_EVENT_BYTES"] == "2000000"
    assert "MATCHER_INGRESS_MAX_CONNECTIONS" not in daemon_settings(docs)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (on(config={"MATCHER_DATABASE_URL": "postgresql://x"}), "secrets do not belong"),
        (on(config={"MATCHER_INGRESS_ADDRESS": "0.0.0.0:1"}), "the chart sets this variable"),
        (
            {"config": {"MATCHER_INGRESS_MAX_CONCURRENCY": 3}, **ON},
            "config.MATCHER_INGRESS_MAX_CONCURRENCY: the chart sets this variable",
        ),
        (
            on(extraEnv=[{"name": "MATCHER_DATABASE_URL", "value": "postgresql://x"}]),
            "give it a role of its own with webhooks.database.existingSecret",
        ),
        (
            on(drainTimeoutSeconds=30, terminationGracePeriodSeconds=35),
            "webhooks.terminationGracePeriodSeconds (35) must be longer than"
            " webhooks.preStopSleepSeconds + webhooks.drainTimeoutSeconds (5 + 30)",
        ),
        (
            on(autoscaling={"enabled": True, "minReplicas": 5, "maxReplicas": 4}),
            "webhooks.autoscaling.minReplicas (5) must not exceed",
        ),
        (on(port=9464), "webhooks.port (9464) must differ from admin.port"),
        (on(ingress={"enabled": True}), "webhooks.ingress.hosts is required"),
        (on(maxConcurrency=0), "maxConcurrency"),
        (on(ingres={"enabled": True}), "ingres"),
    ],
    ids=[
        "secret-in-config",
        "shadowed-setting",
        "shared-config-shadows",
        "database-in-extra-env",
        "grace-too-short",
        "autoscaling-bounds",
        "port-clash",
        "ingress-without-hosts",
        "schema-minimum",
        "schema-unknown-key",
    ],
)
def test_bad_ingress_values_are_refused(helm: str, extra: Doc, message: str) -> None:
    assert message in render_error(helm, extra)


def test_the_grace_period_follows_prestop_and_drain(helm: str) -> None:
    docs = render(helm, on(preStopSleepSeconds=0, drainTimeoutSeconds=7.5))
    deployment = ingress_deployment(docs)
    assert "lifecycle" not in container(deployment), "no preStop hook when the sleep is 0"
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 18
    assert ingress_settings(docs)["MATCHER_INGRESS_DRAIN_TIMEOUT_S"] == "7.5"
    explicit = render(helm, on(terminationGracePeriodSeconds=26))
    assert pod_spec(ingress_deployment(explicit))["terminationGracePeriodSeconds"] == 26


def test_config_changes_roll_the_ingress_pods(helm: str, hooks_docs: list[Doc]) -> None:
    def checksum(docs: list[Doc]) -> str:
        template = ingress_deployment(docs)["spec"]["template"]
        return cast(str, template["metadata"]["annotations"]["checksum/config"])

    assert checksum(render(helm, on(maxConcurrency=8))) != checksum(hooks_docs)
    assert checksum(render(helm, ON)) == checksum(hooks_docs)


def test_the_service_targets_the_ingress_pods_only(with_hooks: list[Doc]) -> None:
    service = one(with_hooks, "Service", "webhooks")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    ingress_pods = ingress_deployment(with_hooks)["spec"]["template"]["metadata"]["labels"]
    daemon_pods = one(with_hooks, "Deployment", "daemon")["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert selector.items() <= ingress_pods.items()
    assert not selector.items() <= daemon_pods.items()
    assert ingress_deployment(with_hooks)["spec"]["selector"]["matchLabels"] == selector
    daemon_selector = one(with_hooks, "Service", "daemon")["spec"]["selector"]
    assert not daemon_selector.items() <= ingress_pods.items()


def test_the_ingress_has_its_own_service_account(helm: str, with_hooks: list[Doc]) -> None:
    account = one(with_hooks, "ServiceAccount", "webhooks")
    assert (
        pod_spec(ingress_deployment(with_hooks))["serviceAccountName"]
        == (account["metadata"]["name"])
    )
    assert account["automountServiceAccountToken"] is False
    assert "annotations" not in account["metadata"], "the daemon's cloud identity stays its own"
    docs = render(helm, {**ON, "serviceAccount": {"create": False, "name": "shared"}})
    assert pod_spec(ingress_deployment(docs))["serviceAccountName"] == "shared"
    assert of_kind(docs, "ServiceAccount") == []


def test_the_kubernetes_ingress_routes_only_the_webhook_path(all_on_docs: list[Doc]) -> None:
    ingress = one(all_on_docs, "Ingress", "webhooks")
    assert ingress["apiVersion"] == "networking.k8s.io/v1"
    service = one(all_on_docs, "Service", "webhooks")
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [
        {"secretName": "hooks-tls", "hosts": ["hooks.example.com", "hooks.example.org"]}
    ]
    assert [rule["host"] for rule in spec["rules"]] == ["hooks.example.com", "hooks.example.org"]
    paths = [p for rule in spec["rules"] for p in rule["http"]["paths"]]
    assert [p["path"] for p in paths] == [
        "/v1/webhooks/",
        "/v1/webhooks/github",
        "/v1/webhooks/stripe",
    ]
    for path in paths:
        assert path["pathType"] == "Prefix"
        assert path["backend"] == {
            "service": {"name": service["metadata"]["name"], "port": {"name": "http"}}
        }
        assert path["path"].startswith("/v1/webhooks/")
        for internal in ("/metrics", "/healthz", "/readyz", "/", "/v1/webhooksx"):
            assert not prefix_matches(path["path"], internal), (path["path"], internal)
    assert "defaultBackend" not in spec


def test_the_ingress_defaults_to_the_webhook_prefix_and_can_omit_the_host(helm: str) -> None:
    docs = render(helm, on(ingress={"enabled": True, "hosts": [{}]}))
    [rule] = one(docs, "Ingress", "webhooks")["spec"]["rules"]
    assert "host" not in rule
    assert [p["path"] for p in rule["http"]["paths"]] == ["/v1/webhooks/"]
    assert "ingressClassName" not in one(docs, "Ingress", "webhooks")["spec"]


@pytest.mark.parametrize(
    "path", ["/", "/metrics", "/healthz", "/v1/webhooksx", "/v1/webhooks/../metrics", "/v1/"]
)
def test_ingress_paths_outside_the_webhooks_are_refused(helm: str, path: str) -> None:
    hosts = [{"host": "hooks.example.com", "paths": [path]}]
    error = render_error(helm, on(ingress={"enabled": True, "hosts": hosts}))
    assert f'"{path}" is not under /v1/webhooks/' in error


def test_the_autoscaler_scales_the_ingress_on_cpu_and_owns_the_replicas(
    all_on_docs: list[Doc],
) -> None:
    hpa = one(all_on_docs, "HorizontalPodAutoscaler", "webhooks")
    deployment = ingress_deployment(all_on_docs)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 20)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 60},
            },
        }
    ]
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    # CPU utilisation is a share of the request: there must be one.
    assert container(deployment)["resources"]["requests"]["cpu"]


def test_no_autoscaler_or_ingress_unless_asked(hooks_docs: list[Doc]) -> None:
    assert of_kind(hooks_docs, "HorizontalPodAutoscaler") == []
    assert of_kind(hooks_docs, "Ingress") == []
    assert of_kind(hooks_docs, "ServiceMonitor") == [], "serviceMonitor.enabled is off"


@pytest.mark.parametrize(
    ("webhooks", "budget"),
    [
        ({"replicas": 1}, False),
        ({"replicas": 2}, True),
        ({"replicas": 1, "autoscaling": {"enabled": True}}, True),
        ({"replicas": 3, "podDisruptionBudget": {"enabled": False}}, False),
    ],
    ids=["one-pod", "two-pods", "autoscaled", "switched-off"],
)
def test_a_disruption_budget_when_there_can_be_more_than_one_pod(
    helm: str, webhooks: Doc, budget: bool
) -> None:
    docs = render(helm, on(**webhooks))
    pdbs = [
        d
        for d in of_kind(docs, "PodDisruptionBudget")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "webhooks"
    ]
    assert len(pdbs) == int(budget)
    if budget:
        assert pdbs[0]["spec"]["maxUnavailable"] == 1
        assert pdbs[0]["spec"]["selector"] == ingress_deployment(docs)["spec"]["selector"]


def test_the_service_monitor_scrapes_the_ingress_metrics(all_on_docs: list[Doc]) -> None:
    monitor = one(all_on_docs, "ServiceMonitor", "webhooks")
    service = one(all_on_docs, "Service", "webhooks")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    daemon_service = one(all_on_docs, "Service", "daemon")
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= (
        daemon_service["metadata"]["labels"].items()
    )
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint == {
        "port": "http",
        "path": "/metrics",
        "interval": "30s",
        "scrapeTimeout": "10s",
    }


def test_the_ingress_may_have_a_database_role_of_its_own(helm: str) -> None:
    """With webhooks.database.existingSecret the ingress records its refusals and serves
    callback URLs, with that Secret's role and never the daemon's; the Kubernetes Ingress
    then routes /v1/callbacks/ too."""
    docs = render(
        helm,
        on(
            database={"existingSecret": "matcher-ingress-db", "key": "uri"},
            ingress={"enabled": True, "hosts": [{"host": "hooks.example.com"}]},
        ),
    )
    env = secret_env(container(ingress_deployment(docs)))
    assert env["MATCHER_DATABASE_URL"] == ("matcher-ingress-db", "uri")
    daemon = secret_env(container(one(docs, "Deployment", "daemon")))
    assert daemon["MATCHER_DATABASE_URL"] != env["MATCHER_DATABASE_URL"]
    [rule] = one(docs, "Ingress", "webhooks")["spec"]["rules"]
    assert [p["path"] for p in rule["http"]["paths"]] == ["/v1/webhooks/", "/v1/callbacks/"]
    # Without it, callback paths stay refused.
    refused = on(ingress={"enabled": True, "hosts": [{"paths": ["/v1/callbacks/"]}]})
    assert "is not under /v1/webhooks/" in render_error(helm, refused)


def test_the_ingress_never_gets_the_daemons_database_secret(helm: str) -> None:
    daemons = render(helm, ON)
    (name, _key) = secret_env(container(one(daemons, "Deployment", "daemon")))[
        "MATCHER_DATABASE_URL"
    ]
    message = render_error(helm, on(database={"existingSecret": name}))
    assert "is the daemon's database Secret" in message

"""scripts/validate-manifests, which `make chart-check` runs on every rendered object: it
must refuse what the Kubernetes API would refuse, for built-in kinds and for the custom
resources the chart renders, and must not pass a kind it has no schema for.

kubeconform and the schemas come from scripts/install-kubeconform and
scripts/install-kubernetes-schemas (built once, then cached), so the first run needs Go and
the package registries, and nothing but the cache afterwards.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.tools.chart import ALL_ON_VALUES, DEFAULT_VALUES, ROOT, install, template

# The first run builds kubeconform and the schemas (bounded in the fixture).
pytestmark = pytest.mark.timeout(1500)

VALIDATE = ROOT / "scripts" / "validate-manifests"

Doc = dict[str, Any]


@pytest.fixture(scope="session")
def validator() -> None:
    """Builds both once, so that each test's own run is quick."""
    install("install-kubeconform")
    install("install-kubernetes-schemas")


def validate(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(text)
    return subprocess.run(
        [str(VALIDATE), str(manifest)], capture_output=True, text=True, check=False, timeout=120
    )


def deployment(**spec_changes: Any) -> Doc:
    doc: Doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "web:1"}]},
            },
        },
    }
    doc["spec"].update(spec_changes)
    return doc


def service_monitor(endpoint: Doc) -> Doc:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "endpoints": [endpoint]},
    }


def dump(*docs: Doc) -> str:
    return yaml.safe_dump_all(docs)


@pytest.mark.usefixtures("validator")
@pytest.mark.parametrize("values", [DEFAULT_VALUES, ALL_ON_VALUES], ids=["default", "all-on"])
def test_every_object_the_chart_renders_is_valid_and_none_is_skipped(
    helm: str, tmp_path: Path, values: Path
) -> None:
    rendered = template(helm, values, None)
    assert rendered.returncode == 0, rendered.stderr
    result = validate(tmp_path, rendered.stdout)
    assert result.returncode == 0, result.stderr
    assert "Invalid: 0, Errors: 0, Skipped: 0" in result.stderr, result.stderr


@pytest.mark.usefixtures("validator")
def test_a_valid_object_passes(tmp_path: Path) -> None:
    result = validate(tmp_path, dump(deployment()))
    assert result.returncode == 0, result.stderr
    assert "Valid: 1," in result.stderr


@pytest.mark.usefixtures("validator")
@pytest.mark.parametrize(
    ("doc", "complaint"),
    [
        (deployment(replicas="two"), "/spec/replicas"),
        (deployment(paused="yes", minReadySeconds=-1.5), "/spec/paused"),
        (deployment(replica=2), "additional properties 'replica' not allowed"),
        (service_monitor({"port": "http", "pth": "/metrics"}), "'pth' not allowed"),
        (service_monitor({"port": 8080}), "/spec/endpoints/0/port"),
    ],
    ids=["wrong-type", "wrong-types", "unknown-field", "crd-unknown-field", "crd-wrong-type"],
)
def test_an_invalid_object_fails(tmp_path: Path, doc: Doc, complaint: str) -> None:
    result = validate(tmp_path, dump(deployment(), doc))
    assert result.returncode != 0, result.stderr
    assert complaint in result.stderr
    assert "Invalid: 1," in result.stderr


@pytest.mark.usefixtures("validator")
def test_a_kind_without_a_schema_fails_rather_than_being_skipped(tmp_path: Path) -> None:
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    result = validate(tmp_path, dump(unknown))
    assert result.returncode != 0, result.stderr
    assert "could not find schema for Widget" in result.stderr


@pytest.mark.usefixtures("validator")
def test_chart_values_that_render_an_invalid_object_are_caught(helm: str, tmp_path: Path) -> None:
    """What helm lint and the values schema let through (extraEnv is free-form) but the
    API server would refuse: a container env entry with a misspelt field."""
    rendered = template(helm, DEFAULT_VALUES, {"extraEnv": [{"name": "TZ", "valeu": "UTC"}]})
    assert rendered.returncode == 0, rendered.stderr
    result = validate(tmp_path, rendered.stdout)
    assert result.returncode != 0, result.stderr
    assert "additional properties 'valeu' not allowed" in result.stderr


# The conversion of CustomResourceDefinitions (scripts/kubernetes_schemas.py).


def _converter() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "kubernetes_schemas", ROOT / "scripts" / "kubernetes_schemas.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_crd_conversion_closes_objects_but_not_open_ones(tmp_path: Path) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        # A property named like a keyword is still a property.
                                        "properties": {"type": "string", "nullable": True},
                                        "free": {
                                            "type": "object",
                                            "properties": {"a": {"type": "string"}},
                                            "x-kubernetes-preserve-unknown-fields": True,
                                        },
                                        "items": {
                                            "type": "array",
                                            "items": {
                                                "type": "object",
                                                "properties": {"b": {"type": "string"}},
                                            },
                                        },
                                    },
                                }
                            },
                        }
                    },
                },
                {"name": "v0", "served": False, "schema": {"openAPIV3Schema": {}}},
            ],
        },
    }
    crds = tmp_path / "crds"
    crds.mkdir()
    (crds / "widgets.yaml").write_text(yaml.safe_dump(crd))
    out = tmp_path / "out"
    out.mkdir()
    assert _converter().custom_resources(crds, out) == ["example.com/v1 Widget"]
    [written] = out.iterdir()
    assert written.name == "widget-example-v1.json"
    schema = yaml.safe_load(written.read_text())
    assert schema["additionalProperties"] is False
    assert schema["properties"]["apiVersion"]["enum"] == ["example.com/v1"]
    assert schema["properties"]["kind"]["enum"] == ["Widget"]
    assert schema["properties"]["metadata"]["$ref"].endswith("meta.v1.ObjectMeta")
    spec = schema["properties"]["spec"]
    assert spec["additionalProperties"] is False
    assert spec["properties"]["properties"]["type"] == ["string", "null"]
    assert "additionalProperties" not in spec["properties"]["free"]
    assert spec["properties"]["items"]["items"]["additionalProperties"] is False

"""What the tests of the chart and of the rendered objects share: where things are, how the
pinned tools are built, how the chart is rendered, and how objects are picked from a
render (by kind, and by the app.kubernetes.io/component label: daemon, webhooks, migrate)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

ROOT = Path(__file__).parents[2]
CHART = ROOT / "helm" / "matcher"
OPS = ROOT / "ops"
DEFAULT_VALUES = CHART / "ci" / "default-values.yaml"
ALL_ON_VALUES = CHART / "ci" / "all-on-values.yaml"

Doc = dict[str, Any]


def install(script: str) -> str:
    """Run scripts/<script> (an install-* script) and return the path it prints. The first
    run on a machine builds the tool from source: up to 20 minutes."""
    built = subprocess.run(
        [str(ROOT / "scripts" / script)],
        capture_output=True, text=True, check=False, timeout=1200,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(f"{script} failed: {built.stderr.strip()}", pytrace=False)
    return built.stdout.strip()


def template(
    helm: str, values_file: Path, extra: dict[str, Any] | None
) -> subprocess.CompletedProcess[str]:
    """`helm template` with a values file; extra values go in on stdin as a second values
    file, layered over the first."""
    return subprocess.run(
        [helm, "template", "matcher", str(CHART), "--namespace", "apps",
         "-f", str(values_file), "-f", "-"],
        input=yaml.safe_dump(extra or {}), capture_output=True, text=True, check=False,
        timeout=120,
    )  # fmt: skip


def render(helm: str, extra: Doc | None = None, *, base: Path = DEFAULT_VALUES) -> list[Doc]:
    result = template(helm, base, extra)
    assert result.returncode == 0, result.stderr
    docs = [cast(Doc, d) for d in yaml.safe_load_all(result.stdout) if d is not None]
    assert docs, "helm template rendered nothing"
    return docs


def render_error(helm: str, extra: Doc, *, base: Path = DEFAULT_VALUES) -> str:
    result = template(helm, base, extra)
    assert result.returncode != 0, f"rendering should have failed with {extra}"
    return result.stderr


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str, component: str | None = None) -> Doc:
    found = [
        d
        for d in of_kind(docs, kind)
        if component is None
        or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"expected one {kind} ({component}), found {len(found)}"
    return found[0]


def config_map(docs: list[Doc], component: str = "daemon") -> Doc:
    """The settings ConfigMap of the daemon (no component label) or of the webhooks."""
    found = [
        d
        for d in of_kind(docs, "ConfigMap")
        if "matcher-dashboard.json" not in d["data"]
        and d["metadata"]["labels"].get("app.kubernetes.io/component", "daemon") == component
    ]
    assert len(found) == 1
    return found[0]


def pod_spec(workload: Doc) -> Doc:
    return cast(Doc, workload["spec"]["template"]["spec"])


def container(workload: Doc) -> Doc:
    containers = cast(list[Doc], pod_spec(workload)["containers"])
    assert len(containers) == 1
    return containers[0]


def secret_env(c: Doc) -> dict[str, tuple[str, str]]:
    """Env vars taken from Secrets: name -> (secret name, key)."""
    refs: dict[str, tuple[str, str]] = {}
    for var in c.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            refs[var["name"]] = (ref["name"], ref["key"])
    return refs


def daemon_settings(docs: list[Doc]) -> dict[str, str]:
    """The daemon's non-secret settings: its ConfigMap's data, checked to be wired in."""
    deployment = one(docs, "Deployment", "daemon")
    cm = config_map(docs)
    env_from = container(deployment)["envFrom"]
    assert {"configMapRef": {"name": cm["metadata"]["name"]}} in env_from
    return cast(dict[str, str], cm["data"])

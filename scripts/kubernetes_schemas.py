"""Lay out Kubernetes JSON schemas the way kubeconform's -schema-location reads them:
<out>/<kind>-<group>-<version>.json. Run by scripts/install-kubernetes-schemas, which fetches
the inputs; standard library and PyYAML only.

Built-in kinds come from a kubernetes-validate wheel (its "-local-strict" set for one
Kubernetes version). Those schemas point into a shared _definitions.json through an
absolute "$id" (https://kubernetes.io/api/...) that kubeconform would try to fetch: the
"$id"s are dropped and the references made relative, so they resolve to the file next door.

Custom resources come from CustomResourceDefinition YAML files. Each served version's
openAPIV3Schema becomes a schema, made strict the way kubeconform's openapi2jsonschema
makes CRDs strict (an object that lists its properties allows no others, unless it says
x-kubernetes-preserve-unknown-fields), with apiVersion and kind pinned, metadata checked as
an ObjectMeta (the CRD leaves it open: the API server checks it), and "nullable" turned
into JSON Schema's "null" type.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

WHEEL_DIR = "kubernetes_validate/kubernetes-json-schema/{version}-local-strict/"
ABSOLUTE_DEFINITIONS = "/api/_definitions.json#"
OBJECT_META = "_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


class _Loader(yaml.SafeLoader):
    """YAML 1.1 without its "value" tag: a plain = in an enum is the string "="."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:value"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _relative_refs(node: Any) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(ABSOLUTE_DEFINITIONS):
            node["$ref"] = ref.removeprefix("/api/")
        for value in node.values():
            _relative_refs(value)
    elif isinstance(node, list):
        for value in node:
            _relative_refs(value)


def built_in(wheel: Path, version: str, out: Path) -> int:
    prefix = WHEEL_DIR.format(version=version)
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not name.startswith(prefix) or not name.endswith(".json"):
                continue
            schema = json.loads(archive.read(name))
            schema.pop("$id", None)
            _relative_refs(schema)
            (out / name.removeprefix(prefix)).write_text(json.dumps(schema))
            count += 1
    if count == 0 or not (out / "_definitions.json").exists():
        sys.exit(f"{wheel.name} has no schemas for Kubernetes {version} ({prefix})")
    return count


def _strict(schema: Any) -> None:
    """Walk a schema by its keywords (never a properties map as if it were a schema)."""
    if not isinstance(schema, dict):
        return
    if schema.get("nullable") is True and isinstance(schema.get("type"), str):
        schema["type"] = [schema["type"], "null"]
    properties = schema.get("properties")
    if (
        isinstance(properties, dict)
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema["additionalProperties"] = False
    for sub in (properties or {}).values():
        _strict(sub)
    for keyword in ("items", "additionalProperties", "not"):
        items = schema.get(keyword)
        for sub in items if isinstance(items, list) else [items]:
            _strict(sub)
    for keyword in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(keyword, []):
            _strict(sub)


def _crd_schema(group: str, kind: str, version: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    _strict(schema)
    properties = schema.setdefault("properties", {})
    properties["apiVersion"] = {"type": "string", "enum": [f"{group}/{version['name']}"]}
    properties["kind"] = {"type": "string", "enum": [kind]}
    properties["metadata"] = {"$ref": OBJECT_META}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind"})
    return schema


def custom_resources(directory: Path, out: Path) -> list[str]:
    written: list[str] = []
    files = sorted(directory.glob("*.yaml"))
    if not files:
        sys.exit(f"no CustomResourceDefinition files in {directory}")
    for path in files:
        for crd in yaml.load_all(path.read_text(), Loader=_Loader):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group = crd["spec"]["group"]
            kind = crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if not version.get("served", True) or "schema" not in version:
                    continue
                name = f"{kind.lower()}-{group.split('.')[0]}-{version['name']}.json"
                (out / name).write_text(json.dumps(_crd_schema(group, kind, version)))
                written.append(f"{group}/{version['name']} {kind}")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--kubernetes-version", required=True, help="e.g. v1.34.0")
    parser.add_argument("--crds", type=Path, action="append", default=[])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True)
    count = built_in(args.wheel, args.kubernetes_version, args.out)
    print(f"{count} built-in schemas for Kubernetes {args.kubernetes_version}")
    for directory in args.crds:
        print(f"custom resources: {', '.join(custom_resources(directory, args.out))}")


if __name__ == "__main__":
    main()

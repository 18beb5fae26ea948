#!/usr/bin/env python3
"""JSON Schemas from the pinned agent-sandbox CRDs, and the offline check of deploy/agent-sandbox.

    scripts/agent_sandbox_schemas.py generate   # rewrite deploy/agent-sandbox/schemas/*.json
    scripts/agent_sandbox_schemas.py check      # schemas fresh + every manifest valid (CI)

The CRDs in ``deploy/agent-sandbox/crds/`` are copies of kubernetes-sigs/agent-sandbox's
(see ``crds/SOURCE.md``). For each, the storage version's ``openAPIV3Schema`` becomes a JSON
Schema (draft 2020-12): ``apiVersion`` and ``kind`` pinned, ``metadata`` a strict subset of
ObjectMeta, every object that lists ``properties`` (and neither ``additionalProperties`` nor
``x-kubernetes-preserve-unknown-fields``) closed with ``additionalProperties: false`` as the
API server's structural pruning would drop the unknown member (so a misspelt field such as
``templateRef`` fails here instead of vanishing silently in the cluster),
``x-kubernetes-int-or-string`` as integer-or-string, ``nullable`` as a null type;
descriptions are dropped. The schemas are committed: nothing is fetched at check time.

``check`` validates every manifest under ``deploy/agent-sandbox/`` (except ``crds/`` and
``schemas/``): agent-sandbox kinds with ``jsonschema`` against the generated schemas, core
Kubernetes kinds with ``kubernetes-validate`` (strict, its newest bundled Kubernetes).
Exit 1 with one line per problem.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "deploy" / "agent-sandbox"
CRDS = KIT / "crds"
SCHEMAS = KIT / "schemas"

#: A strict subset of ObjectMeta: what a manifest one writes by hand may carry.
OBJECT_META: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 253},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}


def _convert(node: Any) -> Any:
    if isinstance(node, list):
        return [_convert(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description" or key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: _convert(sub) for name, sub in value.items()}
        else:
            out[key] = _convert(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    open_object = node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node
    if "properties" in node and not open_object:
        out["additionalProperties"] = False
    return out


def schema_for(crd: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(file name, JSON Schema) of the CRD's storage version."""
    spec = crd["spec"]
    (version,) = [v for v in spec["versions"] if v.get("storage")]
    kind = spec["names"]["kind"]
    api_version = f"{spec['group']}/{version['name']}"
    schema = _convert(version["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["properties"]["metadata"] = OBJECT_META
    schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind", "metadata"})
    schema["additionalProperties"] = False
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"acp-serve/agent-sandbox/{kind}.{version['name']}",
        "title": f"{kind} ({api_version}), generated from {crd['metadata']['name']}",
        **schema,
    }
    return f"{kind.lower()}.{version['name']}.json", document


def _render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def generated() -> dict[str, str]:
    """File name → text of every schema, from the pinned CRDs."""
    out: dict[str, str] = {}
    for path in sorted(CRDS.glob("*.yaml")):
        name, document = schema_for(yaml.safe_load(path.read_text()))
        out[name] = _render(document)
    return out


def load_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → the committed schema."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(SCHEMAS.glob("*.json")):
        schema = json.loads(path.read_text())
        props = schema["properties"]
        out[(props["apiVersion"]["const"], props["kind"]["const"])] = schema
    return out


def manifest_files() -> list[Path]:
    return sorted(
        p
        for p in KIT.rglob("*.yaml")
        if not p.is_relative_to(CRDS) and not p.is_relative_to(SCHEMAS)
    )


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def problems(doc: dict[str, Any], schemas: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """Every reason ``doc`` is invalid (empty when it is valid)."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    schema = schemas.get(key)
    if schema is not None:
        import jsonschema  # lazy: only the check needs it

        validator = jsonschema.Draft202012Validator(schema)
        return [
            f"{'/'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
            for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        ]
    if "." in key[0].split("/")[0] and not key[0].endswith(".k8s.io"):
        return [f"no schema for {key[0]} {key[1]}"]
    import kubernetes_validate  # lazy: only the check needs it

    try:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [str(exc)]
    return []


def check() -> Iterator[str]:
    fresh = generated()
    committed = {p.name: p.read_text() for p in SCHEMAS.glob("*.json")}
    if fresh != committed:
        yield "deploy/agent-sandbox/schemas/ is stale: run agent_sandbox_schemas.py generate"
    schemas = load_schemas()
    for path in manifest_files():
        docs = documents(path)
        if not docs:
            yield f"{path.relative_to(ROOT)}: no resource"
        for doc in docs:
            for problem in problems(doc, schemas):
                yield f"{path.relative_to(ROOT)}: {doc.get('kind')}: {problem}"


def main(argv: list[str]) -> int:
    if argv == ["generate"]:
        SCHEMAS.mkdir(exist_ok=True)
        for old in SCHEMAS.glob("*.json"):
            old.unlink()
        for name, text in generated().items():
            (SCHEMAS / name).write_text(text)
            print(f"wrote {(SCHEMAS / name).relative_to(ROOT)}")
        return 0
    if argv == ["check"]:
        found = list(check())
        for line in found:
            print(line, file=sys.stderr)
        if not found:
            print(f"agent-sandbox manifests: {len(manifest_files())} files valid")
        return 1 if found else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

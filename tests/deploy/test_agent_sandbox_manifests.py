"""deploy/agent-sandbox: valid against the pinned agent-sandbox CRDs, offline, and runnable.

* the committed JSON Schemas are what ``scripts/agent_sandbox_schemas.py generate`` makes
  from the pinned CRDs (so nobody edits a schema by hand);
* every manifest validates (agent-sandbox kinds with ``jsonschema`` against those schemas,
  core kinds with ``kubernetes-validate``), and the class of mistake the structural CRD
  would silently prune fails: ``templateRef`` (agent-sandbox's OpenHands example) instead
  of ``sandboxTemplateRef``, ``podTemplate.spec.containers[].ports[].port``, a claim
  without ``warmPoolRef``, a wrong ``apiVersion``;
* the kit's invariants: the router's port, probes on ``/health`` and ``/readyz`` without a
  token, the token header, the bootstrap token from a Secret, one volume for ``/state`` and
  ``/workspace``, the pool names the template, the claim names the pool and carries no env
  or volumes (which would bypass the warm pool);
* the template's command line is accepted by the daemon's parser, and a real daemon
  started with it (on 127.0.0.1) serves the probes and the bind only.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("jsonschema", reason="pip install jsonschema")
pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")

from serve.settings import parse_settings
from tests.support.daemon import spawn_daemon

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "agent_sandbox_schemas", ROOT / "scripts" / "agent_sandbox_schemas.py"
)
assert _spec is not None and _spec.loader is not None
kit = importlib.util.module_from_spec(_spec)
sys.modules["agent_sandbox_schemas"] = kit
_spec.loader.exec_module(kit)

SCHEMAS = kit.load_schemas()


def _one(name: str) -> dict[str, Any]:
    (doc,) = kit.documents(kit.KIT / name)
    assert isinstance(doc, dict)
    return doc


def _container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["podTemplate"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_the_schemas_are_generated_from_the_pinned_crds() -> None:
    committed = {p.name: p.read_text() for p in kit.SCHEMAS.glob("*.json")}
    assert committed == kit.generated()
    assert set(SCHEMAS) == {
        ("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate"),
        ("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool"),
        ("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim"),
    }
    assert (kit.CRDS / "SOURCE.md").is_file()


@pytest.mark.parametrize("path", kit.manifest_files(), ids=lambda p: p.name)
def test_every_manifest_is_valid(path: Path) -> None:
    docs = kit.documents(path)
    assert docs
    for doc in docs:
        assert kit.problems(doc, SCHEMAS) == []
        assert "namespace" not in doc["metadata"], "manifests are namespace-agnostic"


def _mutated(name: str, change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(_one(name))
    change(doc)
    return doc


def _rename_template_ref(doc: dict[str, Any]) -> None:
    doc["spec"]["templateRef"] = doc["spec"].pop("sandboxTemplateRef")


def _add_template_ref(doc: dict[str, Any]) -> None:
    doc["spec"]["templateRef"] = {"name": "acp-serve"}


def _claim_template_ref(doc: dict[str, Any]) -> None:
    # The v1alpha1 claim's field (replaced by warmPoolRef in v1beta1), which OpenHands'
    # agent-sandbox example still writes.
    doc["spec"]["templateRef"] = {"name": "acp-serve"}
    del doc["spec"]["warmPoolRef"]


def _port_typo(doc: dict[str, Any]) -> None:
    _container(doc)["ports"][0]["port"] = 8888


def _no_pool(doc: dict[str, Any]) -> None:
    del doc["spec"]["warmPoolRef"]


def _old_group(doc: dict[str, Any]) -> None:
    doc["apiVersion"] = "agents.x-k8s.io/v1beta1"


def _bad_mode(doc: dict[str, Any]) -> None:
    doc["spec"]["lifecycle"]["shutdownPolicy"] = "Suspend"


@pytest.mark.parametrize(
    ("name", "change", "expected"),
    [
        ("sandboxwarmpool.yaml", _rename_template_ref, "templateRef"),
        ("sandboxwarmpool.yaml", _add_template_ref, "templateRef"),
        ("examples/sandboxclaim.example.yaml", _claim_template_ref, "templateRef"),
        ("sandboxtemplate.yaml", _port_typo, "port"),
        ("examples/sandboxclaim.example.yaml", _no_pool, "warmPoolRef"),
        ("examples/sandboxclaim.example.yaml", _old_group, "no schema"),
        ("examples/sandboxclaim.example.yaml", _bad_mode, "Suspend"),
    ],
    ids=[
        "templateRef-renamed",
        "templateRef-added",
        "claim-templateRef",
        "port-typo",
        "no-pool",
        "group",
        "enum",
    ],
)
def test_a_wrong_field_fails_the_check(name: str, change: Any, expected: str) -> None:
    found = kit.problems(_mutated(name, change), SCHEMAS)
    assert found, "the mistake passed the check"
    assert any(expected in problem for problem in found), found


def test_the_check_script_fails_on_a_bad_manifest(tmp_path: Path, monkeypatch: Any) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: extensions.agents.x-k8s.io/v1beta1\nkind: SandboxWarmPool\n"
        "metadata: {name: x}\nspec: {templateRef: {name: acp-serve}}\n"
    )
    monkeypatch.setattr(kit, "manifest_files", lambda: [bad])
    monkeypatch.setattr(kit, "ROOT", tmp_path)
    assert kit.main(["check"]) == 1


def test_the_kit_fits_the_router_and_late_binding() -> None:
    template = _one("sandboxtemplate.yaml")
    pool = _one("sandboxwarmpool.yaml")
    claim = _one("examples/sandboxclaim.example.yaml")
    secret = _one("examples/bootstrap-secret.example.yaml")
    container = _container(template)
    args = container["command"][1:]
    assert container["command"][0] == "acp-serve"
    # The router's default port (8888) on the sandbox's headless Service, and the header
    # that survives it.
    assert template["spec"]["service"] is True
    assert args[args.index("--port") + 1] == "8888"
    assert container["ports"][0]["containerPort"] == 8888
    assert args[args.index("--token-header") + 1] == "X-Acp-Serve-Token"
    assert {"--public-probes", "--require-auth"} <= set(args)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    (boot,) = [e for e in container["env"] if e["name"] == "ACP_SERVE_BOOTSTRAP_TOKEN"]
    assert boot["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert not [e for e in container["env"] if e["name"] == "QWEN_SERVER_TOKEN"]
    # One volume from the sandbox's claim template for both /state and /workspace.
    (volume,) = template["spec"]["volumeClaimTemplates"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/state"]["name"] == mounts["/workspace"]["name"] == volume["metadata"]["name"]
    assert pool["spec"]["sandboxTemplateRef"]["name"] == template["metadata"]["name"]
    assert claim["spec"]["warmPoolRef"]["name"] == pool["metadata"]["name"]
    # Anything that would make the claim cold stays out of it.
    assert "env" not in claim["spec"] and "volumeClaimTemplates" not in claim["spec"]
    grace = template["spec"]["podTemplate"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > 5 + int(args[args.index("--drain-timeout-ms") + 1]) / 1000 + 5


def test_a_daemon_started_like_the_template(tmp_path: Path) -> None:
    args = _container(_one("sandboxtemplate.yaml"))["command"][1:]
    # The parser accepts the command line as it is (paths swapped for the test's).
    swapped = [str(tmp_path) if a in ("/workspace", "/state") else a for a in args]
    settings = parse_settings(swapped, {"ACP_SERVE_BOOTSTRAP_TOKEN": "b" * 32, "HOME": "/x"})
    assert settings.bootstrap and settings.token_header == "x-acp-serve-token"
    # A real daemon with those flags, on 127.0.0.1 and port 0 as tests must.
    flags: list[str] = []
    skip = {"--hostname", "--port", "--workspace", "--state-dir"}
    it = iter(args)
    for a in it:
        if a in skip:
            next(it)
        else:
            flags.append(a)
    d = spawn_daemon(flags, env={"ACP_SERVE_BOOTSTRAP_TOKEN": "b" * 32})
    try:
        with httpx.Client(base_url=d.url, timeout=30) as http:
            assert http.get("/health").status_code == 200
            assert http.get("/readyz").status_code == 200
            boot = {"X-Acp-Serve-Token": "b" * 32}
            assert http.get("/capabilities", headers=boot).status_code == 403
            bound = http.post("/daemon/bind", json={"token": "t" * 32}, headers=boot)
            assert bound.status_code == 200, bound.text
            assert (
                http.get("/capabilities", headers={"X-Acp-Serve-Token": "t" * 32}).status_code
                == 200
            )
    finally:
        d.stop()

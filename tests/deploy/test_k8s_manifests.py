"""The Kubernetes manifests in deploy/k8s: valid, consistent, and the daemon runs with them.

* every manifest validates against the Kubernetes OpenAPI schemas shipped offline by
  ``kubernetes-validate`` (strict: unknown fields fail), for the oldest and newest
  Kubernetes versions we claim;
* the kustomizations list files that exist; rendered with ``kubectl kustomize`` when
  kubectl is installed (the overlay renames everything and swaps the token Secret);
* the Deployment is one-workspace-per-pod (1 replica, Recreate), non-root with a read-only
  root file system and no capabilities, gets its token from a Secret, keeps ``/state`` on
  a PVC, probes ``/health`` and ``/readyz``, and its grace period covers preStop + drain;
* the container's command line is accepted by the daemon's own parser, and a real daemon
  started with those flags (on 127.0.0.1, as tests must) answers the probes without a
  token while the API still needs it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install kubernetes-validate"
)

from serve.runtime.daemon import SHUTDOWN_FORCE_S  # noqa: E402
from serve.settings import parse_settings  # noqa: E402
from tests.support.daemon import spawn_daemon  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
#: Oldest and newest Kubernetes minor versions the manifests are checked against.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
TOKEN = "k8s-token-0123456789abcdef"


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _base() -> dict[str, dict[str, Any]]:
    """The base resources by kind (PVCs by name)."""
    out: dict[str, dict[str, Any]] = {}
    for path in (K8S / "base").glob("*.yaml"):
        if path.name == "kustomization.yaml":
            continue
        for doc in _docs(path):
            key = doc["kind"] if doc["kind"] != "PersistentVolumeClaim" else doc["metadata"]["name"]
            out[key] = doc
    return out


def _container() -> dict[str, Any]:
    (container,) = _base()["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def _command_args() -> list[str]:
    command = _container()["command"]
    assert command[0] == "acp-serve"
    return list(command[1:])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_is_valid_kubernetes(path: Path, version: str) -> None:
    docs = _docs(path)
    assert docs, f"{path} holds no resource"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
        assert "namespace" not in doc["metadata"], "manifests are namespace-agnostic"


def test_kustomizations_list_existing_files() -> None:
    kustomizations = sorted(K8S.rglob("kustomization.yaml"))
    assert {p.parent.relative_to(K8S).as_posix() for p in kustomizations} >= {
        ".",
        "base",
        "overlays/workspace-alpha",
    }
    for path in kustomizations:
        spec = yaml.safe_load(path.read_text())
        assert spec["kind"] == "Kustomization"
        for resource in spec["resources"]:
            assert (path.parent / resource).exists(), f"{path}: {resource} is missing"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("target", [".", "overlays/workspace-alpha", "overlays/delegated-cgroups"])
def test_kustomize_renders_valid_resources(target: str) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "PersistentVolumeClaim"}
    for doc in docs:
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
    if target == "overlays/delegated-cgroups":
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        template = deployment["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        assert annotations["io.kubernetes.cri-o.cgroup2-mount-hierarchy-rw"] == "true"
        command = template["spec"]["containers"][0]["command"]
        args = list(command[1:])
        args[args.index("/workspace")] = str(ROOT)
        settings = parse_settings(args, {"QWEN_SERVER_TOKEN": TOKEN})
        assert settings.agent_limits == "cgroup"  # refuses to start undelegated
        return
    if target != ".":
        names = {d["metadata"]["name"] for d in docs}
        assert names == {
            "acp-serve-alpha",
            "acp-serve-state-alpha",
            "acp-serve-workspace-alpha",
        }
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"][0]
        assert env["valueFrom"]["secretKeyRef"]["name"] == "acp-serve-token-alpha"
        service = next(d for d in docs if d["kind"] == "Service")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert pod_labels["acp-serve/workspace"] == "alpha"


def test_deployment_is_one_workspace_per_pod() -> None:
    spec = _base()["Deployment"]["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"
    args = _command_args()
    assert args[args.index("--workspace") + 1] == "/workspace"
    assert args.count("--workspace") == 1
    assert args[args.index("--state-dir") + 1] == "/state"
    assert args[args.index("--hostname") + 1] == "0.0.0.0"
    assert args[args.index("--port") + 1] == "4170"


def test_pod_runs_unprivileged_on_a_read_only_root() -> None:
    pod = _base()["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    ctx = _container()["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert "add" not in ctx["capabilities"]
    # Everything the daemon and its agents write is a mounted volume.
    mounts = {m["mountPath"] for m in _container()["volumeMounts"]}
    assert mounts == {"/state", "/workspace", "/tmp"}
    env = {e["name"]: e.get("value") for e in _container()["env"]}
    assert env["HOME"].startswith("/state/")


def test_token_comes_from_a_secret_and_state_from_a_pvc() -> None:
    base = _base()
    env = {e["name"]: e for e in _container()["env"]}
    ref = env["QWEN_SERVER_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "acp-serve-token", "key": "token"}
    (secret,) = _docs(K8S / "examples" / "secret.example.yaml")
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == ref["name"]
    assert ref["key"] in secret["stringData"]
    volumes = {v["name"]: v for v in base["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    claims = {m["mountPath"]: volumes[m["name"]] for m in _container()["volumeMounts"]}
    state_claim = claims["/state"]["persistentVolumeClaim"]["claimName"]
    assert base[state_claim]["kind"] == "PersistentVolumeClaim"
    assert base[state_claim]["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_service_selects_the_pod_and_port() -> None:
    base = _base()
    service, deployment = base["Service"], base["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in port_names
    assert port_names[port["targetPort"]] == 4170


def test_probes_and_grace_period_cover_the_drain(tmp_path: Path) -> None:
    container = _container()
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    pre_stop_s = float(pre_stop[1])
    # The daemon's own parser accepts the flags (workspace and state dir made real here).
    args = _command_args()
    args[args.index("/workspace")] = str(tmp_path)
    args[args.index("/state")] = str(tmp_path / "state")
    settings = parse_settings(args, {"QWEN_SERVER_TOKEN": TOKEN, "HOME": str(tmp_path)})
    assert settings.require_auth and settings.public_probes
    drain_s = settings.drain_timeout_ms / 1000
    grace = _base()["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > pre_stop_s + drain_s + SHUTDOWN_FORCE_S


def test_daemon_with_the_manifest_flags_serves_probes_without_token() -> None:
    args = _command_args()
    for flag in ("--hostname", "--port", "--workspace", "--state-dir"):
        i = args.index(flag)
        del args[i : i + 2]  # spawn_daemon binds 127.0.0.1:0 with its own dirs
    d = spawn_daemon(["--hostname", "127.0.0.1", *args], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        with httpx.Client(base_url=d.url, timeout=30) as anonymous:
            assert anonymous.get("/health").json() == {"status": "ok"}
            ready = anonymous.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert anonymous.get("/capabilities").status_code == 401
            assert anonymous.get("/health", params={"deep": "1"}).status_code == 401
        with httpx.Client(
            base_url=d.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as api:
            assert api.get("/capabilities").status_code == 200
    finally:
        assert d.stop() == 0


def test_resources_shown_in_the_docs_are_valid() -> None:
    """Complete resources in docs/kubernetes.md's YAML blocks validate too."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    resources = [
        doc
        for block in blocks
        for doc in yaml.safe_load_all(block)
        if isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc
    ]
    assert {r["kind"] for r in resources} >= {"NetworkPolicy"}
    for resource in resources:
        kubernetes_validate.validate(resource, VERSIONS[-1], strict=True)


def test_the_daemon_is_the_containers_pid_1() -> None:
    """No init wrapper (tini) and no shell: the container's command is acp-serve itself, in a
    PID namespace of its own, so the daemon is PID 1 and reaps every orphaned descendant."""
    pod = _base()["Deployment"]["spec"]["template"]["spec"]
    assert not pod.get("shareProcessNamespace", False)
    command = _container()["command"]
    assert command[0] == "acp-serve"
    assert not {"tini", "dumb-init", "sh", "bash", "/bin/sh"} & set(command)
    assert "args" not in _container()


def test_agents_stay_below_the_containers_memory_limit() -> None:
    """The base runs the agents' limits in auto mode with a headroom that leaves the daemon
    room below limits.memory (the ceiling: the limit minus the headroom)."""
    container = _container()
    args = _command_args()
    args[args.index("/workspace")] = str(ROOT)
    settings = parse_settings(args, {"QWEN_SERVER_TOKEN": TOKEN})
    assert settings.agent_limits == "auto"
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Gi")
    limit_mb = int(limit[:-2]) * 1024
    assert 0 < settings.agent_memory_headroom_mb < limit_mb // 2

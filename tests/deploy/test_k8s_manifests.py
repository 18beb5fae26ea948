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
  token while the API still needs it;
* every rendered kit is safe to scale (:func:`_replica_problems`): more than one replica
  only with ``--journal-url`` from a Secret, the advertise URL on the pod IP, the workspace
  and ``--shared-dir`` on ReadWriteMany claims, no ReadWriteOnce claim shared by replicas,
  each daemon's ``--state-dir`` its own; the checker itself refuses each unsafe variant;
* ``overlays/replicas-postgres`` (N daemons on PostgreSQL): its layout, its preStop hook
  run against a real daemon (it drains it), its grace period against the flags, and real
  daemons started with its flags on one database and one shared directory;
* the database for it: the CloudNativePG ``Cluster`` (against the CRD's schema when one is
  given in ``$ACP_SERVE_CNPG_CRD``, else the subset of it the manifest uses, written out
  here) and the plain StatefulSet, headless Service and Secret, which agree on the Secret
  the daemons read.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install kubernetes-validate"
)

from serve.runtime.daemon import SHUTDOWN_FORCE_S  # noqa: E402
from serve.settings import parse_settings  # noqa: E402
from tests.support.daemon import DaemonProcess, spawn_daemon  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
#: Oldest and newest Kubernetes minor versions the manifests are checked against.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
TOKEN = "k8s-token-0123456789abcdef"
#: Kinds of operators' CRDs: validated against their own schema (test_cloudnative_pg_*).
CUSTOM_KINDS = {("postgresql.cnpg.io/v1", "Cluster")}
OVERLAY = "overlays/replicas-postgres"


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


@functools.cache
def _rendered(target: str) -> str:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (kubectl kustomize renders the overlays)")
    return subprocess.run(
        ["kubectl", "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def _render(target: str) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of ``target`` (a fresh copy each call), or a skip."""
    return [d for d in yaml.safe_load_all(_rendered(target)) if d]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_is_valid_kubernetes(path: Path, version: str) -> None:
    docs = _docs(path)
    assert docs, f"{path} holds no resource"
    for doc in docs:
        assert "namespace" not in doc["metadata"], "manifests are namespace-agnostic"
        if (doc["apiVersion"], doc["kind"]) not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_kustomizations_list_existing_files() -> None:
    kustomizations = sorted(K8S.rglob("kustomization.yaml"))
    assert {p.parent.relative_to(K8S).as_posix() for p in kustomizations} >= {
        ".",
        "base",
        "overlays/workspace-alpha",
        OVERLAY,
        "postgres/statefulset",
    }
    for path in kustomizations:
        spec = yaml.safe_load(path.read_text())
        assert spec["kind"] == "Kustomization"
        for resource in spec["resources"]:
            assert (path.parent / resource).exists(), f"{path}: {resource} is missing"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("target", [".", "overlays/workspace-alpha", "overlays/delegated-cgroups"])
def test_kustomize_renders_valid_resources(target: str) -> None:
    docs = _render(target)
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


def _doc_resources() -> list[dict[str, Any]]:
    """The complete resources in docs/kubernetes.md's YAML blocks."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    return [
        doc
        for block in blocks
        for doc in yaml.safe_load_all(block)
        if isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc
    ]


def test_resources_shown_in_the_docs_are_valid() -> None:
    """Complete resources in docs/kubernetes.md's YAML blocks validate too."""
    resources = _doc_resources()
    assert {r["kind"] for r in resources} >= {"NetworkPolicy"}
    for resource in resources:
        if (resource["apiVersion"], resource["kind"]) not in CUSTOM_KINDS:
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


# ---- N replicas on PostgreSQL: overlays/replicas-postgres --------------------------------

_VAR = re.compile(r"^\$\(([A-Za-z_][A-Za-z0-9_]*)\)$")
_ADVERTISE = re.compile(r"^http://\$\(([A-Za-z_][A-Za-z0-9_]*)\):(\d+)$")
#: The variable the overlay's journal URL comes through (its name makes the daemon keep it
#: from the agents: acp.process.scrub_env).
JOURNAL_ENV = "ACP_SERVE_JOURNAL_URL_SECRET"


def _flag(args: list[str], name: str) -> str | None:
    """The value of ``name`` in ``args`` (the last one, as argparse takes it)."""
    values = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == name]
    return values[-1] if values else None


def _volume_at(path: str, mounts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The volume ``path`` lies on (the deepest mount holding it; {} for the image's own)."""
    holding = [m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")]
    return mounts[max(holding, key=len)] if holding else {}


def _replica_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Why the daemons in ``docs`` could not run as replicas of one workspace (none: they can).

    One replica is the one-workspace-per-pod layout and may keep everything on
    ReadWriteOnce claims. More replicas must be one cluster: the files journal has one
    writer, so all are on PostgreSQL (``--journal-url``, from a Secret: never written in a
    manifest); the others reach a session's owner at its pod's IP; the workspace, the
    agents' places (``--shared-dir``) and HOME are on claims every pod mounts, so
    ReadWriteMany (a ReadWriteOnce claim attaches to one node, a ReadWriteOncePod to one
    pod); each daemon's ``--state-dir`` is its own (it holds the daemon's id: two daemons
    on one would be one owner twice); and an update replaces them one at a time."""
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    problems: list[str] = []
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        containers = [c for c in pod["containers"] if c["command"][0] == "acp-serve"]
        for container in containers:
            name = deployment["metadata"]["name"]
            args = list(container["command"][1:])
            env = {e["name"]: e for e in container.get("env", [])}
            if any("postgres://" in a or "postgresql://" in a for a in args) or any(
                "postgres" in str(e.get("value", "")) and "://" in str(e.get("value", ""))
                for e in env.values()
            ):
                problems.append(f"{name}: a database URL is written in the manifest")
            url = _flag(args, "--journal-url")
            m = _VAR.match(url or "")
            if url is not None and not (
                m and "secretKeyRef" in env.get(m[1], {}).get("valueFrom", {})
            ):
                problems.append(f"{name}: --journal-url {url} does not come from a Secret")
            replicas = deployment["spec"].get("replicas", 1)
            if replicas <= 1:
                continue
            who = f"{name} ({replicas} replicas)"
            if url is None:
                problems.append(f"{who}: no --journal-url (the files journal has one writer)")
            advertise = _flag(args, "--advertise-url")
            a = _ADVERTISE.match(advertise or "")
            field = env.get(a[1], {}).get("valueFrom", {}).get("fieldRef", {}) if a else {}
            ports = {p["containerPort"] for p in container.get("ports", [])}
            if not (a and field.get("fieldPath") == "status.podIP" and int(a[2]) in ports):
                problems.append(f"{who}: --advertise-url {advertise} is not the pod IP and port")
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
            for volume in volumes.values():
                if "persistentVolumeClaim" not in volume:
                    continue
                claim = volume["persistentVolumeClaim"]["claimName"]
                modes = claims.get(claim, {}).get("spec", {}).get("accessModes")
                if modes != ["ReadWriteMany"]:
                    problems.append(f"{who}: the claim {claim} ({modes}) is not ReadWriteMany")
            state = _flag(args, "--state-dir") or ""
            if "emptyDir" not in _volume_at(state, mounts):
                problems.append(f"{who}: --state-dir {state} is not each pod's own (an emptyDir)")
            places = {
                "the workspace": _flag(args, "--workspace"),
                "--shared-dir": _flag(args, "--shared-dir"),
                "HOME": env.get("HOME", {}).get("value"),
            }
            for what, path in places.items():
                if path is None or "persistentVolumeClaim" not in _volume_at(path, mounts):
                    problems.append(f"{who}: {what} ({path}) is not on a claim all pods mount")
            strategy = deployment["spec"].get("strategy", {}).get("type", "RollingUpdate")
            if strategy != "RollingUpdate":
                problems.append(f"{who}: strategy {strategy} stops every replica at once")
    return problems


def _overlay() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """The rendered overlay, its Deployment and the daemon's container."""
    docs = _render(OVERLAY)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return docs, deployment, container


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("target", "kinds"),
    [
        (OVERLAY, {"Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget"}),
        ("postgres/statefulset", {"StatefulSet", "Service"}),
    ],
)
def test_the_replicas_kit_renders_valid_resources(
    target: str, kinds: set[str], version: str
) -> None:
    docs = _render(target)
    assert {d["kind"] for d in docs} == kinds
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    "target", [".", "overlays/workspace-alpha", "overlays/delegated-cgroups", OVERLAY]
)
def test_every_kit_is_safe_for_its_replicas(target: str) -> None:
    assert _replica_problems(_render(target)) == []


def test_the_replica_check_refuses_each_unsafe_layout() -> None:
    def problems(target: str, *edits: tuple[str, Any]) -> list[str]:
        docs = _render(target)
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        args = container["command"]
        for what, value in edits:
            if what == "replicas":
                deployment["spec"]["replicas"] = value
            elif what.startswith("--"):
                args[args.index(what) + 1] = value
            elif what == "HOME":
                next(e for e in container["env"] if e["name"] == "HOME")["value"] = value
            elif what == "claim":
                claim = next(d for d in docs if d["metadata"]["name"] == value)
                claim["spec"]["accessModes"] = ["ReadWriteOnce"]
            elif what == "state on":
                volumes = deployment["spec"]["template"]["spec"]["volumes"]
                volumes[0] = {"name": "state", "persistentVolumeClaim": {"claimName": value}}
        return _replica_problems(docs)

    # The base scaled up: the files journal, ReadWriteOnce claims, per-pod state on one
    # of them, Recreate, and no address or shared directory the others could use.
    found = "\n".join(problems(".", ("replicas", 3)))
    for expected in (
        "no --journal-url",
        "acp-serve-state (['ReadWriteOnce'])",
        "acp-serve-workspace (['ReadWriteOnce'])",
        "--advertise-url None",
        "--state-dir /state is not each pod's own",
        "--shared-dir (None)",
        "strategy Recreate",
    ):
        assert expected in found, found
    # The overlay with one mistake at a time: each is found, alone.
    pw = "postgresql://acp:pw@db:5432/acp"
    assert problems(OVERLAY, ("--journal-url", pw)) == [
        "acp-serve: a database URL is written in the manifest",
        f"acp-serve: --journal-url {pw} does not come from a Secret",
    ]
    assert problems(OVERLAY, ("--journal-url", "$(POD_IP)")) == [
        "acp-serve: --journal-url $(POD_IP) does not come from a Secret"
    ]
    for address in ("http://acp-serve:4170", "http://$(POD_IP):8080", "http://$(HOME):4170"):
        assert problems(OVERLAY, ("--advertise-url", address)) == [
            f"acp-serve (3 replicas): --advertise-url {address} is not the pod IP and port"
        ]
    assert problems(OVERLAY, ("claim", "acp-serve-workspace")) == [
        "acp-serve (3 replicas): the claim acp-serve-workspace (['ReadWriteOnce']) is not "
        "ReadWriteMany"
    ]
    assert problems(OVERLAY, ("state on", "acp-serve-shared")) == [
        "acp-serve (3 replicas): --state-dir /state is not each pod's own (an emptyDir)"
    ]
    assert problems(OVERLAY, ("--shared-dir", "/tmp/shared")) == [
        "acp-serve (3 replicas): --shared-dir (/tmp/shared) is not on a claim all pods mount"
    ]
    assert problems(OVERLAY, ("HOME", "/state/home")) == [
        "acp-serve (3 replicas): HOME (/state/home) is not on a claim all pods mount"
    ]
    # One replica on ReadWriteOnce claims is the one-workspace layout: fine.
    assert problems(OVERLAY, ("replicas", 1), ("claim", "acp-serve-workspace")) == []


def test_replicas_overlay_runs_daemons_behind_the_plain_service() -> None:
    docs, deployment, container = _overlay()
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    # The plain Service: any pod answers any request, no stickiness.
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"].get("clusterIP") != "None"
    assert service["spec"].get("sessionAffinity", "None") == "None"
    assert service["spec"]["selector"].items() <= labels.items()
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Two ReadWriteMany claims (the base's ReadWriteOnce /state claim is gone).
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert set(claims) == {"acp-serve-workspace", "acp-serve-shared"}
    assert all(c["spec"]["accessModes"] == ["ReadWriteMany"] for c in claims.values())
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert set(mounts) == {"/state", "/workspace", "/shared", "/tmp"}
    assert "emptyDir" in mounts["/state"]
    assert mounts["/shared"]["persistentVolumeClaim"]["claimName"] == "acp-serve-shared"
    args = list(container["command"][1:])
    assert _flag(args, "--shared-dir") == "/shared"
    assert _flag(args, "--state-dir") == "/state"
    assert _flag(args, "--advertise-url") == "http://$(POD_IP):4170"
    # HOME on the shared volume (a real agent's sessions load on every pod); the init
    # container makes its directory, as the daemon's user, before the daemon starts.
    env = {e["name"]: e for e in container["env"]}
    home = env["HOME"]["value"]
    assert home.startswith("/shared/")
    (init,) = pod["initContainers"]
    assert init["command"][:2] == ["mkdir", "-p"] and init["command"][-1] == home
    assert init["image"] == container["image"]
    assert init["volumeMounts"] == [{"name": "shared", "mountPath": "/shared"}]
    assert init["securityContext"] == container["securityContext"]
    # The journal URL: the Secret CloudNativePG makes for the Cluster (or the example's).
    ref = env[JOURNAL_ENV]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "acp-serve-journal-app", "key": "uri"}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # The daemon passes its environment to the agents without its secrets: not this one.
    from acp.process import scrub_env

    kept = scrub_env({JOURNAL_ENV: "postgresql://acp:pw@db/acp", "POD_IP": "10.0.0.7"})
    assert kept == {"POD_IP": "10.0.0.7"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_replicas_overlay_grace_period_covers_the_drains(tmp_path: Path) -> None:
    """preStop (its delay, then POST /daemon/drain: --drain-timeout-ms for running turns,
    --cancel-grace-ms + the margin for those cancelled past it, then the sessions handed
    over) and the forced shutdown; or, when a turn outlived the drain (then nothing is
    handed over yet), the hook, SIGTERM's own drain and the forced shutdown: either within
    the grace period, as the daemon parses the overlay's flags."""
    from serve.http.routes.drain import CANCEL_MARGIN_S, HAND_OVER_S

    _, deployment, container = _overlay()
    *_, delay, url = container["lifecycle"]["preStop"]["exec"]["command"]
    # The daemon's own parser accepts the whole command line, as the kubelet expands it
    # (the volumes made real here).
    pod_env = {
        JOURNAL_ENV: "postgresql://acp:pw@acp-serve-journal-rw:5432/acp",
        "POD_IP": "10.0.0.7",
    }
    args = [_kubelet_expand(a, pod_env) for a in container["command"][1:]]
    for path in ("/workspace", "/state", "/shared"):
        (tmp_path / path[1:]).mkdir()
        args[args.index(path)] = str(tmp_path / path[1:])
    settings = parse_settings(args, {"QWEN_SERVER_TOKEN": TOKEN, "HOME": str(tmp_path)})
    assert settings.journal_url == pod_env[JOURNAL_ENV]
    assert settings.advertise_url == "http://10.0.0.7:4170"
    assert settings.shared_dir == str((tmp_path / "shared").resolve())
    drain_s = settings.drain_timeout_ms / 1000
    pre_stop_s = float(delay) + drain_s + settings.cancel_grace_ms / 1000 + CANCEL_MARGIN_S
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > pre_stop_s + HAND_OVER_S + SHUTDOWN_FORCE_S
    assert grace > pre_stop_s + drain_s + SHUTDOWN_FORCE_S
    assert url == f"http://127.0.0.1:{_flag(args, '--port')}/daemon/drain"


def test_replicas_overlay_prestop_drains_the_daemon() -> None:
    """The hook, run as the kubelet runs it (with the pod's token, and a proxy set for the
    agents that must not catch 127.0.0.1), drains a real daemon: it answers 200 drained,
    and the daemon is no longer ready. With no daemon to reach it ends anyway."""
    _, _, container = _overlay()
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "-c"]  # the image's interpreter; no shell, no curl
    script, delay, url = command[2:]
    assert float(delay) == 5

    def run_hook(port: int) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "QWEN_SERVER_TOKEN": TOKEN, "http_proxy": "http://127.0.0.1:9"}
        target = url.replace(":4170/", f":{port}/")
        hook = [sys.executable, "-c", script, "0", target]
        return subprocess.run(hook, env=env, capture_output=True, text=True, timeout=60)

    d = spawn_daemon(
        ["--hostname", "127.0.0.1", "--require-auth", "--public-probes"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        with httpx.Client(base_url=d.url, timeout=30) as anonymous:
            assert anonymous.get("/readyz").status_code == 200
            done = run_hook(d.port)
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith("drain: 200"), done.stdout + done.stderr
            assert json.loads(done.stdout.split(" ", 2)[2])["drained"] is True
            ready = anonymous.get("/readyz")
            assert ready.status_code == 503 and "draining" in ready.text
    finally:
        assert d.stop() == 0
    gone = run_hook(d.port)
    assert gone.returncode == 0 and "drain failed" in gone.stderr


def _kubelet_expand(arg: str, env: dict[str, str]) -> str:
    """``$(NAME)`` in a container's command replaced as the kubelet does (unknown: kept)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_daemons_with_the_overlay_flags_hand_a_session_over(
    pg_url: str, tmp_path: Path
) -> None:
    """Two pods of the overlay as the kubelet would start them (their command with the
    Secret's URL and the pod IP put in, one database, one workspace and one shared volume,
    each its own state): both serve the probes without the token and the API with it; a
    session made on one is answered through the other (forwarded to the advertised pod
    address); a rolling update's end of a pod (its preStop drain, then SIGTERM) leaves its
    session to the other, which continues the conversation its agent kept on the shared
    volume."""
    from tests.serve.test_effects import of_type, said, turn

    auth = {"Authorization": f"Bearer {TOKEN}"}
    _, deployment, container = _overlay()
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    shared, workspace = tmp_path / "shared", tmp_path / "workspace"
    shared.mkdir()
    workspace.mkdir()
    on_volume = {"/shared": str(shared)}
    init_command = [on_volume.get(a, a.replace("/shared/", f"{shared}/")) for a in init["command"]]
    with trio.fail_after(30):
        await trio.run_process(init_command)
    home = next(e["value"] for e in container["env"] if e["name"] == "HOME")
    home = home.replace("/shared/", f"{shared}/")
    assert await trio.Path(home).is_dir()
    _, _, pre_stop_script, _, drain_url = container["lifecycle"]["preStop"]["exec"]["command"]
    daemons = []
    try:
        for n in range(2):
            port = _free_port()
            pod_env = {JOURNAL_ENV: pg_url, "POD_IP": "127.0.0.1"}
            args = [_kubelet_expand(a, pod_env) for a in container["command"][1:]]
            for flag in ("--hostname", "--port", "--workspace", "--state-dir"):
                i = args.index(flag)  # spawn_daemon gives its own, on 127.0.0.1
                del args[i : i + 2]
            args[args.index("--shared-dir") + 1] = str(shared)
            i = args.index("--advertise-url") + 1
            assert args[i] == "http://127.0.0.1:4170"
            args[i] = f"http://127.0.0.1:{port}"
            daemons.append(
                spawn_daemon(
                    ["--hostname", "127.0.0.1", "--port", str(port), *args],
                    workspace=workspace,
                    state_dir=tmp_path / f"state-{n}",
                    env={"QWEN_SERVER_TOKEN": TOKEN, "HOME": home},
                )
            )
        a, b = daemons
        with trio.fail_after(20):  # written when each one's journal first reaches the database
            while not all(_id_of(d) for d in daemons):  # noqa: ASYNC110 (other processes)
                await trio.sleep(0.05)
        ids = {_id_of(d) for d in daemons}
        assert len(ids) == 2  # two owners: each pod's state is its own
        for d in daemons:
            async with httpx.AsyncClient(base_url=d.url, timeout=30) as anonymous:
                assert (await anonymous.get("/readyz")).status_code == 200
                assert (await anonymous.get("/capabilities")).status_code == 401
        async with httpx.AsyncClient(base_url=a.url, headers=auth, timeout=60) as client:
            r = await client.post("/session", json={})
            assert r.status_code == 200, r.text
            sid = r.json()["sessionId"]
            events = await turn(client, sid, "said on pod a")
            assert events[-1]["type"] == "turn_complete", events[-1]
        # Another pod answers it too: forwarded to the owner at its advertised pod address.
        async with httpx.AsyncClient(base_url=b.url, headers=auth, timeout=60) as client:
            events = await turn(client, sid, "via pod b")
            assert events[-1]["type"] == "turn_complete", events[-1]
            assert "via pod b" in said(events)
        hook = [
            sys.executable,
            "-c",
            pre_stop_script,
            "0",
            drain_url.replace(":4170/", f":{a.port}/"),
        ]
        env = {**os.environ, "QWEN_SERVER_TOKEN": TOKEN}
        with trio.fail_after(90):
            drained = await trio.run_process(
                hook, env=env, capture_stdout=True, capture_stderr=True, check=False
            )
        out = drained.stdout.decode()
        assert out.startswith("drain: 200"), out + drained.stderr.decode()
        assert json.loads(out.split(" ", 2)[2])["movedSessions"] == 1  # handed over
        assert a.stop() == 0  # SIGTERM after the hook, as the kubelet sends it
        # The client goes on as if nothing happened: its next prompt, on the pod left, takes
        # the session over (restored from the journal and the agent's store on /shared).
        async with httpx.AsyncClient(base_url=b.url, headers=auth, timeout=60) as client:
            events = await turn(client, sid, "said on pod b")
            assert of_type(events, "session_died") == [], events
            assert events[-1]["type"] == "turn_complete", events[-1]
            assert "said on pod b" in said(events)
    finally:
        for d in daemons:
            assert d.stop() == 0


def test_the_documented_network_policies_let_the_replicas_work() -> None:
    """The docs' policies admit the overlay's daemons to each other on their port (they
    forward a session's requests to its owner) and to the StatefulSet's database, and
    nothing but the daemons to that database."""
    policies = {r["metadata"]["name"]: r for r in _doc_resources() if r["kind"] == "NetworkPolicy"}

    def admits(policy: dict[str, Any], labels: dict[str, str], port: int) -> bool:
        for rule in policy["spec"]["ingress"]:
            peers = [p["podSelector"]["matchLabels"] for p in rule["from"] if "podSelector" in p]
            ports = {p["port"] for p in rule.get("ports", [])}
            if any(peer.items() <= labels.items() for peer in peers) and port in ports:
                return True
        return False

    _, deployment, container = _overlay()
    daemon = deployment["spec"]["template"]["metadata"]["labels"]
    (port,) = [p["containerPort"] for p in container["ports"]]
    (statefulset,) = [d for d in _render("postgres/statefulset") if d["kind"] == "StatefulSet"]
    journal = statefulset["spec"]["template"]["metadata"]["labels"]
    to_daemons, to_journal = policies["acp-serve-ingress-only"], policies["acp-serve-journal"]
    assert to_daemons["spec"]["podSelector"]["matchLabels"].items() <= daemon.items()
    assert not to_daemons["spec"]["podSelector"]["matchLabels"].items() <= journal.items()
    assert admits(to_daemons, daemon, port)
    assert to_journal["spec"]["podSelector"]["matchLabels"].items() <= journal.items()
    assert admits(to_journal, daemon, 5432)
    assert not admits(to_journal, journal, 5432) and not admits(to_journal, {}, 5432)


# ---- the journal's database: CloudNativePG or a plain StatefulSet ------------------------

CLUSTER = K8S / "postgres" / "cloudnative-pg" / "cluster.yaml"
STATEFULSET = K8S / "postgres" / "statefulset"
_QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[0-9.]+[a-zA-Z]*$"}]}


def _closed(required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    return {**schema, "required": list(required)} if required else schema


def _text(**extra: Any) -> dict[str, Any]:
    return {"type": "string", **extra}


#: The part of CloudNativePG's ``Cluster`` schema (postgresql.cnpg.io/v1) the manifest uses,
#: written out from the CRD of release 1.30.0 (the same for these fields from 1.25 on;
#: 1.24 lacks ``synchronous.dataDurability``), every object closed as the API server's
#: pruning would silently drop an unknown field, and the CEL rules on these fields
#: (``number > 0``; ``imageName`` without ``imageCatalogRef``) as schema. No package
#: registry ships the CRD, so it is not committed; ``$ACP_SERVE_CNPG_CRD`` checks against it.
CNPG_CLUSTER_SUBSET: dict[str, Any] = _closed(
    ("apiVersion", "kind", "metadata", "spec"),
    apiVersion={"const": "postgresql.cnpg.io/v1"},
    kind={"const": "Cluster"},
    metadata=_closed(
        ("name",),
        name=_text(maxLength=50, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        labels={"type": "object", "additionalProperties": _text()},
    ),
    spec=_closed(
        ("instances",),
        description=_text(),
        instances={"type": "integer", "minimum": 1},
        imageName=_text(),
        bootstrap=_closed(initdb=_closed(database=_text(), owner=_text())),
        enableSuperuserAccess={"type": "boolean"},
        postgresql=_closed(
            synchronous=_closed(
                ("method", "number"),
                method={"enum": ["any", "first"]},
                number={"type": "integer", "minimum": 1},
                dataDurability={"enum": ["required", "preferred"]},
            ),
            parameters={"type": "object", "additionalProperties": _text()},
        ),
        primaryUpdateStrategy={"enum": ["unsupervised", "supervised"]},
        primaryUpdateMethod={"enum": ["switchover", "restart"]},
        affinity=_closed(
            enablePodAntiAffinity={"type": "boolean"},
            topologyKey=_text(),
            podAntiAffinityType={"enum": ["preferred", "required"]},
        ),
        storage=_closed(size=_text(), storageClass=_text()),
        resources=_closed(
            requests={"type": "object", "additionalProperties": _QUANTITY},
            limits={"type": "object", "additionalProperties": _QUANTITY},
        ),
    ),
)


def _schema_errors(doc: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    jsonschema = pytest.importorskip("jsonschema", reason="pip install jsonschema")
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_cloudnative_pg_cluster_is_valid_and_fails_over_without_loss() -> None:
    (cluster,) = _docs(CLUSTER)
    assert _schema_errors(cluster, CNPG_CLUSTER_SUBSET) == []
    for path, value in (
        (("spec", "instanses"), 3),  # misspelt: pruned by the API server, caught here
        (("spec", "postgresql", "synchronous", "method"), "all"),
        (("spec", "postgresql", "synchronous", "number"), 0),
        (("spec", "storage", "sizeLimit"), "10Gi"),
        (("apiVersion",), "postgresql.cnpg.io/v1beta1"),
    ):
        bad = copy.deepcopy(cluster)
        *parents, last = path
        node = bad
        for key in parents:
            node = node[key]
        node[last] = value
        assert _schema_errors(bad, CNPG_CLUSTER_SUBSET), f"{path} = {value!r} passed"
    spec = cluster["spec"]
    # A standby to fail over to, and a synchronous one: a commit (a lease's epoch, a batch
    # of events) is on two servers before the daemon sees it, so a failover loses none.
    assert spec["instances"] >= 2
    sync = spec["postgresql"]["synchronous"]
    assert 1 <= sync["number"] < spec["instances"]
    assert sync.get("dataDurability", "required") == "required"
    assert spec.get("enableSuperuserAccess", False) is False
    # No secret of ours in initdb: the operator makes <name>-app (with its uri), which is
    # what the overlay's daemons read.
    assert set(spec["bootstrap"]["initdb"]) == {"database", "owner"}
    _, _, container = _overlay()
    ref = next(e for e in container["env"] if e["name"] == JOURNAL_ENV)["valueFrom"]
    assert ref["secretKeyRef"] == {"name": cluster["metadata"]["name"] + "-app", "key": "uri"}


def test_cloudnative_pg_cluster_against_the_operators_crd() -> None:
    crd_path = os.environ.get("ACP_SERVE_CNPG_CRD")
    if not crd_path:
        pytest.skip(
            "no CloudNativePG CRD here: set ACP_SERVE_CNPG_CRD to a clusters.postgresql.cnpg.io "
            "CRD (`kubectl get crd clusters.postgresql.cnpg.io -o yaml`, or a release's "
            "config/crd/bases/postgresql.cnpg.io_clusters.yaml); no package registry ships it"
        )
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("crd_schemas", ROOT / "scripts" / "agent_sandbox_schemas.py")
    assert spec is not None and spec.loader is not None
    crd_schemas = module_from_spec(spec)
    spec.loader.exec_module(crd_schemas)
    crd = yaml.safe_load(Path(crd_path).read_text())
    _, schema = crd_schemas.schema_for(crd)  # closed like the agent-sandbox kinds
    (cluster,) = _docs(CLUSTER)
    assert _schema_errors(cluster, schema) == []
    misspelt = copy.deepcopy(cluster)
    misspelt["spec"]["instanses"] = 3
    assert _schema_errors(misspelt, schema)


def test_postgres_statefulset_serves_the_uri_its_secret_names() -> None:
    (statefulset,) = _docs(STATEFULSET / "statefulset.yaml")
    (service,) = _docs(STATEFULSET / "service.yaml")
    (secret,) = _docs(STATEFULSET / "secret.example.yaml")
    spec = statefulset["spec"]
    assert spec["replicas"] == 1  # one server: no standby to diverge from
    assert (
        service["spec"]["clusterIP"] == "None"
        and spec["serviceName"] == service["metadata"]["name"]
    )
    pod_labels = spec["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    (container,) = spec["template"]["spec"]["containers"]
    (port,) = service["spec"]["ports"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[port["targetPort"]] == 5432
    # The server's role, password and database come from the Secret the daemons' uri is in.
    env = {e["name"]: e for e in container["env"]}
    keys = {}
    for name in ("POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"]
        keys[name] = secret["stringData"][ref["key"]]
    _, _, daemon = _overlay()
    ref = next(e for e in daemon["env"] if e["name"] == JOURNAL_ENV)["valueFrom"]
    assert ref["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "uri"}
    from urllib.parse import urlsplit

    uri = urlsplit(secret["stringData"]["uri"])
    assert uri.scheme == "postgresql"
    assert (uri.username, uri.password) == (keys["POSTGRES_USER"], keys["POSTGRES_PASSWORD"])
    assert (uri.hostname, uri.port) == (service["metadata"]["name"], port["port"])
    assert uri.path == "/" + keys["POSTGRES_DB"]
    # Its data on a claim of its own (ReadWriteOnce: one server), below the mount point.
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    (data,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert env["PGDATA"]["value"].startswith(data["mountPath"].rstrip("/") + "/")
    # Hardened like the daemon: non-root, read-only root (the socket directory and /tmp
    # are emptyDirs), no capabilities.
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = {
        m["mountPath"]
        for m in container["volumeMounts"]
        if "emptyDir" in volumes.get(m["name"], {})
    }
    assert writable == {"/var/run/postgresql", "/tmp"}


def _id_of(d: DaemonProcess) -> str:
    """The daemon's id once written ("" before)."""
    try:
        return (d.state_dir / "daemon-id").read_text().strip()
    except FileNotFoundError:
        return ""

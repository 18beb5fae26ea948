"""The daemon config file: typed decoding, and a bad file stopping start-up with its key named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from serve.config import MAX_CONFIG_BYTES, DaemonConfig, load_daemon_config
from serve.settings import SettingsError, parse_settings
from tests.support.daemon import ROOT, running_daemon, spawn_daemon

TOKEN = "config-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def settings_with(tmp_path: Path, text: str | bytes) -> object:
    path = tmp_path / "acp-serve.yaml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return parse_settings(
        ["--workspace", str(tmp_path), "--config", str(path)], {"HOME": str(tmp_path)}
    )


def test_no_config_file_means_defaults(tmp_path: Path) -> None:
    settings = parse_settings(["--workspace", str(tmp_path)], {"HOME": str(tmp_path)})
    assert load_daemon_config(settings) == DaemonConfig()


def test_a_full_config_decodes_into_typed_sections(tmp_path: Path) -> None:
    text = """
policy:
  permissionStrategy: consensus
  consensusQuorum: 2
capabilities:
  defaults:
    fs.read: {scope: any}
    fs.write:
    mcp.connect:*: {scope: core}
    secret.bind:GITHUB_TOKEN: true
  agents:
    acp-scripted:
      terminal.exec: false
approval:
  default: prompt
  tools: {terminal: prompt}
  capabilities: {fs.write: prompt}
  risks: {critical: deny}
"""
    config = load_daemon_config(settings_with(tmp_path, text))  # type: ignore[arg-type]
    assert config.policy.permission_strategy == "consensus"
    assert config.policy.consensus_quorum == 2
    defaults = config.capabilities.defaults
    assert defaults is not None and defaults["fs.read"].scope == "any"  # type: ignore[union-attr]
    assert config.capabilities.agents["acp-scripted"]["terminal.exec"] is False
    assert config.approval.risks == {"critical": "deny"}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("policy:\n  permisionStrategy: designated\n", "permisionStrategy"),
        ("policy:\n  permissionStrategy: majority\n", "policy.permissionStrategy"),
        ("policy:\n  consensusQuorum: 0\n", "policy.consensusQuorum"),
        ("polcy: {}\n", "polcy"),
        ("capabilities:\n  defaults:\n    fs.read: {scope: everywhere}\n", "scope"),
        ("capabilities:\n  defaults:\n    'Fs Read': true\n", "Fs Read"),
        ("approval:\n  default: maybe\n", "approval.default"),
        ("approval:\n  risks: {huge: deny}\n", "huge"),
        ("approval:\n  tools: {terminal: allow}\n", "approval.tools"),
        ("- just\n- a list\n", "Expected `object`"),
        ("policy: [unclosed\n", "invalid YAML"),
    ],
)
def test_a_bad_key_or_value_is_a_settings_error_naming_it(
    tmp_path: Path, text: str, named: str
) -> None:
    with pytest.raises(SettingsError) as info:
        load_daemon_config(settings_with(tmp_path, text))  # type: ignore[arg-type]
    assert named in str(info.value)
    assert "acp-serve.yaml" in str(info.value)


def test_unreadable_or_huge_files_are_refused(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, "policy: {}\n")
    (tmp_path / "acp-serve.yaml").unlink()  # gone between the flag check and the load
    with pytest.raises(SettingsError, match=r"cannot read config file .*acp-serve\.yaml"):
        load_daemon_config(settings)  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="larger than"):
        load_daemon_config(settings_with(tmp_path, b"#" * (MAX_CONFIG_BYTES + 1)))  # type: ignore[arg-type]


def _start(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return subprocess.run(
        [
            *(sys.executable, "-m", "serve", "--port", "0", "--workspace", str(tmp_path)),
            *("--state-dir", str(tmp_path / "state"), "--config", str(path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("policy:\n  permissionStrategy: first-responder\n  retries: 3\n", "retries"),
        ("policy:\n  permissionStrategy: anyone\n", "policy.permissionStrategy"),
        ("restartPolicy: always\n", "restartPolicy"),
    ],
)
def test_the_daemon_refuses_to_start_with_a_bad_config(
    tmp_path: Path, text: str, named: str
) -> None:
    done = _start(tmp_path, text)
    assert done.returncode == 1
    assert done.stdout == ""  # never printed the ready line
    assert done.stderr.startswith("acp-serve: config ")
    assert named in done.stderr and "bad.yaml" in done.stderr


def test_the_configured_policy_is_advertised(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("policy:\n  permissionStrategy: designated\n  consensusQuorum: 2\n")
    with running_daemon(["--config", str(path)], env={"QWEN_SERVER_TOKEN": TOKEN}) as d:
        caps = httpx.get(f"{d.url}/capabilities", headers=AUTH, timeout=10).json()
        assert caps["policy"]["permission"] == "designated"
        assert "permission_mediation" in caps["features"]
        assert caps["featureDetails"]["permission_mediation"]["modes"] == [
            "first-responder",
            "designated",
            "consensus",
            "local-only",
        ]
        assert "workspace_permissions" in caps["features"]
        status = httpx.get(f"{d.url}/daemon/status", headers=AUTH, timeout=10).json()
        assert status["runtime"]["permissions"]["policy"] == "designated"
    # the quorum is ignored outside consensus, and the operator is told so at start-up
    assert "consensusQuorum is only honoured" in d.stderr()


async def test_restart_policy_from_the_config_file(tmp_path: Path) -> None:
    """restart.session.intensity 0: a crashed agent is not restarted, the session dies."""
    config = tmp_path / "daemon.yaml"
    config.write_text("restart:\n  session:\n    intensity: 0\n")
    daemon = spawn_daemon(
        ["--config", str(config)],
        workspace=tmp_path / "ws",
        env={"QWEN_SERVER_TOKEN": "restart-token-0123456789"},
    )
    try:
        auth = {"Authorization": "Bearer restart-token-0123456789"}
        async with httpx.AsyncClient(base_url=daemon.url, headers=auth, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            r = await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "[crash]"}]}
            )
            assert r.status_code == 503 and r.json()["code"] == "channel_closed"
            assert (await client.post(f"/session/{sid}/heartbeat")).status_code == 404
    finally:
        daemon.stop()


def test_bad_restart_values_are_refused(tmp_path: Path) -> None:
    from serve.config import load_config_text
    from serve.permissions.config import ConfigError

    for text in ("restart:\n  session:\n    intensity: -1\n", "restart:\n  sessions: {}\n"):
        with pytest.raises(ConfigError):
            load_config_text(text)
    cfg = load_config_text("restart:\n  session:\n    periodS: 10\n    backoffMs: 5\n")
    assert cfg.restart.session.period_s == 10 and cfg.restart.session.backoff_ms == 5


def test_device_flow_providers_decode_from_the_config_file(tmp_path: Path) -> None:
    text = """
deviceFlow:
  providers:
    corp:
      deviceAuthorizationEndpoint: https://idp.example/oauth2/device/code
      tokenEndpoint: https://idp.example/oauth2/token
      clientId: abc
      scope: openid profile
      pkce: true
    plain:
      deviceAuthorizationEndpoint: http://127.0.0.1:9/device
      tokenEndpoint: http://127.0.0.1:9/token
      clientId: xyz
"""
    config = load_daemon_config(settings_with(tmp_path, text))  # type: ignore[arg-type]
    corp = config.device_flow.providers["corp"]
    assert corp.device_authorization_endpoint == "https://idp.example/oauth2/device/code"
    assert (corp.client_id, corp.scope, corp.pkce) == ("abc", "openid profile", True)
    plain = config.device_flow.providers["plain"]
    assert (plain.scope, plain.pkce) == (None, False)
    assert load_daemon_config(settings_with(tmp_path, "policy: {}\n")).device_flow.providers == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ("tokenEndpoint: https://i/t\n      clientId: a", "deviceAuthorizationEndpoint"),
        (
            "deviceAuthorizationEndpoint: ftp://i/d\n      tokenEndpoint: https://i/t\n"
            "      clientId: a",
            "deviceFlow.providers['corp'].deviceAuthorizationEndpoint",
        ),
        (
            "deviceAuthorizationEndpoint: https://i/d\n      tokenEndpoint: https://i/t\n"
            "      clientId: a\n      clientSecret: s",
            "clientSecret",
        ),
        (
            "deviceAuthorizationEndpoint: https://i/d\n      tokenEndpoint: https://i/t\n"
            '      clientId: ""',
            "deviceFlow.providers['corp'].clientId",
        ),
    ],
)
def test_bad_device_flow_providers_are_refused(tmp_path: Path, entry: str, named: str) -> None:
    text = f"deviceFlow:\n  providers:\n    corp:\n      {entry}\n"
    with pytest.raises(SettingsError) as info:
        load_daemon_config(settings_with(tmp_path, text))  # type: ignore[arg-type]
    assert named in str(info.value)


def test_a_bad_device_flow_provider_name_is_refused(tmp_path: Path) -> None:
    text = (
        "deviceFlow:\n  providers:\n    'bad name/..':\n"
        "      deviceAuthorizationEndpoint: https://i/d\n      tokenEndpoint: https://i/t\n"
        "      clientId: a\n"
    )
    with pytest.raises(SettingsError, match=r"deviceFlow\.providers"):
        load_daemon_config(settings_with(tmp_path, text))  # type: ignore[arg-type]

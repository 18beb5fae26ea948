"""CLI parsing and every start-up refusal that applies to the flags we parse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from serve.http.security.cors import CorsPolicy
from serve.settings import Settings, SettingsError, parse_settings
from tests.support.daemon import ROOT


def parse(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Settings:
    return parse_settings(["--workspace", str(tmp_path), *args], env or {"HOME": str(tmp_path)})


def test_defaults_match_the_reference(tmp_path: Path) -> None:
    s = parse(tmp_path)
    assert (s.hostname, s.port) == ("127.0.0.1", 4170)
    assert s.max_sessions == 32
    assert s.max_pending_prompts_per_session == 5
    assert s.event_ring_size == 8000
    assert s.session_idle_timeout_ms == 1_800_000
    assert s.initialize_timeout_ms == 10_000
    assert s.session_restore_timeout_ms == 60_000
    assert s.rate_limit.enabled is False
    assert (s.rate_limit.prompt, s.rate_limit.mutation, s.rate_limit.read) == (10, 30, 120)
    assert s.mcp_budget_mode == "off"
    assert s.token is None and s.trusted_loopback
    assert s.workspaces == (str(tmp_path.resolve()),)
    assert s.agent_argv[1:] == ("-m", "acp.agents.scripted")


def test_workspace_defaults_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_settings([], {}).workspaces == (str(tmp_path.resolve()),)


def test_token_flag_wins_and_is_trimmed(tmp_path: Path) -> None:
    s = parse(tmp_path, "--token", "  abc  ", env={"QWEN_SERVER_TOKEN": "env"})
    assert s.token == "abc" and s.token_from_argv
    assert parse(tmp_path, env={"QWEN_SERVER_TOKEN": " env "}).token == "env"
    assert parse(tmp_path, env={"QWEN_SERVER_TOKEN": "   "}).token is None


def test_agent_command_is_split_like_a_shell(tmp_path: Path) -> None:
    s = parse(tmp_path, "--agent", "qwen --acp --model 'a b'")
    assert s.agent_argv == ("qwen", "--acp", "--model", "a b")
    assert not s.agent_is_default


def test_rate_limit_from_env(tmp_path: Path) -> None:
    s = parse(tmp_path, env={"QWEN_SERVE_RATE_LIMIT": "true", "QWEN_SERVE_RATE_LIMIT_READ": "7"})
    assert s.rate_limit.enabled and s.rate_limit.read == 7


def test_budget_mode_defaults_to_warn_with_a_budget(tmp_path: Path) -> None:
    assert parse(tmp_path, "--mcp-client-budget", "4").mcp_budget_mode == "warn"


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--hostname", ""], {}, "Invalid --hostname"),
        (["--hostname", "127.0.0.1:8080"], {}, '"127.0.0.1:8080"'),
        (["--port", "http"], {}, '--port "http"'),
        (["--port", "70000"], {}, '--port "70000"'),
        (["--max-sessions", "-1"], {}, '--max-sessions "-1"'),
        (["--max-sessions", "lots"], {}, '--max-sessions "lots"'),
        (["--max-total-sessions", "x"], {}, '--max-total-sessions "x"'),
        (["--max-pending-prompts-per-session", "1.5"], {}, '"1.5"'),
        (["--event-ring-size", "0"], {}, '--event-ring-size "0"'),
        (["--event-ring-size", "1000001"], {}, '"1000001"'),
        (["--prompt-deadline-ms", "0"], {}, '--prompt-deadline-ms "0"'),
        (["--writer-idle-timeout-ms", "-5"], {}, '--writer-idle-timeout-ms "-5"'),
        (["--initialize-timeout-ms", "9999999999"], {}, "at most 2147483647"),
        (["--session-idle-timeout-ms", "soon"], {}, '"soon"'),
        (["--permission-response-timeout-ms", "-1"], {}, '"-1"'),
        (["--mcp-budget-mode", "enforce"], {}, "requires --mcp-client-budget"),
        (["--mcp-budget-mode", "strict"], {}, '"strict"'),
        (["--mcp-client-budget", "0"], {}, '--mcp-client-budget "0"'),
        (["--require-auth"], {}, "--require-auth"),
        (["--tls-cert", "/nonexistent.pem"], {}, "--tls-key"),
        (["--rate-limit-window-ms", "999"], {}, ">= 1000"),
        (["--rate-limit-prompt", "0"], {}, '--rate-limit-prompt "0"'),
        (["--memory-project-scope", "repo"], {}, '"repo"'),
        (["--log-format", "xml"], {}, '"xml"'),
        (["--config", "/nonexistent.yaml"], {}, '"/nonexistent.yaml"'),
        (["--agent", "'unbalanced"], {}, "Invalid --agent"),
        (["--workspace", "/nonexistent/dir"], {}, '"/nonexistent/dir"'),
        ([], {"QWEN_SERVE_PROMPT_DEADLINE_MS": "abc"}, 'QWEN_SERVE_PROMPT_DEADLINE_MS="abc"'),
        ([], {"QWEN_SERVE_WRITER_IDLE_TIMEOUT_MS": "0"}, "QWEN_SERVE_WRITER_IDLE_TIMEOUT_MS"),
        (["--event-ring-bytes", "1000"], {}, '--event-ring-bytes "1000"'),
        (["--max-agent-line-bytes", "100"], {}, '--max-agent-line-bytes "100"'),
        (["--max-agent-line-bytes", str(65 * 2**20)], {}, "--max-agent-line-bytes"),
        (
            ["--event-ring-bytes", str(2**20), "--max-agent-line-bytes", str(2**21)],
            {},
            "must be at least --max-agent-line-bytes",
        ),
        (["--journal-retention-ms", "-5"], {}, '--journal-retention-ms "-5"'),
        (["--journal-max-total-bytes", "1000"], {}, "at least 16777216"),
        (["--journal-max-total-bytes", "lots"], {}, '"lots"'),
        (["--journal-url", "mysql://u:secret@db/x"], {}, "must be a postgresql:// URL"),
        (["--journal-url", "postgresql://db/x", "--no-journal"], {}, "contradict"),
        (["--advertise-url", "http://10.0.0.7:4170"], {}, "needs --journal-url"),
        (
            ["--journal-url", "postgresql://db/x", "--advertise-url", "10.0.0.7:4170"],
            {},
            "must be an http(s) URL with a host",
        ),
        (["--turn-settle-ms", "5"], {}, '--turn-settle-ms "5"'),
        (["--turn-settle-ms", "60001"], {}, '--turn-settle-ms "60001"'),
        (["--turn-settle-ms", "soon"], {}, '--turn-settle-ms "soon"'),
    ],
)
def test_refusals_name_the_bad_value(
    tmp_path: Path, args: list[str], env: dict[str, str], needle: str
) -> None:
    with pytest.raises(SettingsError) as info:
        parse(tmp_path, *args, env=env)
    assert needle in str(info.value)


def test_hardening_bounds_defaults_and_values(tmp_path: Path) -> None:
    s = parse(tmp_path)
    assert s.event_ring_bytes == 32 * 2**20 and s.max_agent_line_bytes == 16 * 2**20
    assert s.journal_retention_ms == 7 * 24 * 3600 * 1000
    assert s.journal_max_total_bytes == 2**30
    assert s.journal_url is None  # the files journal by default
    url = "postgresql://acp:pw@db.internal:5432/journal"
    assert parse(tmp_path, "--journal-url", url).journal_url == url
    advertised = parse(tmp_path, "--journal-url", url, "--advertise-url", "http://10.0.0.7:4170/")
    assert advertised.advertise_url == "http://10.0.0.7:4170"
    s = parse(
        tmp_path,
        "--event-ring-bytes",
        "65536",
        "--max-agent-line-bytes",
        "4096",
        "--journal-retention-ms",
        "0",
        "--journal-max-total-bytes",
        "0",
    )
    assert (s.event_ring_bytes, s.max_agent_line_bytes) == (65536, 4096)
    assert (s.journal_retention_ms, s.journal_max_total_bytes) == (0, 0)


def test_duplicate_workspaces_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="more than once"):
        parse(tmp_path, "--workspace", str(tmp_path / "."))


def test_workspace_must_be_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SettingsError, match="not a directory"):
        parse_settings(["--workspace", str(f)], {})


def test_cli_exits_nonzero_with_the_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "serve", "--workspace", str(tmp_path), "--port", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == 'acp-serve: Invalid --port "nope": must be an integer in [0, 65535]'
    )
    assert result.stdout == ""


def test_body_limit_and_http_timeouts_are_settings_with_units(tmp_path: Path) -> None:
    s = parse(tmp_path)
    assert (s.max_body_bytes, s.http_graceful_timeout_ms, s.http_keep_alive_timeout_ms) == (
        10 * 1024 * 1024,
        2000,
        5000,
    )
    assert s.body_too_large_message == "Request body too large (max 10 MB)"
    t = parse(
        tmp_path,
        *("--max-body-bytes", "2097152", "--http-graceful-timeout-ms", "0"),
        *("--http-keep-alive-timeout-ms", "750"),
    )
    assert (t.max_body_bytes, t.http_graceful_timeout_ms, t.http_keep_alive_timeout_ms) == (
        2 * 1024 * 1024,
        0,
        750,
    )
    assert t.body_too_large_message == "Request body too large (max 2 MB)"
    for flag, bad in (
        ("--max-body-bytes", "0"),
        ("--max-body-bytes", str(2**31)),
        ("--http-keep-alive-timeout-ms", "0"),
        ("--http-graceful-timeout-ms", "-1"),
    ):
        with pytest.raises(SettingsError, match=f'{flag} "{bad}"'):
            parse(tmp_path, flag, bad)


def test_agent_sandbox_modes(tmp_path: Path) -> None:
    assert parse(tmp_path).agent_sandbox == "auto"
    assert parse(tmp_path, "--agent-sandbox", "off").agent_sandbox == "off"
    with pytest.raises(SettingsError, match='--agent-sandbox "bwrap": must be one of'):
        parse(tmp_path, "--agent-sandbox", "bwrap")


def test_agent_sandbox_landlock_needs_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from acp import landlock

    monkeypatch.setattr(landlock, "abi_version", lambda: 0)
    with pytest.raises(SettingsError, match="this kernel has no Landlock"):
        parse(tmp_path, "--agent-sandbox", "landlock")


@pytest.mark.parametrize(
    "patterns",
    [["*"], ["https://app.example.com"], ["http://localhost:5173", "http://10.0.0.2:3000"]],
)
def test_allow_origin_without_a_token_is_refused_with_the_policy_s_message(
    tmp_path: Path, patterns: list[str]
) -> None:
    """The flag parser checks the patterns with serve/origins.py (no HTTP import); its
    refusal is the one the CORS policy states."""
    args = [a for p in patterns for a in ("--allow-origin", p)]
    with pytest.raises(SettingsError) as info:
        parse(tmp_path, *args, env={})
    assert str(info.value) == CorsPolicy.from_patterns(patterns).startup_problem(has_token=False)
    assert parse(tmp_path, *args, "--token", "t0123456").token == "t0123456"


def test_a_refused_journal_url_does_not_echo_its_password(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as info:
        parse(tmp_path, "--journal-url", "mysql://acp:s3cret@db.internal/x")
    assert "s3cret" not in str(info.value) and "db.internal/x" in str(info.value)

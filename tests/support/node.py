"""Locate (and if needed install) the node packages the interop tests use.

``scripts/install-node-deps`` installs ``@qwen-code/qwen-code`` (pinned) and ``@qwen-code/sdk``
under ``.cache/node`` of the repository; CI runs it before the tests. :func:`ensure_qwen`
runs it too when the package is missing (idempotent), so a developer's first run works.

Running qwen offline (see ``shared/reference/real-qwen-agent.md``): :func:`qwen_acp_argv` is
``node <cli.js> --acp`` and :func:`qwen_env` builds an environment with a private ``HOME``
holding a ``~/.qwen/settings.json`` that selects the OpenAI auth type, turns off telemetry,
update checks and the extra per-turn model calls, plus ``QWEN_CODE_NO_RELAUNCH=true`` so qwen
is one process (stop it by its process group).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
NODE_PREFIX: Final = REPO / ".cache" / "node"
QWEN_PACKAGE: Final = NODE_PREFIX / "node_modules" / "@qwen-code" / "qwen-code"
INSTALL_SCRIPT: Final = REPO / "scripts" / "install-node-deps"

QWEN_SETTINGS: Final = {
    "security": {"auth": {"selectedType": "openai"}},
    "model": {"name": "fake"},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    "telemetry": {"enabled": False},
    "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
    "ui": {"enableFollowupSuggestions": False},
}


def missing_node_reason() -> str | None:
    """Why the node tests cannot run here, or None when node and npm are on PATH."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH; cannot run the real qwen agent"
    return None


def qwen_cli() -> Path | None:
    cli = QWEN_PACKAGE / "cli.js"
    return cli if cli.is_file() else None


def ensure_qwen() -> Path:
    """Path of qwen's ``cli.js``, installing it with ``scripts/install-node-deps`` if needed.

    Raises RuntimeError when the install fails (with npm's output)."""
    cli = qwen_cli()
    if cli is not None:
        return cli
    proc = subprocess.run(
        [str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=600, check=False
    )
    cli = qwen_cli()
    if proc.returncode != 0 or cli is None:
        raise RuntimeError(
            f"scripts/install-node-deps failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return cli


def qwen_acp_argv(cli: Path) -> list[str]:
    node = shutil.which("node") or "node"
    return [node, str(cli), "--acp"]


def qwen_env(home: Path, openai_env: dict[str, str]) -> dict[str, str]:
    """Environment for ``qwen --acp``: private HOME with settings, fake-model variables."""
    (home / ".qwen").mkdir(parents=True, exist_ok=True)
    (home / ".qwen" / "settings.json").write_text(json.dumps(QWEN_SETTINGS))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "QWEN_", "DASHSCOPE_", "ANTHROPIC_", "GEMINI_"))
    }
    env.update(openai_env)
    env.update(
        {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "QWEN_CODE_NO_RELAUNCH": "true",
            "NO_COLOR": "1",
            "CI": "true",
        }
    )
    return env

"""The worked example that opens docs/multi-user.md runs as written (issue 46):
``scripts/multi-user-example`` makes a key pair, a JWKS file and two users' JWTs, starts a
daemon that accepts them, and calls it as each user."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "acp-serve").exists(), reason="no .venv")
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_multi_user_example_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "multi-user-example"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert '"stopReason":"end_turn"' in out
    assert "bob prompts it: HTTP 404" in out
    assert "no token: HTTP 401" in out
    assert "entries by alice: " in out and "entries by alice: 0" not in out
    # The doc shows the script's steps.
    doc = (ROOT / "docs" / "multi-user.md").read_text()
    assert "scripts/multi-user-example" in doc.split("\n## ")[1]  # its first section

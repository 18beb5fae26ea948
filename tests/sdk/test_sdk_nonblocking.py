"""``promptNonBlocking()`` of the published SDK against ``--prompt-response async`` (issue 18).

The SDK sends no ``Prefer`` header and expects ``202`` at admission, then follows the turn
over SSE; aborting its request signal afterwards must not cancel the turn.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TOKEN
from tests.sdk.test_sdk_compat import sdk_module  # noqa: F401  (the fixture)
from tests.support.daemon import DaemonProcess, running_daemon

SCRIPT = Path(__file__).with_name("sdk_nonblocking.mjs")


@pytest.fixture(scope="module")
def async_daemon() -> Iterator[DaemonProcess]:
    with running_daemon(["--prompt-response", "async"], env={"QWEN_SERVER_TOKEN": TOKEN}) as d:
        yield d


def test_prompt_non_blocking_gets_202_and_the_turn_survives_the_caller(
    sdk_module: Path,  # noqa: F811
    async_daemon: DaemonProcess,
) -> None:
    node = shutil.which("node")
    assert node is not None
    result = subprocess.run(
        [node, str(SCRIPT), sdk_module.as_uri(), async_daemon.url, TOKEN],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(out["accepted"]) == {"promptId", "lastEventId", "eventEpoch"}
    assert out["end"] == {"type": "turn_complete", "stopReason": "end_turn"}
    assert "permission_request" in out["seen"]
    written = async_daemon.workspace / "sdk-async.txt"
    assert written.read_text() == "written later"

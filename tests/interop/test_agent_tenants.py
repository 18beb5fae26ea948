"""The interop flow (tests/interop/test_agent_matrix.py) again for claude and qwen, as a
principal of a multi-user daemon (``--auth-tokens-file``) under the default sandbox: the
agent then runs with the principal's own HOME (``<state>/tenants/<name>/home``, the
operator's agent set-up copied in: serve/isolation/tenants.py), and every step still works;
the agent keeps its files in that HOME, not the operator's; and its own shell tool, asked
and allowed to write into another principal's HOME and into the daemon's tokens file, writes
neither (with ``--agent-sandbox off`` both would be written: the sandbox refuses them)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

import tests.interop.test_agent_matrix as matrix
from serve.isolation.identity import uid_for
from serve.isolation.tenants import TENANTS_SUBDIR, dir_name
from tests.conftest import AUTH
from tests.interop.agents import CLAUDE, QWEN, ensure_installed
from tests.interop.test_agent_matrix import _step_gate  # noqa: F401  (its autouse step gate)

PRINCIPAL = "pat@example.com"
PAT_TOKEN = "pat-scoped-token-0123456789abcdef"


@pytest.fixture(scope="session")
def install_error() -> str | None:
    """As the matrix's: scripts/install-agents unless its stamp is there."""
    return ensure_installed()


@pytest.fixture(scope="module")
def tokens_file() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="acp-tenants-") as tmp:
        path = Path(tmp) / "tokens.jsonl"
        digest = hashlib.sha256(PAT_TOKEN.encode()).hexdigest()
        path.write_text(json.dumps({"id": "p1", "sha256": digest, "principal": PRINCIPAL}))
        yield path


@pytest.fixture(scope="class", params=(QWEN, CLAUDE), ids=lambda spec: spec.name)
def flow(
    request: pytest.FixtureRequest, install_error: str | None, tokens_file: Path
) -> Iterator[matrix.Flow]:
    """The agent behind a multi-user daemon, the steps sent with a principal's token."""
    with matrix.started(
        request.param, install_error, "--auth-tokens-file", str(tokens_file)
    ) as flow:
        flow.auth = {"Authorization": f"Bearer {PAT_TOKEN}"}
        yield flow


class TestAgentFlowAsPrincipal(matrix.TestAgentFlow):
    """Every step of the matrix flow, sent with a principal's scoped token."""

    @pytest.mark.step("own_home", needs=("create",))
    async def test_10_the_agent_lives_in_the_principals_home(self, flow: matrix.Flow) -> None:
        home = flow.daemon.state_dir / TENANTS_SUBDIR / dir_name(PRINCIPAL) / "home"
        written = [p for p in home.rglob("*") if p.is_file()]
        # The operator's set-up was copied in, and the agent wrote its own files there.
        seeded = {".qwen/settings.json", ".claude/settings.json"}
        assert {str(p.relative_to(home)) for p in written} - seeded, sorted(written)

    @pytest.mark.step("no_cross_write", needs=("shell",))
    async def test_11_its_shell_cannot_write_another_principals_home_nor_the_tokens_file(
        self, flow: matrix.Flow, tokens_file: Path
    ) -> None:
        """The agent's own shell tool, asked (and allowed) to write into another principal's
        HOME and into the daemon's tokens file: neither is written."""
        other = flow.daemon.state_dir / TENANTS_SUBDIR / dir_name("someone-else") / "home"
        other.mkdir(parents=True, exist_ok=True)
        before = await trio.to_thread.run_sync(tokens_file.read_bytes)
        async with matrix.http(flow) as client:
            r = await client.post("/session", json={"sessionScope": "thread"})
            assert r.status_code == 200, r.text
        flow.session_id, flow.client_id = r.json()["sessionId"], r.json()["clientId"]
        flow.last_event_id = 0
        for target in (other / "planted.txt", tokens_file):
            await matrix.allowed_turn(
                flow, f"please run {target} pwned-by-{flow.spec.name}", mode=flow.spec.shell_mode
            )
        assert not (other / "planted.txt").exists()
        assert await trio.to_thread.run_sync(tokens_file.read_bytes) == before
        # (the turn's own shell step, in the workspace, worked: test_4b_shell)

    @pytest.mark.step("own_uid", needs=("create",))
    async def test_12_as_root_the_agent_runs_under_the_principals_uid(
        self, flow: matrix.Flow
    ) -> None:
        """A root daemon in multi-user mode runs each principal's agents under a uid of their
        own (``--agent-uid-range auto``: serve/isolation/identity.py), the agent's node
        runnable by another uid: the files it wrote in its HOME are that uid's."""
        if os.geteuid() != 0:
            pytest.skip("per-principal uids need a daemon run as root")
        async with httpx.AsyncClient(base_url=flow.daemon.url, headers=AUTH) as client:
            r = await client.get("/daemon/status")  # (the operator's: admin)
            assert r.status_code == 200, r.text
            uids = r.json()["isolation"]["uids"]
        assert uids["active"], uids
        uid = uid_for(PRINCIPAL, uids["range"]["start"], uids["range"]["count"])
        home = flow.daemon.state_dir / TENANTS_SUBDIR / dir_name(PRINCIPAL) / "home"
        owners = {p.stat().st_uid for p in home.rglob("*") if p.is_file()}
        assert uid in owners, (uid, owners)

"""Path attacks through HTTP: every file route, every trick, 0 escapes, 0 outside reads.

Layout (created before the daemon starts)::

    root/
      secret.txt              outside: SECRET bytes
      outside/secret.txt      outside: SECRET bytes
      ws/                     the bound workspace
        sub/link_up       ->  ../../secret.txt
        link_file         ->  ../secret.txt
        link_abs          ->  <root>/secret.txt
        link_dir          ->  ../outside
        chain_a -> chain_b -> chain_c -> ../secret.txt
        loop_a <-> loop_b
        dangling          ->  ../outside/created_by_attack.txt

Each attack is sent to ``GET /file``, ``/file/bytes``, ``/stat``, ``/list``, ``/glob``
(as ``cwd``), ``POST /file/write`` (create and replace, with the secret's real hash) and
``POST /file/edit`` (with the secret's real hash). A response may never contain the
secret (plain or base64) and the outside tree must be byte-for-byte unchanged afterwards.
"""

from __future__ import annotations

import base64
import hashlib
import os
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import DaemonProcess, spawn_daemon

TOKEN = "files-attack-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = b"TOP-SECRET-7f3a9c1e-do-not-leak\n"
SECRET_HASH = "sha256:" + hashlib.sha256(SECRET).hexdigest()
SECRET_MARKERS = (
    SECRET.decode().strip(),
    base64.b64encode(SECRET).decode(),
    base64.b64encode(SECRET[:24]).decode()[:24],
)
#: Attacks that, correctly, name an ordinary path inside the workspace.
INSIDE_CASES = frozenset(
    {"backslash-dotdot", "fullwidth-dots", "one-dot-leader", "link-dir-dotdot"}
)
REFUSALS = {"path_outside_workspace", "symlink_escape", "parse_error", "path_not_found"}


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("attack")
    (root / "secret.txt").write_bytes(SECRET)
    (root / "outside").mkdir()
    (root / "outside" / "secret.txt").write_bytes(SECRET)
    ws = root / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "link_up").symlink_to("../../secret.txt")
    (ws / "link_file").symlink_to("../secret.txt")
    (ws / "link_abs").symlink_to(root / "secret.txt")
    (ws / "link_dir").symlink_to("../outside")
    (ws / "chain_a").symlink_to("chain_b")
    (ws / "chain_b").symlink_to("chain_c")
    (ws / "chain_c").symlink_to("../secret.txt")
    (ws / "loop_a").symlink_to("loop_b")
    (ws / "loop_b").symlink_to("loop_a")
    (ws / "dangling").symlink_to("../outside/created_by_attack.txt")
    (ws / "inside.txt").write_text("inside\n")
    return root


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Everything outside the workspace: file bytes, link targets, directory names."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == "ws" or rel.startswith("ws" + os.sep) or rel.startswith("state"):
            dirnames[:] = []
            continue
        for name in filenames:
            out[os.path.join(rel, name)] = Path(dirpath, name).read_bytes()
        for name in dirnames:
            out[os.path.join(rel, name) + "/"] = "dir"
    return out


@pytest.fixture(scope="module")
def daemon_proc(layout: Path) -> Iterator[DaemonProcess]:
    d = spawn_daemon(["--token", TOKEN], workspace=layout / "ws", state_dir=layout / "state")
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(daemon_proc: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=30) as c:
        yield c


def attacks(root: Path) -> list[tuple[str, str, set[str]]]:
    """``(id, path, kinds GET /file may answer)``."""
    outside = {"path_outside_workspace"}
    escape = {"symlink_escape"}
    return [
        ("dotdot", "../secret.txt", outside),
        ("dotdot-deep", "sub/../../secret.txt", outside),
        ("dotdot-many", "../" * 30 + "etc/passwd", outside),
        ("dotdot-trailing", "sub/..", {"parse_error"}),
        ("absolute-outside", str(root / "secret.txt"), outside),
        ("absolute-etc", "/etc/passwd", outside),
        ("absolute-proc", "/proc/self/root" + str(root / "secret.txt"), outside),
        ("backslash-dotdot", "..\\secret.txt", {"path_not_found"}),
        ("link-up-in-subdir", "sub/link_up", escape),
        ("link-relative", "link_file", escape),
        ("link-absolute", "link_abs", escape),
        ("link-dir", "link_dir/secret.txt", escape),
        # Lexical normalisation first: "link_dir/.." is the workspace root, never
        # <root>/outside/.. as the kernel would have it (which is where the secret is).
        ("link-dir-dotdot", "link_dir/../secret.txt", {"path_not_found"}),
        ("symlink-chain", "chain_a", escape),
        ("symlink-loop", "loop_a", escape),
        ("dangling-out", "dangling", escape),
        ("bidi-override", "txt.\u202eterces", outside),
        ("zero-width-dotdot", ".\u200b./secret.txt", outside),
        ("zero-width-joiner", "..\u200d/secret.txt", outside),
        ("nbsp", "..\u00a0/secret.txt", outside),
        ("bom-char", "\ufeff../secret.txt", outside),
        ("hangul-filler", "\u3164", outside),
        ("fullwidth-dots", "\uff0e\uff0e/secret.txt", {"path_not_found"}),
        ("one-dot-leader", "\u2024\u2024/secret.txt", {"path_not_found"}),
        ("nul-byte", "inside.txt\x00../secret.txt", outside),
        ("newline", "inside.txt\n../secret.txt", outside),
        ("dos-con", "CON", outside),
        ("dos-nul-ext", "nul.txt", outside),
        ("dos-com1", "sub/COM1", outside),
        ("triple-dot", ".../secret.txt", outside),
        ("trailing-dot", "secret.", outside),
        ("trailing-space", "secret ", outside),
        ("unc", "//server/share/secret.txt", outside),
        ("device-prefix", "\\\\?\\C:\\secret.txt", outside),
        ("device-prefix-slash", "//./secret.txt", outside),
        ("long-name", "a" * 300, {"parse_error"}),
        ("long-path", "a/" * 2100 + "b", {"parse_error"}),
        ("surrogate", "\udc80../secret.txt", outside | {"parse_error"}),
    ]


def remove_inside(workspace: Path, rel: str) -> None:
    target = workspace / rel
    assert target.resolve().parent == workspace.resolve()
    target.unlink()


def leaked(text: str) -> bool:
    return any(marker in text for marker in SECRET_MARKERS)


def check_refused(response: httpx.Response, allowed: set[str], what: str = "") -> str:
    assert response.status_code in (400, 403, 404, 409, 413, 422), (
        what,
        response.status_code,
        response.text,
    )
    body = response.json()
    if "errorKind" in body:
        assert body["errorKind"] in allowed, (what, body)
        return str(body["errorKind"])
    return str(body.get("code"))


async def test_path_attack_table_never_escapes(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, layout: Path
) -> None:
    before = snapshot(layout)
    table = attacks(layout)
    refused = 0
    for case_id, path, kinds in table:
        if "\udc80" in path:
            continue  # not encodable as a URL or JSON string; covered below
        responses: list[tuple[str, httpx.Response]] = [
            ("file", await client.get("/file", params={"path": path})),
            ("bytes", await client.get("/file/bytes", params={"path": path})),
            ("list", await client.get("/list", params={"path": path})),
            ("glob", await client.get("/glob", params={"pattern": "**", "cwd": path})),
            (
                "create",
                await client.post(
                    "/file/write", json={"path": path, "content": "pwned\n", "mode": "create"}
                ),
            ),
            (
                "replace",
                await client.post(
                    "/file/write",
                    json={
                        "path": path,
                        "content": "pwned\n",
                        "mode": "replace",
                        "expectedHash": SECRET_HASH,
                    },
                ),
            ),
            (
                "edit",
                await client.post(
                    "/file/edit",
                    json={
                        "path": path,
                        "oldText": "TOP-SECRET",
                        "newText": "pwned",
                        "expectedHash": SECRET_HASH,
                    },
                ),
            ),
        ]
        for route, response in responses:
            assert not leaked(response.text), (case_id, route, response.text)
            assert response.status_code != 500, (case_id, route, response.text)
        kind = check_refused(responses[0][1], kinds)
        assert kind in kinds, (case_id, kind)
        for route, response in responses[1:]:
            allowed = REFUSALS | kinds
            if case_id == "dotdot-trailing" and route in ("list", "glob"):
                # "sub/.." is the workspace root: a legitimate directory.
                assert response.status_code == 200, response.text
                assert response.json().get("path", response.json().get("cwd")) in (".", "sub/..")
                continue
            if case_id in INSIDE_CASES:
                # Look-alikes are ordinary names *inside* the workspace.
                # A create may succeed (inside); the secret's hash never matches it.
                if route == "create":
                    assert response.status_code in (201, 404), response.text
                    if response.status_code == 201:
                        remove_inside(daemon_proc.workspace, response.json()["path"])
                    continue
                allowed = allowed | {"hash_mismatch"}
            check_refused(response, allowed, f"{case_id} {route}")
        stat = await client.get("/stat", params={"path": path})
        assert not leaked(stat.text)
        if stat.status_code == 200:
            # lstat of a link inside the workspace: the link itself, nothing of its target
            # (or the root itself for "sub/..").
            assert stat.json()["type"] == "symlink" or stat.json()["path"] in (".", path), (
                case_id,
                stat.text,
            )
        else:
            check_refused(stat, REFUSALS | kinds)
        refused += 1
    assert refused == len(table) - 1
    assert snapshot(layout) == before
    assert not (layout / "outside" / "created_by_attack.txt").exists()
    assert SECRET.decode().strip() not in daemon_proc.stderr()


async def test_url_encoded_traversal_in_the_raw_query(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, layout: Path
) -> None:
    before = snapshot(layout)
    raw_queries = {
        "%2e%2e/secret.txt": {"path_outside_workspace"},
        "%2e%2e%2fsecret.txt": {"path_outside_workspace"},
        "%2E%2E%2F%2E%2E%2Fsecret.txt": {"path_outside_workspace"},
        "..%2f..%2fsecret.txt": {"path_outside_workspace"},
        "%252e%252e%252fsecret.txt": {"path_not_found"},  # double-encoded: a literal name
        "%c0%ae%c0%ae/secret.txt": REFUSALS,  # overlong UTF-8 dots
        "%2e%2e%5csecret.txt": {"path_not_found"},
        "%00": {"path_outside_workspace", "parse_error"},
        "link%5fdir/secret.txt": {"symlink_escape"},
        urllib.parse.quote(str(layout / "secret.txt"), safe=""): {"path_outside_workspace"},
    }
    for raw, kinds in raw_queries.items():
        for route in ("/file", "/file/bytes", "/stat", "/list"):
            response = await client.get(f"{route}?path={raw}")
            assert not leaked(response.text), (raw, route)
            if route == "/file":
                assert check_refused(response, kinds) in kinds, (raw, response.text)
            else:
                check_refused(response, REFUSALS | kinds)
    assert snapshot(layout) == before


async def test_glob_never_walks_out_through_links(client: httpx.AsyncClient) -> None:
    for params in (
        {"pattern": "**"},
        {"pattern": "**/*", "includeIgnored": "1"},
        {"pattern": "**/secret.txt"},
        {"pattern": "link_dir/**"},
        {"pattern": "*/secret.txt"},
    ):
        response = await client.get("/glob", params=params)
        assert not leaked(response.text)
        if params["pattern"].startswith("link_dir/"):
            # The literal prefix is resolved like a cwd: refused, not walked.
            assert response.json()["errorKind"] == "symlink_escape", response.text
            continue
        assert response.status_code == 200, response.text
        matches = response.json()["matches"]
        assert not any(m.startswith("link_dir/") for m in matches), matches
        for link in ("link_file", "link_abs", "chain_a", "sub/link_up", "dangling", "loop_a"):
            assert link not in matches, (params, matches)
    listing = await client.get("/list", params={"path": "link_dir"})
    assert listing.json()["errorKind"] == "symlink_escape"


async def test_lone_surrogate_in_a_json_body_is_refused(client: httpx.AsyncClient) -> None:
    body = b'{"path":"\\udc80../secret.txt","content":"x","mode":"create"}'
    response = await client.post(
        "/file/write", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert not leaked(response.text)

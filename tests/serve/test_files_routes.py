"""Workspace file routes against the real daemon: reads, writes, edits, races, audit events.

The daemon runs with a bearer token because ``POST /file/write`` and ``POST /file/edit``
are strict routes (refused without a configured token).
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

TOKEN = "files-route-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NO_STORE = {"cache-control": "no-store", "x-content-type-options": "nosniff"}


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def daemon_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("files")
    d = spawn_daemon(["--token", TOKEN], workspace=root / "ws", state_dir=root / "state")
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(daemon_proc: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=30) as c:
        yield c


@pytest.fixture
def ws(daemon_proc: DaemonProcess, request: pytest.FixtureRequest) -> Path:
    """A fresh directory inside the workspace for one test."""
    name: str = request.node.name
    path: Path = daemon_proc.workspace / name.replace("[", "_").replace("]", "_")
    path.mkdir()
    return path


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def rel(daemon_proc: DaemonProcess, path: Path) -> str:
    return path.relative_to(daemon_proc.workspace).as_posix()


def assert_file_error(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["errorKind"] == kind and body["status"] == status, body
    assert isinstance(body["error"], str) and body["error"]
    assert set(body) <= {"errorKind", "error", "hint", "status"}
    for name, value in NO_STORE.items():
        assert response.headers[name] == value
    return body  # type: ignore[no-any-return]


async def new_client_id(client: httpx.AsyncClient) -> tuple[str, str]:
    response = await client.post("/session", json={"sessionScope": "thread"})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["sessionId"], body["clientId"]


# ---- reads ----------------------------------------------------------------------------------


async def test_read_text_reports_profile_and_whole_file_hash(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    raw = codecs.BOM_UTF8 + "één\r\ntwee\r\ndrie\r\n".encode()
    (ws / "nl.txt").write_bytes(raw)
    path = rel(daemon_proc, ws / "nl.txt")
    response = await client.get("/file", params={"path": path})
    assert response.status_code == 200
    for name, value in NO_STORE.items():
        assert response.headers[name] == value
    body = response.json()
    assert body["kind"] == "file" and body["path"] == path
    assert body["content"] == "één\r\ntwee\r\ndrie\r\n"
    assert (body["encoding"], body["bom"], body["lineEnding"]) == ("utf-8", True, "crlf")
    assert body["sizeBytes"] == len(raw) and body["hash"] == sha(raw)
    assert body["truncated"] is False and body["originalLineCount"] is None

    window = (await client.get("/file", params={"path": path, "line": "2", "limit": "1"})).json()
    assert window["content"] == "twee\r\n" and window["originalLineCount"] == 3
    assert window["truncated"] is True and window["hash"] == sha(raw)

    capped = (await client.get("/file", params={"path": path, "maxBytes": "3"})).json()
    assert capped["content"] == "é" and capped["returnedBytes"] == 2
    assert capped["truncated"] is True and capped["hash"] == sha(raw)


async def test_absolute_path_inside_the_workspace_is_answered_relative(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    (ws / "abs.txt").write_text("x")
    response = await client.get("/file", params={"path": str(ws / "abs.txt")})
    assert response.status_code == 200
    assert response.json()["path"] == rel(daemon_proc, ws / "abs.txt")
    assert str(daemon_proc.workspace) not in response.text


async def test_query_validation_is_parse_error(client: httpx.AsyncClient) -> None:
    body = assert_file_error(await client.get("/file"), 400, "parse_error")
    assert body["error"] == "path query parameter is required"
    assert_file_error(await client.get("/file/bytes"), 400, "parse_error")
    assert_file_error(await client.get("/stat"), 400, "parse_error")
    assert_file_error(await client.get("/glob"), 400, "parse_error")
    for query in (
        {"path": "a", "maxBytes": "abc"},
        {"path": "a", "maxBytes": "0"},
        {"path": "a", "maxBytes": "262145"},
        {"path": "a", "line": "0"},
        {"path": "a", "limit": "2001"},
        {"path": "a", "line": "-1"},
        {"path": "a", "cursor": "abc"},
    ):
        assert_file_error(await client.get("/file", params=query), 400, "parse_error")
    for query in (
        {"path": "a", "offset": "-1"},
        {"path": "a", "maxBytes": "262145"},
        {"path": "a", "offset": "1e3"},
    ):
        assert_file_error(await client.get("/file/bytes", params=query), 400, "parse_error")
    assert_file_error(
        await client.get("/list", params={"includeIgnored": "maybe"}), 400, "parse_error"
    )
    assert_file_error(await client.get("/glob", params={"pattern": "../*"}), 400, "parse_error")
    assert_file_error(
        await client.get("/glob", params={"pattern": "*", "maxResults": "50001"}),
        400,
        "parse_error",
    )
    assert_file_error(await client.get("/file", params={"path": "nope.txt"}), 404, "path_not_found")


async def test_binary_files_are_refused_as_text_and_served_as_bytes(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    raw = bytes(range(256)) * 4
    (ws / "blob.bin").write_bytes(raw)
    path = rel(daemon_proc, ws / "blob.bin")
    assert_file_error(await client.get("/file", params={"path": path}), 422, "binary_file")
    whole = await client.get("/file/bytes", params={"path": path})
    assert whole.status_code == 200
    body = whole.json()
    assert base64.b64decode(body["contentBase64"]) == raw
    assert body["hash"] == sha(raw) and body["truncated"] is False
    assert body["sizeBytes"] == body["returnedBytes"] == len(raw)
    part = (
        await client.get("/file/bytes", params={"path": path, "offset": "1000", "maxBytes": "10"})
    ).json()
    assert base64.b64decode(part["contentBase64"]) == raw[1000:1010]
    assert part["truncated"] is True and "hash" not in part and part["offset"] == 1000
    past = (await client.get("/file/bytes", params={"path": path, "offset": "5000"})).json()
    assert past["returnedBytes"] == 0 and past["contentBase64"] == ""
    current = sha(raw)
    edit = await client.post(
        "/file/edit",
        json={"path": path, "oldText": "a", "newText": "b", "expectedHash": current},
    )
    assert_file_error(edit, 422, "binary_file")
    assert (ws / "blob.bin").read_bytes() == raw
    assert_file_error(
        await client.get("/file/bytes", params={"path": rel(daemon_proc, ws)}), 400, "parse_error"
    )


async def test_oversized_files_need_a_window(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    line = "x" * 99 + "\n"
    raw = (line * 3000).encode()  # 300 000 bytes > 256 KiB
    (ws / "big.txt").write_bytes(raw)
    path = rel(daemon_proc, ws / "big.txt")
    assert_file_error(await client.get("/file", params={"path": path}), 413, "file_too_large")
    window = await client.get("/file", params={"path": path, "line": "2991", "limit": "20"})
    assert window.status_code == 200
    body = window.json()
    assert body["content"] == line * 10 and body["originalLineCount"] == 3000
    assert body["hash"] == sha(raw)
    chunk = (await client.get("/file/bytes", params={"path": path, "maxBytes": "262144"})).json()
    assert chunk["returnedBytes"] == 262144 and chunk["truncated"] is True
    assert "hash" not in chunk


async def test_stat_list_glob_and_ignore_rules(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    base = rel(daemon_proc, ws)
    (ws / ".gitignore").write_text("build/\n*.log\n")
    (ws / "build").mkdir()
    (ws / "build" / "out.txt").write_text("o")
    (ws / "app.log").write_text("l")
    (ws / "src").mkdir()
    (ws / "src" / "main.py").write_text("print()\n")
    (ws / "link").symlink_to("src/main.py")

    st = (await client.get("/stat", params={"path": f"{base}/src/main.py"})).json()
    assert st == {
        "kind": "stat",
        "path": f"{base}/src/main.py",
        "type": "file",
        "sizeBytes": 8,
        "modifiedMs": st["modifiedMs"],
    }
    assert (await client.get("/stat", params={"path": f"{base}/link"})).json()["type"] == "symlink"
    assert (await client.get("/stat", params={"path": "."})).json()["path"] == "."

    listing = (await client.get("/list", params={"path": base})).json()
    names = [e["name"] for e in listing["entries"]]
    assert names == sorted(names) and "build" not in names and "app.log" not in names
    assert {"name": "src", "kind": "directory", "ignored": False} in listing["entries"]
    everything = (await client.get("/list", params={"path": base, "includeIgnored": "1"})).json()
    assert {"name": "build", "kind": "directory", "ignored": True} in everything["entries"]
    assert {"name": "app.log", "kind": "file", "ignored": True} in everything["entries"]

    found = (await client.get("/glob", params={"pattern": "**/*.py", "cwd": base})).json()
    assert found["matches"] == [f"{base}/src/main.py"] and found["count"] == 1
    assert found["cwd"] == base and found["truncated"] is False
    hidden = (await client.get("/glob", params={"pattern": "**/out.txt", "cwd": base})).json()
    assert hidden["matches"] == []
    shown = (
        await client.get(
            "/glob", params={"pattern": "**/out.txt", "cwd": base, "includeIgnored": "true"}
        )
    ).json()
    assert shown["matches"] == [f"{base}/build/out.txt"]
    capped = (
        await client.get("/glob", params={"pattern": "**", "cwd": base, "maxResults": "2"})
    ).json()
    assert capped["count"] == 2 and capped["truncated"] is True

    # Explicit writes to ignored paths are allowed and say so.
    created = await client.post(
        "/file/write", json={"path": f"{base}/build/new.txt", "content": "n", "mode": "create"}
    )
    assert created.status_code == 201 and created.json()["matchedIgnore"] == "directory"
    log_file = await client.post(
        "/file/write", json={"path": f"{base}/x.log", "content": "n", "mode": "create"}
    )
    assert log_file.json()["matchedIgnore"] == "file"


#: Nine ``*?`` pairs: CPython's backtracking ``re`` took hours on a 60-character name.
HOSTILE_GLOB = "*?" * 9 + "*Q"


@pytest.mark.timeout(60)  # a hang guard: before the fix these calls did not come back
async def test_a_hostile_glob_pattern_is_answered_and_stalls_nothing(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    base = rel(daemon_proc, ws)
    name = "a" * 60 + ".txt"
    (ws / name).write_text("x")
    found = await client.get("/glob", params={"pattern": HOSTILE_GLOB, "cwd": base})
    assert found.status_code == 200 and found.json()["matches"] == []
    hit = HOSTILE_GLOB[:-1] + "t"  # the same shape, ending in the name's last letter
    found = await client.get("/glob", params={"pattern": hit, "cwd": base})
    assert found.json()["matches"] == [f"{base}/{name}"]

    # The same line in an ignore file (which an agent in auto-edit can write).
    (ws / ".gitignore").write_text(HOSTILE_GLOB + "\n")
    listing = await client.get("/list", params={"path": base, "includeIgnored": "true"})
    assert listing.status_code == 200
    assert {"name": name, "kind": "file", "ignored": False} in listing.json()["entries"]
    (ws / ".gitignore").write_text(HOSTILE_GLOB + "\n" + hit + "\n")
    listing = await client.get("/list", params={"path": base, "includeIgnored": "true"})
    assert {"name": name, "kind": "file", "ignored": True} in listing.json()["entries"]
    assert (await client.get("/health")).status_code == 200


async def test_glob_patterns_are_bounded_in_bytes(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    base = rel(daemon_proc, ws)
    (ws / "x.txt").write_text("x")
    fits = await client.get("/glob", params={"pattern": "*" + "?" * 1019 + "*", "cwd": base})
    assert fits.status_code == 200
    for pattern in ("*" * 1025, "é" * 513):  # 1025 and 1026 bytes
        body = assert_file_error(
            await client.get("/glob", params={"pattern": pattern, "cwd": base}),
            400,
            "parse_error",
        )
        assert body["error"] == "pattern must be 1 to 1024 bytes (UTF-8)"
    # An ignore file's line past the bound is skipped, the others apply.
    (ws / ".gitignore").write_text("x" + "*" * 1024 + "\nnothing\n")
    listing = (await client.get("/list", params={"path": base, "includeIgnored": "1"})).json()
    assert {"name": "x.txt", "kind": "file", "ignored": False} in listing["entries"]
    (ws / ".gitignore").write_text("x" + "*" * 1023 + "\n")
    listing = (await client.get("/list", params={"path": base, "includeIgnored": "1"})).json()
    assert {"name": "x.txt", "kind": "file", "ignored": True} in listing["entries"]


# ---- writes and edits ---------------------------------------------------------------------


async def test_create_then_replace_then_edit(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    path = rel(daemon_proc, ws / "new.ts")
    created = await client.post(
        "/file/write", json={"path": path, "content": "export {};\n", "mode": "create"}
    )
    assert created.status_code == 201
    for name, value in NO_STORE.items():
        assert created.headers[name] == value
    body = created.json()
    assert body == {
        "kind": "file_write",
        "path": path,
        "mode": "create",
        "created": True,
        "sizeBytes": 11,
        "hash": sha(b"export {};\n"),
        "encoding": "utf-8",
        "bom": False,
        "lineEnding": "lf",
        "matchedIgnore": None,
    }
    assert (ws / "new.ts").read_bytes() == b"export {};\n"

    again = await client.post(
        "/file/write", json={"path": path, "content": "other", "mode": "create"}
    )
    assert_file_error(again, 409, "file_already_exists")
    assert (ws / "new.ts").read_bytes() == b"export {};\n"

    missing = await client.post(
        "/file/write", json={"path": path, "content": "x", "mode": "replace"}
    )
    assert_file_error(missing, 400, "parse_error")
    malformed = await client.post(
        "/file/write",
        json={"path": path, "content": "x", "mode": "replace", "expectedHash": "sha256:ABC"},
    )
    assert_file_error(malformed, 400, "parse_error")
    stale = await client.post(
        "/file/write",
        json={"path": path, "content": "x", "mode": "replace", "expectedHash": sha(b"old")},
    )
    assert_file_error(stale, 409, "hash_mismatch")
    assert (ws / "new.ts").read_bytes() == b"export {};\n"

    replaced = await client.post(
        "/file/write",
        json={
            "path": path,
            "content": "export const value = 2;\n",
            "mode": "replace",
            "expectedHash": body["hash"],
        },
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["created"] is False and replaced.json()["mode"] == "replace"
    new_hash = replaced.json()["hash"]
    assert new_hash == sha((ws / "new.ts").read_bytes())

    edit = {"path": path, "newText": "3", "expectedHash": new_hash}
    assert_file_error(
        await client.post("/file/edit", json={**edit, "oldText": "nope"}), 422, "text_not_found"
    )
    assert_file_error(
        await client.post("/file/edit", json={**edit, "oldText": "e"}),
        422,
        "ambiguous_text_match",
    )
    assert_file_error(
        await client.post("/file/edit", json={**edit, "oldText": ""}), 400, "parse_error"
    )
    no_hash = {"path": path, "oldText": "2", "newText": "3"}
    assert_file_error(await client.post("/file/edit", json=no_hash), 400, "parse_error")
    edited = await client.post("/file/edit", json={**edit, "oldText": "2"})
    assert edited.status_code == 200, edited.text
    out = edited.json()
    assert out["kind"] == "file_edit" and out["replacements"] == 1
    assert (ws / "new.ts").read_bytes() == b"export const value = 3;\n"
    assert out["hash"] == sha(b"export const value = 3;\n")
    assert_file_error(
        await client.post("/file/edit", json={**edit, "oldText": "3"}), 409, "hash_mismatch"
    )


async def test_bad_write_bodies(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    path = rel(daemon_proc, ws / "f.txt")
    for body in (
        {"path": path, "content": "x", "mode": "append"},
        {"path": path, "content": 5, "mode": "create"},
        {"path": 5, "content": "x", "mode": "create"},
        {"content": "x", "mode": "create"},
        {"path": path, "content": "x", "mode": "create", "lineEnding": "cr"},
        {"path": path, "content": "x", "mode": "create", "bom": "yes"},
        {"path": path, "content": "x", "mode": "create", "encoding": "rot13"},
        {"path": ".", "content": "x", "mode": "create"},
    ):
        assert_file_error(await client.post("/file/write", json=body), 400, "parse_error")
    assert not (ws / "f.txt").exists()
    broken = await client.post(
        "/file/write", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert broken.status_code == 400
    assert broken.json() == {"error": "Invalid JSON in request body"}
    for name, value in NO_STORE.items():
        assert broken.headers[name] == value
    nobody = await client.post(
        "/file/write",
        json={"path": path, "content": "x", "mode": "create"},
        headers={"X-Qwen-Client-Id": "client_unknown"},
    )
    assert nobody.status_code == 400
    assert nobody.json()["code"] == "invalid_client_id"
    assert nobody.json()["clientId"] == "client_unknown"
    assert not (ws / "f.txt").exists()


async def test_oversized_write_is_refused(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    path = rel(daemon_proc, ws / "huge.txt")
    body = {"path": path, "content": "y" * (5 * 1024 * 1024 + 1), "mode": "create"}
    assert_file_error(await client.post("/file/write", json=body), 413, "file_too_large")
    assert not (ws / "huge.txt").exists()
    assert names(ws) == []  # no temp file left behind


async def test_crlf_bom_and_encodings_round_trip(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    target = ws / "win.txt"
    target.write_bytes(codecs.BOM_UTF8 + b"alpha\r\nbeta\r\n")
    path = rel(daemon_proc, target)
    read = (await client.get("/file", params={"path": path})).json()
    # The client sends LF text back; the file keeps its BOM and CRLF.
    replaced = await client.post(
        "/file/write",
        json={
            "path": path,
            "content": "alpha\nbeta\ngamma\n",
            "mode": "replace",
            "expectedHash": read["hash"],
        },
    )
    assert replaced.status_code == 200, replaced.text
    assert target.read_bytes() == codecs.BOM_UTF8 + b"alpha\r\nbeta\r\ngamma\r\n"
    out = replaced.json()
    assert (out["bom"], out["lineEnding"], out["encoding"]) == (True, "crlf", "utf-8")

    # An edit written with LF still matches the CRLF spelling and keeps CRLF.
    edited = await client.post(
        "/file/edit",
        json={
            "path": path,
            "oldText": "beta\ngamma",
            "newText": "BETA\nGAMMA",
            "expectedHash": out["hash"],
        },
    )
    assert edited.status_code == 200, edited.text
    assert target.read_bytes() == codecs.BOM_UTF8 + b"alpha\r\nBETA\r\nGAMMA\r\n"

    # Explicit overrides win.
    plain = await client.post(
        "/file/write",
        json={
            "path": path,
            "content": "one\r\ntwo\r\n",
            "mode": "replace",
            "expectedHash": edited.json()["hash"],
            "bom": False,
            "lineEnding": "lf",
        },
    )
    assert plain.status_code == 200, plain.text
    assert target.read_bytes() == b"one\ntwo\n"

    utf16 = rel(daemon_proc, ws / "wide.txt")
    created = await client.post(
        "/file/write",
        json={
            "path": utf16,
            "content": "héllo\n",
            "mode": "create",
            "encoding": "utf-16le",
            "bom": True,
        },
    )
    assert created.status_code == 201, created.text
    assert (ws / "wide.txt").read_bytes() == codecs.BOM_UTF16_LE + "héllo\n".encode("utf-16-le")
    back = (await client.get("/file", params={"path": utf16})).json()
    assert (back["content"], back["encoding"], back["bom"]) == ("héllo\n", "utf-16le", True)

    (ws / "latin.txt").write_bytes(b"caf\xe9 au lait\n")
    latin = rel(daemon_proc, ws / "latin.txt")
    seen = (await client.get("/file", params={"path": latin})).json()
    assert seen["encoding"] == "iso-8859-1"
    changed = await client.post(
        "/file/edit",
        json={"path": latin, "oldText": "lait", "newText": "LAIT", "expectedHash": seen["hash"]},
    )
    assert changed.status_code == 200, changed.text
    assert (ws / "latin.txt").read_bytes() == b"caf\xe9 au LAIT\n"


# ---- races ------------------------------------------------------------------------------------


async def post_into(
    results: dict[str, httpx.Response], key: str, client: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    results[key] = await client.post("/file/write", json=body)


async def read_until(
    done: trio.Event, reader: httpx.AsyncClient, path: str, known: set[str], torn: list[str]
) -> None:
    """Read ``path`` until ``done``; record any content whose hash is not a known version."""
    while not done.is_set():
        r = await reader.get("/file", params={"path": path})
        if r.status_code == 200:
            body = r.json()
            if body["hash"] not in known or sha(body["content"].encode()) not in known:
                torn.append(body["hash"])
        else:
            assert r.json()["errorKind"] == "hash_mismatch", r.text


async def test_two_clients_racing_replace_one_wins_never_torn(
    daemon_proc: DaemonProcess, ws: Path
) -> None:
    target = ws / "race.txt"
    path = rel(daemon_proc, target)
    size = 200 * 1024
    async with (
        httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=60) as a,
        httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=60) as b,
        httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=60) as reader,
    ):
        _, id_a = await new_client_id(a)
        _, id_b = await new_client_id(b)
        a.headers["X-Qwen-Client-Id"] = id_a
        b.headers["X-Qwen-Client-Id"] = id_b
        start = ("s" * (size - 1) + "\n").encode()
        target.write_bytes(start)
        known = {sha(start)}
        torn: list[str] = []
        for round_no in range(12):
            current = sha(target.read_bytes())
            contents = {
                "a": (f"{round_no}a" * size)[: size - 1] + "\n",
                "b": (f"{round_no}b" * size)[: size - 1] + "\n",
            }
            known.update(sha(c.encode()) for c in contents.values())
            results: dict[str, httpx.Response] = {}
            done = trio.Event()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_until, done, reader, path, known, torn)
                async with trio.open_nursery() as writers:
                    for name, c in (("a", a), ("b", b)):
                        body = {
                            "path": path,
                            "content": contents[name],
                            "mode": "replace",
                            "expectedHash": current,
                        }
                        writers.start_soon(post_into, results, name, c, body)
                done.set()
            statuses = sorted(r.status_code for r in results.values())
            assert statuses == [200, 409], {k: r.text for k, r in results.items()}
            winner = next(k for k, r in results.items() if r.status_code == 200)
            loser = next(k for k, r in results.items() if r.status_code == 409)
            assert results[loser].json()["errorKind"] == "hash_mismatch"
            assert target.read_bytes() == contents[winner].encode()
            assert results[winner].json()["hash"] == sha(contents[winner].encode())
        assert torn == []
        assert names(ws) == ["race.txt"]


async def test_two_clients_racing_create_one_wins(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    for round_no in range(10):
        path = rel(daemon_proc, ws / f"c{round_no}.txt")
        out: dict[str, httpx.Response] = {}
        async with trio.open_nursery() as nursery:
            for content in ("first", "second"):
                body = {"path": path, "content": content, "mode": "create"}
                nursery.start_soon(post_into, out, content, client, body)
        results = list(out.values())
        assert sorted(r.status_code for r in results) == [201, 409]
        loser = next(r for r in results if r.status_code == 409)
        assert loser.json()["errorKind"] == "file_already_exists"
        assert (ws / f"c{round_no}.txt").read_text() in ("first", "second")


# ---- audit events -------------------------------------------------------------------------


async def test_writes_and_edits_publish_audit_events_with_the_originator(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess, ws: Path
) -> None:
    sid, client_id = await new_client_id(client)
    other_sid, _ = await new_client_id(client)
    path = rel(daemon_proc, ws / "audited.txt")
    headers = {"X-Qwen-Client-Id": client_id}
    created = await client.post(
        "/file/write", json={"path": path, "content": "v1\n", "mode": "create"}, headers=headers
    )
    assert created.status_code == 201
    edited = await client.post(
        "/file/edit",
        json={
            "path": path,
            "oldText": "v1",
            "newText": "v2",
            "expectedHash": created.json()["hash"],
        },
        headers=headers,
    )
    assert edited.status_code == 200
    replaced = await client.post(
        "/file/write",
        json={
            "path": path,
            "content": "v3\n",
            "mode": "replace",
            "expectedHash": edited.json()["hash"],
        },
    )
    assert replaced.status_code == 200
    for session_id in (sid, other_sid):
        with trio.fail_after(15):
            async with client.stream(
                "GET", f"/session/{session_id}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(
                    stream,
                    lambda e: (
                        e["type"] == "workspace_file_changed"
                        and e["data"]["path"] == path
                        and e["data"]["action"] == "replaced"
                    ),
                )
        audit = [
            e for e in events if e["type"] == "workspace_file_changed" and e["data"]["path"] == path
        ]
        assert [e["data"]["action"] for e in audit] == ["created", "edited", "replaced"]
        assert audit[0]["data"] == {
            "path": path,
            "action": "created",
            "hash": sha(b"v1\n"),
            "size": 3,
            "matchedIgnore": None,
        }
        assert audit[0]["originatorClientId"] == client_id
        assert audit[1]["originatorClientId"] == client_id
        assert "originatorClientId" not in audit[2]
        assert audit[2]["data"]["hash"] == sha(b"v3\n")
        assert json.dumps(audit).count(str(daemon_proc.workspace)) == 0

"""BaseClientHandler defaults: real files, precise JSON-RPC errors."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from acp.errors import INVALID_PARAMS, METHOD_NOT_FOUND, RESOURCE_NOT_FOUND, HandlerError
from acp.handler import BaseClientHandler, ClientHandler
from acp.schema import (
    CancelledPermissionOutcome,
    ReadTextFileParams,
    RequestPermissionParams,
    TerminalIdParams,
    ToolCallFields,
    WriteTextFileParams,
)


def read(path: Path | str, line: int | None = None, limit: int | None = None) -> ReadTextFileParams:
    return ReadTextFileParams(session_id="s", path=str(path), line=line, limit=limit)


@pytest.mark.parametrize(
    ("line", "limit", "expected"),
    [
        (None, None, "a\nb\nc\nd\n"),
        (2, None, "b\nc\nd\n"),
        (2, 2, "b\nc\n"),
        (None, 1, "a\n"),
        (9, None, ""),
        (4, 5, "d\n"),
    ],
)
async def test_read_text_file_line_and_limit(
    tmp_path: Path, line: int | None, limit: int | None, expected: str
) -> None:
    (tmp_path / "f.txt").write_text("a\nb\nc\nd\n")
    assert (
        await BaseClientHandler().read_text_file(read(tmp_path / "f.txt", line, limit)) == expected
    )


@pytest.mark.parametrize(
    ("path", "code"),
    [("relative.txt", INVALID_PARAMS), ("/definitely/not/here.txt", RESOURCE_NOT_FOUND)],
)
async def test_read_errors(path: str, code: int) -> None:
    with pytest.raises(HandlerError) as exc_info:
        await BaseClientHandler().read_text_file(read(path))
    assert exc_info.value.code == code


async def test_read_a_directory_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(HandlerError) as exc_info:
        await BaseClientHandler().read_text_file(read(tmp_path))
    assert exc_info.value.code == INVALID_PARAMS


async def test_write_creates_the_file_and_its_folders(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "f.txt"
    params = WriteTextFileParams(session_id="s", path=str(target), content="héllo\n")
    await BaseClientHandler().write_text_file(params)
    assert target.read_text(encoding="utf-8") == "héllo\n"
    with pytest.raises(HandlerError) as exc_info:
        await BaseClientHandler().write_text_file(
            WriteTextFileParams(session_id="s", path="rel.txt", content="")
        )
    assert exc_info.value.code == INVALID_PARAMS


async def test_defaults_cancel_permissions_and_refuse_unknown_methods() -> None:
    handler = BaseClientHandler()
    assert isinstance(handler, ClientHandler)
    params = RequestPermissionParams(
        session_id="s", tool_call=ToolCallFields(tool_call_id="c"), options=[]
    )
    outcome = await handler.request_permission(params, msgspec.Raw(b"{}"))
    assert outcome == CancelledPermissionOutcome()
    with pytest.raises(HandlerError) as exc_info:
        await handler.ext_request("craft/x", msgspec.Raw(b"{}"))
    assert exc_info.value.code == METHOD_NOT_FOUND
    with pytest.raises(HandlerError, match="terminals are not available"):
        await handler.terminal_output(TerminalIdParams(session_id="s", terminal_id="t"))

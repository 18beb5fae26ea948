"""Credential persistence: private modes, atomic replacement, failures without secrets."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from serve.deviceflow.store import (
    PersistError,
    credential_record,
    credentials_path,
    save_credentials,
)

TOKENS = {
    "access_token": "AT-1",
    "refresh_token": "RT-1",
    "token_type": "bearer",
    "expires_in": 3600,
    "resource_url": "portal.example",
    "unexpected": "dropped",
}


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_credentials_are_written_private(tmp_path: Path) -> None:
    path = save_credentials(str(tmp_path), "corp", TOKENS, 1_000)
    assert path == credentials_path(str(tmp_path), "corp")
    assert mode(path) == 0o600
    assert mode(os.path.dirname(path)) == 0o700
    assert json.loads(Path(path).read_text()) == {
        "v": 1,
        "providerId": "corp",
        "accessToken": "AT-1",
        "tokenType": "bearer",
        "refreshToken": "RT-1",
        "resourceUrl": "portal.example",
        "expiresAt": 1_000 + 3_600_000,
        "obtainedAt": 1_000,
    }
    assert os.listdir(os.path.dirname(path)) == ["corp.json"]  # no temporary left behind


def test_a_second_grant_replaces_the_first(tmp_path: Path) -> None:
    save_credentials(str(tmp_path), "corp", TOKENS, 1)
    path = save_credentials(str(tmp_path), "corp", {"access_token": "AT-2"}, 2)
    assert json.loads(Path(path).read_text())["accessToken"] == "AT-2"
    assert mode(path) == 0o600


def test_an_existing_loose_directory_is_tightened(tmp_path: Path) -> None:
    (tmp_path / "credentials").mkdir(mode=0o755)
    path = save_credentials(str(tmp_path), "corp", TOKENS, 1)
    assert mode(os.path.dirname(path)) == 0o700


def test_failure_is_a_persist_error_without_the_token(tmp_path: Path) -> None:
    (tmp_path / "credentials").write_text("not a directory")
    with pytest.raises(PersistError) as failed:
        save_credentials(str(tmp_path), "corp", TOKENS, 1)
    assert "AT-1" not in str(failed.value)
    assert str(tmp_path) not in str(failed.value)  # the path goes to the log, not clients
    assert failed.value.path.endswith("corp.json")


def test_record_defaults() -> None:
    record = credential_record("p", {"access_token": "x", "expires_in": True}, 5)
    assert record == {
        "v": 1,
        "providerId": "p",
        "accessToken": "x",
        "tokenType": "Bearer",
        "obtainedAt": 5,
    }

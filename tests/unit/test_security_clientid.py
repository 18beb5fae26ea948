"""X-Qwen-Client-Id syntax and the invalid_client_id bodies."""

from __future__ import annotations

import msgspec
import pytest

from serve.http.security.clientid import (
    INVALID_CLIENT_ID_BODY,
    InvalidClientId,
    is_valid_client_id,
    unknown_session_client_body,
    unknown_workspace_client_body,
    validate_client_id,
)

VALID = [
    "a",
    "client_3f2a9c1e-0b7d-4f55-9d1e-2b1f9b0c7a11",
    "A.b_c:d-e",
    "0",
    "x" * 128,
    "...",
    ":::",
    "-",
]
INVALID = [
    "x" * 129,
    "x" * 100_000,
    " a",
    "a ",
    "a b",
    "a\tb",
    "a\r\nX-Evil: 1",
    "a\n",
    "a/b",
    "a@b",
    "a%20b",
    "a,b",
    "a;b",
    "é",
    "client\u212a",  # KELVIN SIGN
    "ａ",  # full-width a
    "١٢٣",  # Arabic-Indic digits are \d in Unicode regexes
    "a\x00",
    '"a"',
]


@pytest.mark.parametrize("value", VALID)
def test_valid_ids_pass_unchanged(value: str) -> None:
    assert is_valid_client_id(value)
    assert validate_client_id(value) == value


@pytest.mark.parametrize("value", [None, ""])
def test_absent_or_empty_is_anonymous(value: str | None) -> None:
    assert validate_client_id(value) is None


@pytest.mark.parametrize("value", INVALID)
def test_invalid_ids_raise(value: str) -> None:
    assert not is_valid_client_id(value)
    with pytest.raises(InvalidClientId) as info:
        validate_client_id(value)
    assert info.value.value == value
    assert str(info.value) == INVALID_CLIENT_ID_BODY.error


def test_syntax_error_body() -> None:
    assert INVALID_CLIENT_ID_BODY.encode() == (
        b'{"error":"`X-Qwen-Client-Id` must be a non-empty token of 128 characters or fewer",'
        b'"code":"invalid_client_id"}'
    )


def test_unknown_session_client_body() -> None:
    body = msgspec.to_builtins(unknown_session_client_body("s-1", "client_x"))
    assert body == {
        "error": 'Client id "client_x" is not registered on session "s-1"',
        "code": "invalid_client_id",
        "sessionId": "s-1",
        "clientId": "client_x",
    }


def test_unknown_workspace_client_body() -> None:
    body = unknown_workspace_client_body("client_x")
    assert msgspec.json.decode(body.encode()) == {
        "error": 'Client id "client_x" is not registered for this workspace',
        "code": "invalid_client_id",
        "clientId": "client_x",
    }

"""The errorKind → status table (serve/errors), the error body, and the errno mapping."""

from __future__ import annotations

import errno

import pytest

from serve.errors import FS_STATUS, fs_error
from serve.workspaces.files.errors import (
    ERROR_KINDS,
    FsConflictError,
    FsDeniedError,
    FsIoError,
    FsLimitError,
    FsNotFoundError,
    FsRequestError,
    WorkspaceFsError,
    from_os_error,
    make_error,
)

# Verbatim from spec §4.5.
SPEC_TABLE = {
    "path_outside_workspace": 400,
    "symlink_escape": 400,
    "parse_error": 400,
    "path_not_found": 404,
    "hash_mismatch": 409,
    "file_already_exists": 409,
    "file_too_large": 413,
    "binary_file": 422,
    "text_not_found": 422,
    "ambiguous_text_match": 422,
    "untrusted_workspace": 403,
    "permission_denied": 403,
    "io_error": 503,
    "internal_error": 500,
}


def test_status_table_is_the_spec_table() -> None:
    assert dict(FS_STATUS) == SPEC_TABLE
    assert set(FS_STATUS) == ERROR_KINDS


def test_the_domain_error_carries_no_http_status() -> None:
    err = make_error("hash_mismatch", "expected a, found b")
    assert not hasattr(err, "status") and not hasattr(err, "to_body")


def test_body_shape() -> None:
    err = make_error("hash_mismatch", "expected a, found b", "re-read the file")
    assert fs_error(err).body == {
        "errorKind": "hash_mismatch",
        "error": "expected a, found b",
        "hint": "re-read the file",
        "status": 409,
    }
    assert fs_error(make_error("path_not_found", "gone")).body == {
        "errorKind": "path_not_found",
        "error": "gone",
        "status": 404,
    }


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("parse_error", FsRequestError),
        ("symlink_escape", FsRequestError),
        ("path_not_found", FsNotFoundError),
        ("hash_mismatch", FsConflictError),
        ("file_too_large", FsLimitError),
        ("untrusted_workspace", FsDeniedError),
        ("io_error", FsIoError),
    ],
)
def test_subclass_says_who_failed(kind: str, cls: type[WorkspaceFsError]) -> None:
    err = make_error(kind, "m")  # type: ignore[arg-type]
    assert type(err) is cls
    assert isinstance(err, WorkspaceFsError)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown"):
        WorkspaceFsError("nope", "m")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (errno.ENOENT, "path_not_found"),
        (errno.EACCES, "permission_denied"),
        (errno.EPERM, "permission_denied"),
        (errno.ELOOP, "symlink_escape"),
        (errno.EISDIR, "parse_error"),
        (errno.ENOTDIR, "parse_error"),
        (errno.ENOSPC, "io_error"),
        (errno.EIO, "io_error"),
        (errno.ENAMETOOLONG, "io_error"),
        (errno.EMFILE, "io_error"),
        (errno.EXDEV, "io_error"),
    ],
)
def test_errno_mapping(code: int, kind: str) -> None:
    err = from_os_error(OSError(code, "boom", "/host/abs/path"), "src/a.txt", "read")
    assert err.kind == kind
    assert "src/a.txt" in err.message
    assert "/host/abs/path" not in err.message

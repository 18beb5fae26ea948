"""The one table from domain errors to a neutral wire error, and its REST rendering.

Theory of operation
-------------------
Domain packages raise their own exceptions and know no transport: who failed is the
exception's class, what the client reads is its ``message``/``code``/fields. This package
is the only place that decides the wire *status*, *body* and *headers* of each family
(:mod:`.table`): session errors (``serve.sessions.errors``), workspace file-system errors
(``serve.workspaces.files.errors``, the spec §4.5 errorKind table), settings-file errors
(``serve.workspaces.state.settings_file``) and the ACP client's errors (``acp.errors``),
and which codes of a failed turn are retryable. A :class:`WireError` is neutral (no HTTP
framework, no JSON-RPC); :func:`rest` renders it for the REST front (``serve.http.errors``
turns it into its ``ApiError``); :func:`jsonrpc` renders it for the ``/acp`` front
(:mod:`.jsonrpc`: ``code``, ``message``, ``data`` with ``httpStatus``), and
:func:`rpc_error` is the ``/acp`` front's one entry from an exception to that rendering.
A counted vote is not an exception: the mediator answers its domain result and
:mod:`.votes` renders it (``vote_wire``, ``elicitation_wire``), so no domain package builds
a status.

Dependency position: it imports the domain's exception modules and ``acp.errors``; the
fronts import it; no domain package does (``tests/test_architecture.py``).
"""

from serve.errors.jsonrpc import RpcWire, jsonrpc, jsonrpc_file, rpc_error
from serve.errors.table import (
    FS_STATUS,
    RETRYABLE_TURN_CODES,
    SESSION_ERRORS,
    SETTINGS_FILE_STATUS,
    TURN_RETRY_AFTER,
    WireError,
    fs_error,
    rest,
    settings_file_error,
    wire_error,
    workspace_fs_error,
)

__all__ = [
    "FS_STATUS",
    "RETRYABLE_TURN_CODES",
    "SESSION_ERRORS",
    "SETTINGS_FILE_STATUS",
    "TURN_RETRY_AFTER",
    "RpcWire",
    "WireError",
    "fs_error",
    "jsonrpc",
    "jsonrpc_file",
    "rest",
    "rpc_error",
    "settings_file_error",
    "wire_error",
    "workspace_fs_error",
]

"""Workspace MCP configuration: ``<workspace>/.qwen/settings.json`` → typed server entries.

Theory of operation
-------------------
qwen-code keeps MCP servers in the workspace settings file under ``mcpServers``, an
object whose key order is the declaration order (which budget refusals follow)::

    {"mcpServers": {
        "docs":  {"command": "node", "args": ["docs.js"], "env": {"K": "$HOME"}, "cwd": "."},
        "web":   {"httpUrl": "https://mcp.example/mcp", "headers": {"Authorization": "..."}},
        "old":   {"url": "https://mcp.example/sse"}},
     "disabledMcpServers": ["old"],
     "mcp": {"allowed": [...], "excluded": [...]}}

Transports: ``command`` → stdio; ``httpUrl`` (or ``url`` with ``"type": "http"``) →
streamable HTTP; ``url`` otherwise → SSE (qwen-code's convention). ``$VAR`` / ``${VAR}``
in string values are expanded from the daemon's environment (unknown names are left as
written), the way qwen-code resolves settings. ``//`` and ``/* */`` comments are allowed.

A server is *disabled by config* when it is listed in ``disabledMcpServers`` or
``mcp.excluded``, not listed in a present ``mcp.allowed``, or has ``"disabled": true``.
An entry that is not an object or names no transport is kept as an *invalid* entry (so
the status route can say so) and is never started or handed to an agent.

Everything here is pure: :func:`parse_settings` takes bytes; :func:`load_config` is the
one function that touches the disk (call it in a worker thread).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

SETTINGS_RELATIVE_PATH = os.path.join(".qwen", "settings.json")
MAX_SETTINGS_BYTES = 4 * 2**20
MAX_SERVERS = 256

Transport = Literal["stdio", "http", "sse", "unknown"]

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


class McpServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One configured MCP server. ``invalid`` holds why it cannot be used, if it cannot."""

    name: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    description: str | None = None
    disabled: bool = False
    invalid: str | None = None

    @property
    def usable(self) -> bool:
        return self.invalid is None and not self.disabled


class McpConfig(msgspec.Struct, frozen=True):
    """The workspace's servers in declaration order, plus file-level problems."""

    servers: tuple[McpServerConfig, ...] = ()
    error: str | None = None

    def get(self, name: str) -> McpServerConfig | None:
        for server in self.servers:
            if server.name == name:
                return server
        return None


# ---- parsing ------------------------------------------------------------------------------


def strip_json_comments(text: str) -> str:
    """Remove ``//`` and ``/* */`` comments outside strings (settings files carry them)."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if ch == '"':
                in_string = False
            i += 1
            continue
        if ch == '"':
            in_string = True
            out.append(ch)
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def expand_vars(value: str, environ: Mapping[str, str]) -> str:
    """``$VAR`` / ``${VAR}`` → its value; unknown names stay as written."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return environ.get(name, m.group(0))

    return _VAR.sub(sub, value)


def _str_list(value: object) -> list[str] | None:
    if not isinstance(value, list):
        return None
    out = [v for v in value if isinstance(v, str)]
    return out if len(out) == len(value) else None


def _pairs(value: object, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...] | None:
    if value is None:
        return ()
    if not isinstance(value, dict):
        return None
    out: list[tuple[str, str]] = []
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str | int | float | bool):
            return None
        text = item if isinstance(item, str) else msgspec.json.encode(item).decode()
        out.append((key, expand_vars(text, environ)))
    return tuple(out)


def _server(
    name: str, raw: object, disabled: bool, workspace: str, environ: Mapping[str, str]
) -> McpServerConfig:
    if not isinstance(raw, dict):
        return McpServerConfig(name=name, transport="unknown", invalid="entry is not an object")
    description = raw.get("description") if isinstance(raw.get("description"), str) else None
    disabled = disabled or raw.get("disabled") is True
    command = raw.get("command")
    if command is not None:
        if not isinstance(command, str) or not command.strip():
            return _invalid(name, "stdio", "`command` must be a non-empty string")
        args = _str_list(raw.get("args", []))
        if args is None:
            return _invalid(name, "stdio", "`args` must be an array of strings")
        env = _pairs(raw.get("env"), environ)
        if env is None:
            return _invalid(name, "stdio", "`env` must be an object of strings")
        cwd_raw = raw.get("cwd")
        if cwd_raw is not None and not isinstance(cwd_raw, str):
            return _invalid(name, "stdio", "`cwd` must be a string")
        cwd = os.path.join(workspace, expand_vars(cwd_raw, environ)) if cwd_raw else workspace
        return McpServerConfig(
            name=name,
            transport="stdio",
            command=expand_vars(command, environ),
            args=tuple(expand_vars(a, environ) for a in args),
            env=env,
            cwd=os.path.normpath(cwd),
            description=description,
            disabled=disabled,
        )
    http_url = raw.get("httpUrl")
    url = raw.get("url")
    transport: Transport
    if http_url is not None:
        transport, target = "http", http_url
    elif url is not None:
        transport = "http" if raw.get("type") in ("http", "streamable-http") else "sse"
        target = url
    else:
        return _invalid(name, "unknown", "entry names no `command`, `httpUrl` or `url`")
    if not isinstance(target, str) or not target.startswith(("http://", "https://")):
        return _invalid(name, transport, "the server URL must be an http(s) URL")
    headers = _pairs(raw.get("headers"), environ)
    if headers is None:
        return _invalid(name, transport, "`headers` must be an object of strings")
    return McpServerConfig(
        name=name,
        transport=transport,
        url=expand_vars(target, environ),
        headers=headers,
        description=description,
        disabled=disabled,
    )


def _invalid(name: str, transport: Transport, why: str) -> McpServerConfig:
    return McpServerConfig(name=name, transport=transport, invalid=why)


def parse_settings(
    data: bytes | None, workspace: str, environ: Mapping[str, str] | None = None
) -> McpConfig:
    """Parse a settings file's bytes (``None``: no file). Never raises."""
    if data is None:
        return McpConfig()
    environ = os.environ if environ is None else environ
    try:
        doc = msgspec.json.decode(strip_json_comments(data.decode("utf-8-sig")))
    except (UnicodeDecodeError, msgspec.DecodeError) as exc:
        return McpConfig(error=f"{SETTINGS_RELATIVE_PATH} is not valid JSON: {exc}")
    if not isinstance(doc, dict):
        return McpConfig(error=f"{SETTINGS_RELATIVE_PATH} is not a JSON object")
    servers_raw = doc.get("mcpServers")
    if servers_raw is None:
        return McpConfig()
    if not isinstance(servers_raw, dict):
        return McpConfig(error="`mcpServers` must be an object")
    excluded: set[str] = set(_str_list(doc.get("disabledMcpServers")) or [])
    allowed: set[str] | None = None
    mcp_section = doc.get("mcp")
    if isinstance(mcp_section, dict):
        excluded.update(_str_list(mcp_section.get("excluded")) or [])
        allowed_list = _str_list(mcp_section.get("allowed"))
        allowed = set(allowed_list) if allowed_list is not None else None
    servers: list[McpServerConfig] = []
    for name, raw in servers_raw.items():
        if len(servers) >= MAX_SERVERS:
            return McpConfig(tuple(servers), f"more than {MAX_SERVERS} MCP servers configured")
        disabled = name in excluded or (allowed is not None and name not in allowed)
        servers.append(_server(name, raw, disabled, workspace, environ))
    return McpConfig(tuple(servers))


def load_config(workspace: str, environ: Mapping[str, str] | None = None) -> McpConfig:
    """Read and parse the workspace settings file (blocking: run in a worker thread)."""
    path = os.path.join(workspace, SETTINGS_RELATIVE_PATH)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SETTINGS_BYTES + 1)
    except FileNotFoundError:
        return McpConfig()
    except OSError as exc:
        return McpConfig(error=f"cannot read {SETTINGS_RELATIVE_PATH}: {exc.strerror}")
    if len(data) > MAX_SETTINGS_BYTES:
        return McpConfig(error=f"{SETTINGS_RELATIVE_PATH} is larger than 4 MiB")
    return parse_settings(data, workspace, environ)


# ---- the ACP hand-out ---------------------------------------------------------------------


def acp_server(
    server: McpServerConfig, *, command: str | None = None, args: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """The ACP ``McpServer`` object for ``session/new`` (stdio, http or sse variant).

    ``command``/``args`` replace a stdio server's own (the pool hands out its bridge);
    the bridge needs no environment of its own, so ``env`` is then empty.
    """
    if server.transport == "stdio":
        if command is not None:
            return {"name": server.name, "command": command, "args": list(args or ()), "env": []}
        return {
            "name": server.name,
            "command": server.command,
            "args": list(server.args),
            "env": [{"name": k, "value": v} for k, v in server.env],
        }
    return {
        "type": server.transport,
        "name": server.name,
        "url": server.url,
        "headers": [{"name": k, "value": v} for k, v in server.headers],
    }

"""``GET /workspace/env``: runtime, platform, sandbox, proxies and secret presence (pure).

Theory of operation
-------------------
:func:`env_cells` turns an environment mapping (the daemon's ``os.environ``) and the
runtime facts into the seed's ``DaemonEnvCell`` list. It never spawns anything and never
reads files, so the answer is the same whether or not an agent is running.

Redaction rules (the whole point of the route):

* ``env_var`` cells (the allowlist :data:`SECRET_ENV_VARS`) carry ``present`` only; the
  value field does not exist on them. Variables outside the allowlist are not
  enumerated, so a secret under an unexpected name is never exposed either.
* ``proxy`` cells (``HTTP_PROXY`` ``HTTPS_PROXY`` ``ALL_PROXY``, upper case first, then
  lower case) are reduced to ``host:port`` by :func:`redact_proxy`: the scheme, userinfo
  (everything up to the *last* ``@``, so a password containing ``/`` or ``@`` cannot
  shift the parse), path and query are dropped. A value that does not parse is reported
  as present with ``status: "warning"`` and no value. ``NO_PROXY`` is a host list: each
  entry is stripped the same way and kept only if it looks like a host pattern.
* ``sandbox`` cells report presence; the value is shown only when it is a short plain
  token (``docker``, ``sandbox-exec``), never a path or free text.

Bounds: proxy values over :data:`MAX_PROXY_CHARS` characters are not parsed; ``NO_PROXY``
keeps at most :data:`MAX_NO_PROXY_ENTRIES` entries.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Final, Literal

import msgspec

__all__ = [
    "MAX_NO_PROXY_ENTRIES",
    "MAX_PROXY_CHARS",
    "PROXY_ENV_VARS",
    "SANDBOX_ENV_VARS",
    "SECRET_ENV_VARS",
    "EnvCell",
    "env_cells",
    "redact_no_proxy",
    "redact_proxy",
]

#: Secret-bearing variables reported as presence only (the seed's allowlist + base URLs).
SECRET_ENV_VARS: Final = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "DASHSCOPE_API_KEY",
    "OPENROUTER_API_KEY",
    "QWEN_SERVER_TOKEN",
    "OPENAI_BASE_URL",
    "ANTHROPIC_BASE_URL",
)
PROXY_ENV_VARS: Final = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")
SANDBOX_ENV_VARS: Final = ("SANDBOX", "SEATBELT_PROFILE")

#: Longest proxy URL parsed (characters).
MAX_PROXY_CHARS: Final = 2048
#: Most ``NO_PROXY`` entries reported.
MAX_NO_PROXY_ENTRIES: Final = 64

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_PLAIN_TOKEN = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")
_HOST_PATTERN = re.compile(r"^[A-Za-z0-9.*_\-:\[\]/]{1,255}$")

CellKind = Literal["runtime", "platform", "sandbox", "proxy", "env_var"]
CellStatus = Literal["ok", "warning", "error", "disabled", "not_started", "unknown"]


class EnvCell(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """One ``DaemonEnvCell``; absent optional fields are omitted from the JSON."""

    kind: CellKind
    name: str
    status: CellStatus
    present: bool | None = None
    value: str | None = None
    error: str | None = None
    error_kind: str | None = None
    hint: str | None = None


def _strip_credentials(raw: str) -> str:
    """Drop the scheme and everything up to the last ``@`` (userinfo)."""
    text = _SCHEME.sub("", raw.strip(), count=1)
    if "@" in text:
        text = text.rsplit("@", 1)[1]
    return text


def redact_proxy(raw: str) -> str | None:
    """``host:port`` (or ``host``) of a proxy URL, credentials removed; None if unparsable."""
    if not raw.strip() or len(raw) > MAX_PROXY_CHARS:
        return None
    rest = _strip_credentials(raw)
    try:
        parts = urllib.parse.urlsplit("http://" + rest)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if not host or not _HOST_PATTERN.match(host):
        return None
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}" if port is not None else shown


def redact_no_proxy(raw: str) -> str:
    """A ``NO_PROXY`` host list with credentials and junk entries removed."""
    kept: list[str] = []
    for entry in raw[:MAX_PROXY_CHARS].split(","):
        host = _strip_credentials(entry).split("?", 1)[0]
        if host and _HOST_PATTERN.match(host):
            kept.append(host)
        if len(kept) >= MAX_NO_PROXY_ENTRIES:
            break
    return ",".join(kept)


def _lookup(environ: Mapping[str, str], name: str) -> str | None:
    for key in (name, name.lower()):
        value = environ.get(key)
        if value is not None and value != "":
            return value
    return None


def _proxy_cell(name: str, value: str | None) -> EnvCell:
    if value is None:
        return EnvCell("proxy", name, "disabled", present=False)
    if name == "NO_PROXY":
        return EnvCell("proxy", name, "ok", present=True, value=redact_no_proxy(value))
    shown = redact_proxy(value)
    if shown is None:
        return EnvCell(
            "proxy",
            name,
            "warning",
            present=True,
            error=f"{name} is not a parsable proxy URL",
            error_kind="parse_error",
            hint="use scheme://host:port",
        )
    return EnvCell("proxy", name, "ok", present=True, value=shown)


def _sandbox_cell(name: str, value: str | None) -> EnvCell:
    if value is None:
        return EnvCell("sandbox", name, "disabled", present=False)
    shown = value if _PLAIN_TOKEN.match(value) else None
    return EnvCell("sandbox", name, "ok", present=True, value=shown)


def env_cells(
    environ: Mapping[str, str], *, python_version: str, system: str, machine: str
) -> list[EnvCell]:
    """The cells of ``GET /workspace/env``, in the seed's order."""
    cells = [
        EnvCell("runtime", "python", "ok", value=python_version),
        EnvCell("platform", system, "ok", value=machine),
    ]
    cells.extend(_sandbox_cell(name, _lookup(environ, name)) for name in SANDBOX_ENV_VARS)
    cells.extend(_proxy_cell(name, _lookup(environ, name)) for name in PROXY_ENV_VARS)
    for name in SECRET_ENV_VARS:
        present = bool(environ.get(name))
        cells.append(EnvCell("env_var", name, "ok" if present else "disabled", present=present))
    return cells

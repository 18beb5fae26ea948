"""Typed config sections for permissions: ``policy:``, ``capabilities:``, ``approval:``.

Theory of operation
-------------------
The daemon config file (``--config FILE``, YAML) is decoded once at start-up into frozen
msgspec Structs. Every Struct here sets ``forbid_unknown_fields`` so a misspelt key stops
start-up with an error naming it, and every enumerated value is a ``Literal`` so a bad value
is named too. The vocabulary literals of the permission subsystem (``Policy``, ``Verdict``,
``Risk``, ``Scope``, ``ApprovalMode``) live here because this module is the schema; the
logic modules import them from here (this module imports nothing else of the package).

``decode_yaml(text, type_, source=...)`` is the generic loader the daemon's top-level config
Struct can reuse: it parses with ``msgspec.yaml.decode`` and, when validation fails inside a
``dict`` (where msgspec reports the path as ``[...]``), re-walks the raw document to name the
offending key, e.g. ``capabilities.defaults["fs.read"].scope``. All failures raise
``ConfigError`` (the config file's author is at fault), never a bare msgspec error.

Sections
--------
``policy``        ``permissionStrategy`` (one of the 4 mediation policies, default
                  ``first-responder``) and ``consensusQuorum`` (positive int or absent; only
                  honoured under ``consensus``; otherwise ``config_warnings`` reports it).
``capabilities``  ``defaults`` (capability key -> grant; absent = the built-in defaults
                  ``fs.read``/``fs.write``/``terminal.exec`` at workspace scope), ``agents``
                  and ``sessions`` (name/id -> capability key -> grant) layered on top.
                  A grant is ``{scope: workspace|any|core}``, ``null``/``true`` (= scope
                  workspace) or ``false`` (revokes the key in an override layer).
``approval``      ``default``, ``tools``, ``capabilities``, ``risks``: verdicts
                  ``auto|prompt|deny``; applied monotonically by ``approval.decide``.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Literal, Union, get_args, get_origin

import msgspec

__all__ = [
    "APPROVAL_MODES",
    "BUILTIN_DEFAULT_GRANTS",
    "CAPABILITY_KEY_PATTERN",
    "POLICIES",
    "RISKS",
    "SCOPES",
    "VERDICTS",
    "ApprovalConfig",
    "ApprovalMode",
    "CapabilitiesConfig",
    "CapabilityKey",
    "ConfigError",
    "GrantConfig",
    "GrantValue",
    "PermissionsConfig",
    "Policy",
    "PolicyConfig",
    "Risk",
    "Scope",
    "Verdict",
    "config_warnings",
    "decode_yaml",
    "load_permissions_config",
    "validate_capability_key",
]

Policy = Literal["first-responder", "designated", "consensus", "local-only"]
POLICIES: tuple[Policy, ...] = ("first-responder", "designated", "consensus", "local-only")

Verdict = Literal["auto", "prompt", "deny"]
VERDICTS: tuple[Verdict, ...] = ("auto", "prompt", "deny")  # ascending strictness

Risk = Literal["low", "medium", "high", "critical"]
RISKS: tuple[Risk, ...] = ("low", "medium", "high", "critical")  # ascending

Scope = Literal["workspace", "any", "core"]
SCOPES: tuple[Scope, ...] = ("workspace", "any", "core")

ApprovalMode = Literal["plan", "default", "auto-edit", "auto", "yolo"]
APPROVAL_MODES: tuple[ApprovalMode, ...] = ("plan", "default", "auto-edit", "auto", "yolo")

# capability keys: dotted lower-case class, optional ":qualifier", optional trailing "*";
# "secret.bind:" takes an env var name (or "*", which is accepted but never grants).
CAPABILITY_KEY_PATTERN = (
    r"^(?:\*"
    r"|secret\.bind:(?:[A-Za-z_][A-Za-z0-9_]*|\*)"
    r"|(?!secret\.bind:)[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*(?:(?::[A-Za-z0-9_.@/+-]*)?\*?|\.\*))$"
)
_KEY_RE = re.compile(CAPABILITY_KEY_PATTERN)
_KEY_HINT = (
    "not a capability key (e.g. 'fs.read', 'mcp.connect:docs', 'mcp.connect:*', 'secret.bind:ENV')"
)

CapabilityKey = Annotated[str, msgspec.Meta(pattern=CAPABILITY_KEY_PATTERN)]


class ConfigError(Exception):
    """The config file (its author) is wrong: names the file, the key path and the problem."""

    def __init__(self, source: str, path: str, message: str) -> None:
        self.source = source
        self.path = path
        self.message = message
        where = f" at {path}" if path else ""
        super().__init__(f"config {source}{where}: {message}")


def validate_capability_key(key: str) -> None:
    """Raise ``ValueError`` naming ``key`` if it is not a capability key or prefix wildcard.

    Accepted: ``fs.read``, ``mcp.connect:docs``, ``mcp.connect:*``, ``mcp.*``, ``*``,
    ``secret.bind:<ENV>`` (an env var name). ``secret.bind:*`` is accepted (the seed
    allows writing it) but never grants anything.
    """
    if not _KEY_RE.match(key):
        raise ValueError(f"{key!r} is {_KEY_HINT}")


class PolicyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """``policy:`` — multi-client permission mediation."""

    permission_strategy: Policy = "first-responder"
    consensus_quorum: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None


class GrantConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One grant. ``workspace``: effects must target the workspace; ``any``: anywhere
    (outside targets still need approval); ``core``: the seed's spelling for grants with no
    target (``mcp.*``), treated like ``workspace`` for path-bearing effects."""

    scope: Scope = "workspace"


# a grant entry: mapping, null/true (= default grant), false (= revoke in an override layer)
GrantValue = GrantConfig | bool | None

BUILTIN_DEFAULT_GRANTS: dict[str, GrantValue] = {
    "fs.read": GrantConfig(scope="workspace"),
    "fs.write": GrantConfig(scope="workspace"),
    "terminal.exec": GrantConfig(scope="workspace"),
}


class CapabilitiesConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``capabilities:`` — Host-owned capability grants, layered defaults < agent < session."""

    defaults: dict[CapabilityKey, GrantValue] | None = None
    agents: dict[str, dict[CapabilityKey, GrantValue]] = {}
    sessions: dict[str, dict[CapabilityKey, GrantValue]] = {}


class ApprovalConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``approval:`` — verdict policies, combined monotonically (max over ``auto<prompt<deny``).

    ``risks`` keys apply to requests of that risk *or higher* (``high: prompt`` also covers
    ``critical``); ``capabilities`` keys may be prefix wildcards (every match applies).
    """

    default: Verdict | None = None
    tools: dict[str, Verdict] = {}
    capabilities: dict[CapabilityKey, Verdict] = {}
    risks: dict[Risk, Verdict] = {}


class PermissionsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The three permission sections of the daemon config file."""

    policy: PolicyConfig = PolicyConfig()
    capabilities: CapabilitiesConfig = CapabilitiesConfig()
    approval: ApprovalConfig = ApprovalConfig()


def config_warnings(cfg: PermissionsConfig) -> list[str]:
    """Non-fatal oddities worth one log line each at start-up."""
    out: list[str] = []
    if cfg.policy.consensus_quorum is not None and cfg.policy.permission_strategy != "consensus":
        out.append(
            "policy.consensusQuorum is only honoured with permissionStrategy: consensus "
            f"(active: {cfg.policy.permission_strategy})"
        )
    tables: list[tuple[str, dict[str, GrantValue]]] = []
    if cfg.capabilities.defaults is not None:
        tables.append(("capabilities.defaults", cfg.capabilities.defaults))
    tables += [(f"capabilities.agents[{k!r}]", v) for k, v in cfg.capabilities.agents.items()]
    tables += [(f"capabilities.sessions[{k!r}]", v) for k, v in cfg.capabilities.sessions.items()]
    for where, table in tables:
        for key, val in table.items():
            if key.startswith("secret.bind") and key.endswith("*") and val is not False:
                out.append(
                    f"{where}: {key!r} never grants a secret; "
                    "declare each secret as an exact 'secret.bind:<ENV>' key"
                )
    return out


# -- loading -------------------------------------------------------------------------------


def _split_msg(exc: msgspec.ValidationError) -> tuple[str, str]:
    """Split msgspec's ``"<msg> - at `$.a.b`"`` into (message, relative path after ``$``)."""
    text = str(exc)
    m = re.match(r"^(.*) - at `(?:key` in `)?\$(.*)`$", text, re.S)
    if m is None:
        return text, ""
    msg, rel = m.group(1), m.group(2)
    if "- at `key` in `" in text:
        msg = f"{msg} (in a key)"
    return msg, rel


def _unwrap(tp: object) -> object:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _is_mapping_type(tp: object) -> bool:
    return get_origin(tp) is dict or (isinstance(tp, type) and issubclass(tp, msgspec.Struct))


def _locate(raw: object, tp: object, path: str) -> tuple[str, str] | None:
    """Return (path, message) of the first validation error of ``raw`` against ``tp``."""
    try:
        msgspec.convert(raw, tp)
        return None
    except msgspec.ValidationError as exc:
        msg, rel = _split_msg(exc)
    tp = _unwrap(tp)
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        if isinstance(raw, dict):
            mappings = [a for a in get_args(tp) if _is_mapping_type(_unwrap(a))]
            if len(mappings) == 1:
                return _locate(raw, mappings[0], path)
    elif isinstance(tp, type) and issubclass(tp, msgspec.Struct) and isinstance(raw, dict):
        for f in msgspec.structs.fields(tp):
            if f.encode_name in raw:
                found = _locate(raw[f.encode_name], f.type, f"{path}.{f.encode_name}")
                if found is not None:
                    return found
    elif origin is dict and isinstance(raw, dict):
        key_tp, val_tp = get_args(tp)
        for k, v in raw.items():
            try:
                msgspec.convert(k, key_tp)
            except msgspec.ValidationError as kexc:
                kmsg = _split_msg(kexc)[0]
                if "matching regex" in kmsg and _unwrap(key_tp) is str:
                    kmsg = _KEY_HINT  # the only pattern-constrained keys are capability keys
                return f"{path}[{k!r}]", f"invalid key {k!r}: {kmsg}"
            found = _locate(v, val_tp, f"{path}[{k!r}]")
            if found is not None:
                return found
    return f"{path}{rel}", msg


def decode_yaml[T](text: str | bytes, type_: type[T], *, source: str = "<config>") -> T:
    """Decode YAML ``text`` into ``type_``; raise ``ConfigError`` naming the bad key/value.

    An empty document decodes as ``{}`` (all defaults). Paths are reported without the
    leading ``$``: ``policy.permissionStrategy``, ``capabilities.defaults["x"].scope``.
    """
    try:
        raw = msgspec.yaml.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(source, "", f"invalid YAML: {exc}") from None
    if raw is None:
        raw = {}
    try:
        return msgspec.convert(raw, type_)
    except msgspec.ValidationError:
        found = _locate(raw, type_, "$")
    if found is None:  # pragma: no cover - convert failed above, so _locate finds it
        raise ConfigError(source, "", "invalid config")
    path, msg = found
    path = path.removeprefix("$").removeprefix(".")
    raise ConfigError(source, path, msg)


def load_permissions_config(text: str | bytes, *, source: str = "<config>") -> PermissionsConfig:
    """Load a YAML document holding only ``policy``/``capabilities``/``approval``."""
    return decode_yaml(text, PermissionsConfig, source=source)

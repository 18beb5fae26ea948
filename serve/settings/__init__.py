"""Command line and environment → one frozen :class:`Settings` struct (a package).

Every flag of ``qwen serve`` 0.24.4 (qwen-serve-spec §2.1) is accepted under the same
name with the same default, plus acp-serve's own (``--agent``, ``--state-dir``,
``--config``, ...). Values are parsed as strings by argparse and validated
(:mod:`~serve.settings.values`) so each refusal names the flag and the bad value, the way
the reference does (§2.4). A bad value raises :class:`SettingsError`; ``serve.__main__``
prints ``acp-serve: <message>`` to stderr and exits 1.

Flags for subsystems acp-serve does not have (the Web Shell, channels, LAN pairing,
memory-pressure modelling, ...) are accepted so existing launch scripts keep working, and
listed in :data:`INERT_FLAGS`; using one prints a warning at start. Their capability tags
are never advertised.

The parts: :mod:`~serve.settings.record` (the :class:`Settings` record, its defaults,
:class:`SettingsError`), :mod:`~serve.settings.flags` (the argparse flag table,
:data:`INERT_FLAGS`), :mod:`~serve.settings.values` (the validators of single values) and
:mod:`~serve.settings.parse` (:func:`parse_settings`: the flags and environment validated
into a record). Importers use this package's names.
"""

from serve.settings.flags import (
    INERT_FLAGS,
    build_parser,
    default_agent_argv,
    default_state_dir,
)
from serve.settings.parse import parse_settings
from serve.settings.record import (
    BOOTSTRAP_TOKEN_ENV_VAR,
    DEFAULT_EVENT_RING_BYTES,
    DEFAULT_JOURNAL_MAX_TOTAL_BYTES,
    DEFAULT_JOURNAL_RETENTION_MS,
    DEFAULT_MAX_AGENT_LINE_BYTES,
    DEFAULT_PORT,
    DEFAULT_WRITER_IDLE_TIMEOUT_MS,
    MAX_BODY_BYTES,
    MAX_TIMER_MS,
    MIB,
    RateLimitSettings,
    Settings,
    SettingsError,
    is_loopback_hostname,
)
from serve.settings.values import MIN_BOOTSTRAP_TOKEN_CHARS

__all__ = [
    "BOOTSTRAP_TOKEN_ENV_VAR",
    "DEFAULT_EVENT_RING_BYTES",
    "DEFAULT_JOURNAL_MAX_TOTAL_BYTES",
    "DEFAULT_JOURNAL_RETENTION_MS",
    "DEFAULT_MAX_AGENT_LINE_BYTES",
    "DEFAULT_PORT",
    "DEFAULT_WRITER_IDLE_TIMEOUT_MS",
    "INERT_FLAGS",
    "MAX_BODY_BYTES",
    "MAX_TIMER_MS",
    "MIB",
    "MIN_BOOTSTRAP_TOKEN_CHARS",
    "RateLimitSettings",
    "Settings",
    "SettingsError",
    "build_parser",
    "default_agent_argv",
    "default_state_dir",
    "is_loopback_hostname",
    "parse_settings",
]

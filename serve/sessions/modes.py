"""Moved to :mod:`serve.permissions.modes`: approval modes are a permission concept (the
effect gate maps them), and sessions may import permissions, not the other way round.

This re-export keeps the imports of the files being split in issue 25
(``serve/sessions/actor.py``, ``serve/http/routes/sessions.py``) working while they move;
new code imports :mod:`serve.permissions.modes`. Remove it once nothing imports it.
"""

from serve.permissions.modes import (
    APPROVAL_MODES,
    MAX_MODE_ID_CHARS,
    QWEN_EQUIVALENTS,
    AgentModes,
    ModeEntry,
    UnknownApprovalMode,
    advertised_modes,
    allowed_modes,
    apply_mode,
    mode_option,
    qwen_equivalent,
    resolve_mode,
)

__all__ = [
    "APPROVAL_MODES",
    "MAX_MODE_ID_CHARS",
    "QWEN_EQUIVALENTS",
    "AgentModes",
    "ModeEntry",
    "UnknownApprovalMode",
    "advertised_modes",
    "allowed_modes",
    "apply_mode",
    "mode_option",
    "qwen_equivalent",
    "resolve_mode",
]

"""Session configuration as an agent offers it: modes, models and config options.

The ``modes`` and ``models`` states of a session setup, the ``configOptions`` entries (a
select's values may be grouped; :meth:`SessionConfigOption.select_values` flattens them) and
:func:`find_model_option`, the config option that stands for the model.
"""

from __future__ import annotations

from typing import Any

from msgspec import field

from acp.schema.wire import Wire


class SelectOption(Wire, frozen=True):
    value: str
    name: str
    description: str | None = None


class SessionConfigOption(Wire, frozen=True):
    """One entry of ``configOptions``. ``options`` is a list of ``{value, name}`` or of groups
    ``{group, name, options: [...]}``; :meth:`select_values` flattens both."""

    id: str
    name: str
    type: str
    current_value: object = None
    category: str | None = None
    description: str | None = None
    options: list[object] | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")

    def select_values(self) -> list[str]:
        values: list[str] = []
        for opt in self.options or ():
            if isinstance(opt, dict):
                if isinstance(opt.get("value"), str):
                    values.append(opt["value"])
                for sub in opt.get("options") or ():
                    if isinstance(sub, dict) and isinstance(sub.get("value"), str):
                        values.append(sub["value"])
            elif isinstance(opt, SelectOption):
                values.append(opt.value)
        return values


class SessionMode(Wire, frozen=True):
    id: str
    name: str
    description: str | None = None


class SessionModeState(Wire, frozen=True):
    current_mode_id: str
    available_modes: list[SessionMode]


class ModelInfo(Wire, frozen=True):
    model_id: str
    name: str
    description: str | None = None


class SessionModelState(Wire, frozen=True):
    """The older (unstable) ``models`` field, still sent by qwen-code and others."""

    current_model_id: str
    available_models: list[ModelInfo]


def find_model_option(options: list[SessionConfigOption] | None) -> SessionConfigOption | None:
    """The select option of category ``model`` (or, failing that, id ``model``), if offered."""
    for opt in options or ():
        if opt.category == "model" and opt.type == "select":
            return opt
    for opt in options or ():
        if opt.id == "model" and opt.type == "select":
            return opt
    return None

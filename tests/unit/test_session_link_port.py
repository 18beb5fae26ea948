"""What a session takes from its agent's setup (serve/sessions/link_port.py): the current
model and approval mode that ``GET /session/:id``, the SSE snapshot and switches start from,
read from ``session/new|load|resume`` results as real agents send them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from acp.schema import SessionSetup, decode_session_setup
from serve.sessions.link_port import current_model_and_mode

QWEN: dict[str, Any] = {  # qwen-code: models and modes
    "sessionId": "s",
    "models": {
        "currentModelId": "qwen3-coder-plus",
        "availableModels": [{"modelId": "qwen3-coder-plus", "name": "Qwen3 Coder Plus"}],
    },
    "modes": {
        "currentModeId": "default",
        "availableModes": [{"id": "default", "name": "Default"}, {"id": "yolo", "name": "YOLO"}],
    },
}
CODEX: dict[str, Any] = {  # codex-acp: the model and the mode only as config options
    "sessionId": "s",
    "configOptions": [
        {
            "id": "model",
            "name": "Model",
            "category": "model",
            "type": "select",
            "currentValue": "gpt-5-codex",
            "options": [{"value": "gpt-5-codex", "name": "GPT-5 Codex"}],
        },
        {
            "id": "mode",
            "name": "Approval",
            "category": "mode",
            "type": "select",
            "currentValue": "auto",
            "options": [{"value": "auto", "name": "Auto"}, {"value": "read-only", "name": "RO"}],
        },
    ],
}


def setup_of(result: object) -> SessionSetup:
    return decode_session_setup(msgspec.Raw(msgspec.json.encode(result)))


@pytest.mark.parametrize(
    ("result", "before", "after"),
    [
        (QWEN, (None, None), ("qwen3-coder-plus", "default")),
        # a restart or rebind: what the agent advertises now wins over what the session had
        (QWEN, ("old-model", "yolo"), ("qwen3-coder-plus", "default")),
        (CODEX, (None, None), ("gpt-5-codex", "auto")),
        # an agent advertising neither: the session keeps its own
        ({"sessionId": "s"}, ("m", "plan"), ("m", "plan")),
        # modes without models: the model is kept, the mode taken
        ({"sessionId": "s", "modes": QWEN["modes"]}, ("m", "yolo"), ("m", "default")),
        # a malformed models field is as absent (decoded leniently): the model is kept
        ({"sessionId": "s", "models": {"bogus": 1}}, ("m", None), ("m", None)),
    ],
)
def test_the_current_model_and_mode_come_from_what_the_agent_advertised(
    result: object, before: tuple[str | None, str | None], after: tuple[str | None, str | None]
) -> None:
    assert current_model_and_mode(setup_of(result), *before) == after


def test_models_take_precedence_over_a_model_option() -> None:
    both = {**CODEX, "models": QWEN["models"]}
    assert current_model_and_mode(setup_of(both), None, None) == (
        "qwen3-coder-plus",
        "auto",  # a mode config option wins over modes, as the switch reads it
    )


def test_a_model_option_without_a_string_value_names_no_model() -> None:
    option = {**CODEX["configOptions"][0], "currentValue": 3}
    result = {"sessionId": "s", "configOptions": [option]}
    assert current_model_and_mode(setup_of(result), "kept", None) == ("kept", None)

"""The scripted agent's ``[elicit ...]`` directive: ACP ``elicitation/create`` (1.21).

``[elicit form]`` asks the default form (one required ``strategy`` field, a string enum of
``conservative|balanced|aggressive``); ``[elicit form FIELD:TYPE ...]`` builds the form from
the words: ``TYPE`` is ``string``, ``number``, ``integer``, ``boolean`` or ``array`` (a
multi-select of strings), ``string=a|b|c`` / ``array=a|b`` give an enum, and a trailing ``!``
makes the field required. ``[elicit url URL]`` asks a url-mode elicitation
(``elicitationId`` ``scripted-<n>``) and, once accepted, sends ``elicitation/complete`` for it.

The agent then says ``elicitation: <action>`` (and the content as sorted JSON for an
accepted form), or ``elicitation: unsupported <mode>`` without asking when the client did not
advertise that mode in ``clientCapabilities.elicitation`` (ACP: an agent must not ask a mode
the client lacks). The request carries the session id; like a permission request it is not
withdrawn when the turn is cancelled: the client answers it (``cancel``), then the turn ends.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any, Protocol

METHOD = "elicitation/create"
DEFAULT_FIELDS = "strategy:string=conservative|balanced|aggressive!"
_ids = itertools.count(1)


class Runner(Protocol):
    sid: str

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]: ...

    def say(self, text: str) -> None: ...


def form_schema(words: list[str]) -> dict[str, Any]:
    """The ``requestedSchema`` for ``FIELD:TYPE[=a|b][!]`` words."""
    props: dict[str, Any] = {}
    required: list[str] = []
    for word in words or DEFAULT_FIELDS.split():
        name, _, kind = word.partition(":")
        if kind.endswith("!"):
            kind = kind[:-1]
            required.append(name)
        kind, _, choices = kind.partition("=")
        kind = kind or "string"
        prop: dict[str, Any] = {"type": kind, "title": name}
        if choices:
            values = choices.split("|")
            if kind == "array":
                prop["items"] = {"type": "string", "enum": values}
            else:
                prop["enum"] = values
        elif kind == "array":
            prop["items"] = {"type": "string"}
        props[name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    return schema


def modes(client_capabilities: object) -> set[str]:
    caps = client_capabilities if isinstance(client_capabilities, dict) else {}
    elicitation = caps.get("elicitation")
    if not isinstance(elicitation, dict):
        return set()
    return {m for m in ("form", "url") if isinstance(elicitation.get(m), dict)}


def run(
    runner: Runner,
    arg: str,
    client_capabilities: object,
    notify: Callable[[str, dict[str, Any]], None],
) -> None:
    """Execute ``[elicit ARG]`` (see the module docstring)."""
    words = arg.split()
    mode = words[0] if words else "form"
    if mode not in modes(client_capabilities):
        runner.say(f"elicitation: unsupported {mode}")
        return
    params: dict[str, Any]
    if mode == "url":
        eid = f"scripted-{next(_ids)}"
        url = words[1] if len(words) > 1 else "https://example.invalid/connect"
        params = {
            "mode": "url",
            "elicitationId": eid,
            "url": url,
            "message": f"Please open {url}",
        }
    else:
        params = {
            "mode": "form",
            "message": "Please fill in the form",
            "requestedSchema": form_schema(words[1:]),
        }
    answer = runner.call(METHOD, params) or {}
    action = str(answer.get("action"))
    content = answer.get("content")
    if action == "accept" and mode == "form":
        runner.say(f"elicitation: accept {json.dumps(content, sort_keys=True)}")
    else:
        runner.say(f"elicitation: {action}")
    if action == "accept" and mode == "url":
        notify("elicitation/complete", {"elicitationId": params["elicitationId"]})

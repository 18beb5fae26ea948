"""The scripted agent's ``[elicit ...]`` directive against a real child: it asks only the
modes the client advertised, and says what it got back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import trio

from acp import AgentConnection, BaseClientHandler
from acp.schema import ClientCapabilities
from tests.acp.util import scripted_argv


class Answering(BaseClientHandler):
    """Answers every ``elicitation/create`` with ``answer``; records the requests."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__()
        self.answer = answer
        self.asked: list[dict[str, Any]] = []
        self.said: list[str] = []
        self.notes: list[tuple[str, Any]] = []

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        if kind == "agent_message_chunk":
            self.said.append(msgspec.json.decode(update)["content"]["text"])

    def on_notification(self, method: str, params: msgspec.Raw) -> None:
        self.notes.append((method, msgspec.json.decode(params)))

    async def ext_request(self, method: str, params: msgspec.Raw) -> object:
        assert method == "elicitation/create"
        self.asked.append(msgspec.json.decode(params))
        return self.answer


async def run(
    nursery: trio.Nursery, tmp_path: Path, text: str, handler: Answering, caps: Any
) -> None:
    (tmp_path / "ws").mkdir(exist_ok=True)
    conn = await AgentConnection.spawn(
        nursery,
        scripted_argv(str(tmp_path / "state")),
        cwd=str(tmp_path / "ws"),
        handler=handler,
        client_capabilities=caps,
    )
    await conn.initialize()
    setup = await conn.new_session(str(tmp_path / "ws"))
    result = await conn.prompt(setup.session_id, [{"type": "text", "text": text}])
    assert result.stop_reason == "end_turn"
    await conn.aclose()


async def test_a_mode_the_client_lacks_is_not_asked(nursery: trio.Nursery, tmp_path: Path) -> None:
    handler = Answering({"action": "accept"})
    caps = ClientCapabilities(elicitation={"form": {}})
    await run(nursery, tmp_path, "[elicit url] [elicit form]", handler, caps)
    assert handler.said[0] == "elicitation: unsupported url"
    assert [a["mode"] for a in handler.asked] == ["form"]
    await run(nursery, tmp_path, "[elicit form]", handler, ClientCapabilities())
    assert handler.said[-1] == "elicitation: unsupported form"


async def test_form_fields_and_url_completion(nursery: trio.Nursery, tmp_path: Path) -> None:
    handler = Answering({"action": "accept", "content": {"b": True, "a": 1}})
    caps = ClientCapabilities(elicitation={"form": {}, "url": {}})
    await run(
        nursery,
        tmp_path,
        "[elicit form a:integer! b:boolean c:array=x|y] [elicit url]",
        handler,
        caps,
    )
    form, url = handler.asked
    assert form["requestedSchema"] == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "title": "a"},
            "b": {"type": "boolean", "title": "b"},
            "c": {"type": "array", "title": "c", "items": {"type": "string", "enum": ["x", "y"]}},
        },
        "required": ["a"],
    }
    assert form["sessionId"] and form["message"]
    assert url["mode"] == "url" and url["url"].startswith("https://")
    assert handler.said[0] == 'elicitation: accept {"a": 1, "b": true}'
    assert ("elicitation/complete", {"elicitationId": url["elicitationId"]}) in handler.notes

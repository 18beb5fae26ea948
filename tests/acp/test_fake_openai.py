"""The fake OpenAI server other tests rely on: both response modes and the tool-call trigger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_openai import FakeOpenAI, decide, last_user_text


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "user", "content": "hi"}], "hi"),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "real question"},
                        {"type": "text", "text": "<system-reminder>ignore me</system-reminder>"},
                    ],
                }
            ],
            "real question",
        ),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "a"),
        ([], ""),
    ],
)
def test_last_user_text(messages: list[dict[str, Any]], expected: str) -> None:
    assert last_user_text(messages) == expected


def test_decide_tool_call_and_after_tool() -> None:
    reply = decide([{"role": "user", "content": "Please write notes/a.txt two words"}], "/ws")
    assert reply.tool_call is not None and reply.tool_call["name"] == "write_file"
    assert json.loads(reply.tool_call["arguments"]) == {
        "file_path": "/ws/notes/a.txt",
        "content": "two words",
    }
    after = decide(
        [
            {"role": "user", "content": "please write a.txt x"},
            {"role": "tool", "content": "ok", "tool_call_id": "c"},
        ],
        "/ws",
    )
    assert after.tool_call is None and after.text == "done"


def chat(server: FakeOpenAI, text: str, stream: bool) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/chat/completions",
        json={"model": "fake", "stream": stream, "messages": [{"role": "user", "content": text}]},
        timeout=10,
    )


def sse_events(body: str) -> list[Any]:
    events = []
    for line in body.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_server_non_streaming_and_models(tmp_path: Path) -> None:
    with FakeOpenAI(workdir=str(tmp_path)) as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        models = httpx.get(f"{server.base_url}/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["fake"]
        body = chat(server, "echo me", stream=False).json()
        assert body["choices"][0]["message"]["content"] == "echo me"
        assert body["usage"]["total_tokens"] > 0
        tool = chat(server, "please write f.txt hello", stream=False).json()
        call = tool["choices"][0]["message"]["tool_calls"][0]
        assert tool["choices"][0]["finish_reason"] == "tool_calls"
        assert json.loads(call["function"]["arguments"])["file_path"] == str(tmp_path / "f.txt")
        assert [r["stream"] for r in server.chat_requests()] == [False, False]
        assert httpx.get(f"{server.base_url}/nothing", timeout=10).status_code == 404


def test_server_streaming(tmp_path: Path) -> None:
    with FakeOpenAI(workdir=str(tmp_path)) as server:
        resp = chat(server, "stream this text", stream=True)
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp.text)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        assert text == "stream this text"
        assert chunks[-1]["usage"]["total_tokens"] > 0 and chunks[-1]["choices"] == []

        events = sse_events(chat(server, "please write g.txt streamed", stream=True).text)
        deltas = [c["choices"][0]["delta"] for c in events[:-1] if c["choices"]]
        args = "".join(
            d["tool_calls"][0]["function"].get("arguments", "") for d in deltas if "tool_calls" in d
        )
        assert json.loads(args) == {"file_path": str(tmp_path / "g.txt"), "content": "streamed"}
        finishes = [c["choices"][0]["finish_reason"] for c in events[:-1] if c["choices"]]
        assert finishes[-1] == "tool_calls"

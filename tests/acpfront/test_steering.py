"""``_session/steering`` at ``/acp`` (issue 27.2): the daemon advertises it to its ACP clients
and steers the running turn through the session (real daemon, scripted agent)."""

from __future__ import annotations

from typing import Any

from tests.acpfront.helpers import AcpHttp, Frame
from tests.support.daemon import DaemonProcess


def _text(words: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": words}]


def _said(frame: Frame, words: str) -> bool:
    if frame.method != "session/update":
        return False
    update = frame.message["params"]["update"]
    return bool(
        update.get("sessionUpdate") == "agent_message_chunk"
        and update["content"].get("text") == "echo: " + words
    )


async def test_initialize_advertises_steering(acp: AcpHttp) -> None:
    body = await acp.initialize({"protocolVersion": 1})
    assert body["result"]["_meta"]["steering"] == {"supported": True}


async def test_steering_joins_the_running_turn_and_says_prompt_required_when_idle(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(str(daemon_proc.workspace.resolve()), conn))["sessionId"]
        idle = {"steering": {"idleBehavior": "promptRequired"}}
        # Nothing runs: the message stays the client's, nothing is sent to the agent.
        rid = await acp.request(
            "_session/steering", {"sessionId": sid, "prompt": _text("early"), "_meta": idle}
        )
        reply = await conn.reply(rid)
        assert reply.message["result"] == {"outcome": "promptRequired", "reason": "noRunningTurn"}
        async with acp.stream(sid) as sess:
            prid = await acp.request(
                "session/prompt", {"sessionId": sid, "prompt": _text("first [sleep 1000] second")}
            )
            await sess.until(lambda f: _said(f, "first"))
            srid = await acp.request(
                "_session/steering", {"sessionId": sid, "prompt": _text("steered"), "_meta": idle}
            )
            assert (await conn.reply(srid)).message["result"] == {"outcome": "injected"}
            frames = await sess.until(lambda f: f.message.get("id") == prid)
            assert frames[-1].message["result"]["stopReason"] == "end_turn"
            said = [i for i, f in enumerate(frames) if _said(f, "second") or _said(f, "steered")]
            assert len(said) == 2 and _said(frames[said[0]], "second")  # in order, one turn
            assert not any(_said(f, "early") for f in frames)
        # A malformed steer is the same -32602 as a malformed prompt.
        rid = await acp.request("_session/steering", {"sessionId": sid, "prompt": []})
        assert (await conn.reply(rid)).message["error"]["code"] == -32602

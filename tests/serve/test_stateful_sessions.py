"""Sessions driven in random order by two clients (a hypothesis state machine).

Two :class:`~serve.client.SyncAcpServeClient` s against one real daemon (scripted agent)
create sessions, attach to each other's, prompt (``Prefer: respond-async``), cancel, vote on
the permission requests the prompts raise, and close, in the order hypothesis picks. Each
live session has a raw reader of its event stream (``GET /session/{id}/events``).

Invariants:

* no answer is a 5xx, and every call answers within the clients' timeout (``CALL_TIMEOUT_S``);
* the ids of a session's event stream strictly increase;
* after a close, the session's stream ends within ``STREAM_END_S`` (the reader finishes),
  and every operation of the daemon's own ``/openapi.json`` that takes ``{session_id}``
  answers 404 ``session_not_found`` for it, except ``load`` and ``resume`` (they restore a
  closed session from its journal, by design) and ``detach`` (204 for any session id).

The document is read from the daemon, so a new session route is checked without an edit
here; one whose body is checked before the session is looked up needs a valid body in
:data:`BODIES`.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from serve.client import DaemonHttpError, SyncAcpServeClient
from tests.support.daemon import DaemonProcess, spawn_daemon

TOKEN = "stateful-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CALL_TIMEOUT_S = 30.0
STREAM_END_S = 20.0
MAX_LIVE = 3
VOTE_WAIT_S = 3.0
PROMPTS = (
    "hello",
    "[think hmm] an answer",
    "[write notes.txt hi]",  # a permission request (default mode)
    "[sleep 300] slow",
)
#: A valid body for the operations that check theirs before looking the session up.
TEXT = [{"type": "text", "text": "x"}]
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/session/{session_id}/prompt"): {"prompt": TEXT},
    ("put", "/session/{session_id}/pending-prompts/{prompt_id}"): {"prompt": TEXT},
    ("post", "/session/{session_id}/btw"): {"question": "q"},
    ("post", "/session/{session_id}/language"): {"language": "en"},
    ("post", "/session/{session_id}/rewind"): {"targetTurnIndex": 0},
    ("patch", "/session/{session_id}/metadata"): {"displayName": "x"},
    ("post", "/session/{session_id}/model"): {"modelId": "scripted-fast"},
    ("post", "/session/{session_id}/approval-mode"): {"mode": "default"},
    ("post", "/session/{session_id}/permission/{request_id}"): {
        "outcome": {"outcome": "cancelled"}
    },
    ("post", "/session/{session_id}/elicitation/{request_id}"): {"action": "cancel"},
}
#: Answer a closed session id otherwise, by design (see the module docstring).
NOT_404 = ("/load", "/resume", "/detach")


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    # No session or queue cap: the invariants are about behaviour, not capacity (a cap is a
    # documented 503 with Retry-After).
    d = spawn_daemon(
        ["--max-sessions", "0", "--max-pending-prompts-per-session", "0"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        yield d
    finally:
        d.stop()


class StreamReader(threading.Thread):
    """Reads one session's raw event stream: the ``id:`` of every frame, the permission
    requests still open (``requestId`` → option ids), until the daemon ends the stream."""

    def __init__(self, url: str, session_id: str) -> None:
        super().__init__(daemon=True, name=f"events-{session_id}")
        self.url = f"{url}/session/{session_id}/events"
        self.ids: list[int] = []
        self.open_requests: dict[str, list[str]] = {}
        self.status: int | None = None
        self.error: BaseException | None = None
        self._lock = threading.Condition()
        self.connected = threading.Event()  # the daemon answered the GET
        self._client = httpx.Client(headers=AUTH, timeout=httpx.Timeout(10, read=60))

    def run(self) -> None:
        try:
            with self._client.stream("GET", self.url) as response:
                self.status = response.status_code
                self.connected.set()
                for line in response.iter_lines():
                    self._line(line)
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.connected.set()
            self._client.close()

    def _line(self, line: str) -> None:
        if line.startswith("id: "):
            with self._lock:
                self.ids.append(int(line[4:]))
        elif line.startswith("data: "):
            event = json.loads(line[6:])
            data = event.get("data") or {}
            with self._lock:
                if event.get("type") == "permission_request":
                    options = [o["optionId"] for o in data.get("options", ())]
                    self.open_requests[data["requestId"]] = options
                    self._lock.notify_all()
                elif event.get("type") == "permission_resolved":
                    self.open_requests.pop(data.get("requestId", ""), None)

    def a_request(self, wait_s: float = 0.0) -> tuple[str, list[str]] | None:
        """An open permission request, waiting up to ``wait_s`` for one."""
        with self._lock:
            self._lock.wait_for(lambda: bool(self.open_requests), wait_s)
            return next(iter(self.open_requests.items()), None)

    def increasing(self) -> bool:
        with self._lock:
            return all(a < b for a, b in zip(self.ids, self.ids[1:], strict=False))


class Sessions(RuleBasedStateMachine):
    """See the module docstring."""

    url: ClassVar[str] = ""
    document: ClassVar[dict[str, Any]] = {}
    #: What the runs did (the test checks that they reached every rule's real work).
    done: ClassVar[Counter[str]] = Counter()

    live = Bundle("live")

    def __init__(self) -> None:
        super().__init__()
        self.clients = [
            SyncAcpServeClient(self.url, token=TOKEN, timeout_s=CALL_TIMEOUT_S) for _ in range(2)
        ]
        self.readers: dict[str, StreamReader] = {}
        self.asked: dict[str, int] = {}  # write prompts admitted, per session, not voted on
        self.http = httpx.Client(base_url=self.url, headers=AUTH, timeout=CALL_TIMEOUT_S)

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args)``: its answer, or None for a 4xx (a race the rules allow); a 5xx or
        a timeout fails the run."""
        try:
            return fn(*args, **kwargs)
        except DaemonHttpError as exc:
            assert exc.status < 500, f"{fn.__name__}{args}: {exc.status} {exc.body}"
            return None

    @precondition(lambda self: len(self.readers) < MAX_LIVE)
    @rule(target=live, owner=st.integers(0, 1))
    def create(self, owner: int) -> str:
        session = self.clients[owner].create_session(scope="thread")
        sid = session.session_id
        other = self.clients[1 - owner]
        other.load_session(sid)  # attaches: both clients may act on it
        reader = StreamReader(self.url, sid)
        reader.start()
        assert reader.connected.wait(CALL_TIMEOUT_S), f"no answer to GET events of {sid}"
        assert reader.status == 200, (sid, reader.status)
        self.readers[sid] = reader
        return sid

    @rule(sid=live, who=st.integers(0, 1), text=st.sampled_from(PROMPTS))
    def prompt(self, sid: str, who: int, text: str) -> None:
        if self.call(self.clients[who].prompt_async, sid, text) is not None:
            self.done["prompt"] += 1
            if text.startswith("[write"):
                self.asked[sid] = self.asked.get(sid, 0) + 1

    @rule(sid=live, who=st.integers(0, 1))
    def cancel(self, sid: str, who: int) -> None:
        self.call(self.clients[who].cancel, sid)
        self.done["cancel"] += 1

    @rule(sid=live, who=st.integers(0, 1), pick=st.integers(0, 3))
    def vote(self, sid: str, who: int, pick: int) -> None:
        # A write prompt raises its request when it runs: wait a little for it.
        found = self.readers[sid].a_request(VOTE_WAIT_S if self.asked.get(sid) else 0.0)
        if found is None:
            return
        self.asked[sid] = max(0, self.asked.get(sid, 0) - 1)
        request_id, options = found
        self.done["vote"] += 1
        if pick < len(options):
            self.call(self.clients[who].vote, sid, request_id, options[pick])
        else:
            self.call(self.clients[who].vote, sid, request_id, cancel=True)

    @rule(sid=consumes(live), who=st.integers(0, 1))
    def close(self, sid: str, who: int) -> None:
        self.call(self.clients[who].close_session, sid)
        self._check_closed(sid)

    @invariant()
    def stream_ids_increase(self) -> None:
        for sid, reader in self.readers.items():
            assert reader.increasing(), (sid, reader.ids)

    def _check_closed(self, sid: str) -> None:
        reader = self.readers.pop(sid)
        reader.join(STREAM_END_S)
        self.done["closed"] += 1
        self.done["events"] += len(reader.ids)
        assert not reader.is_alive(), f"the event stream of closed {sid} did not end"
        assert reader.status == 200 and reader.error is None, (reader.status, reader.error)
        assert reader.increasing(), reader.ids
        for path, item in self.document["paths"].items():
            if "{session_id}" not in path or path.endswith(NOT_404):
                continue
            for method, op in item.items():
                concrete = (
                    path.replace("{session_id}", sid)
                    .replace("{request_id}", "req-1")
                    .replace("{prompt_id}", "prompt-1")
                )
                body = BODIES.get((method, path), {} if "requestBody" in op else None)
                if method == "get" and path.endswith("/events"):
                    with self.http.stream("GET", concrete) as response:
                        status, text = response.status_code, response.read().decode()
                else:
                    response = self.http.request(method.upper(), concrete, json=body)
                    status, text = response.status_code, response.text
                assert status == 404, f"{method.upper()} {path} of closed {sid}: {status} {text}"
                assert json.loads(text).get("code") == "session_not_found", text

    def teardown(self) -> None:
        for sid in list(self.readers):
            self.call(self.clients[0].close_session, sid)
            self._check_closed(sid)
        for client in self.clients:
            client.close()
        self.http.close()


@pytest.mark.timeout(600)
def test_sessions_in_random_order_keep_their_invariants(daemon: DaemonProcess) -> None:
    Sessions.url = daemon.url
    Sessions.document = httpx.get(f"{daemon.url}/openapi.json", headers=AUTH, timeout=30).json()
    run_state_machine_as_test(
        Sessions,
        settings=settings(
            max_examples=10,
            stateful_step_count=20,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert daemon.proc.poll() is None, daemon.stderr()[-3000:]
    done = Sessions.done
    assert min(done[k] for k in ("prompt", "vote", "cancel", "closed")) > 0, done
    assert done["events"] > done["closed"], done

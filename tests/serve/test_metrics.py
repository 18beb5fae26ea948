"""GET /metrics (Prometheus text) and structured access logs, against the real daemon."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from serve.http.app import create_app
from serve.runtime.build import build_host
from serve.settings import parse_settings
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(all_samples: dict, name: str, **labels: str) -> float:
    return all_samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_follow_sessions_requests_and_crashes() -> None:
    daemon = spawn_daemon(
        ["--access-log", "--log-format", "json"], env={"QWEN_SERVER_TOKEN": TOKEN}
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            r = await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[flood 40]"}]},
                headers={"X-Request-Id": "req-abc-123"},
            )
            assert r.headers["x-request-id"] == "req-abc-123"
            await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "[crash]"}]}
            )
            await client.get("/no/such/route")
            text = (await client.get("/metrics")).text
            m = samples(text)
            assert value(m, "acp_serve_sessions") == 1
            assert (
                value(
                    m,
                    "acp_serve_http_requests_total",
                    method="POST",
                    route="/session/<session_id>/prompt",
                    status="200",
                )
                == 1
            )
            assert (
                value(
                    m,
                    "acp_serve_http_requests_total",
                    method="GET",
                    route="unmatched",
                    status="404",
                )
                == 1
            )
            assert value(m, "acp_serve_events_published_total") >= 40
            assert value(m, "acp_serve_agent_restarts_total") == 1
            assert value(m, "acp_serve_supervisor_events_total", kind="crash") >= 1
            for _ in range(100):  # the journal flushes every ~50 ms
                if value(m, "acp_serve_journal_bytes_total") > 0:
                    break
                await trio.sleep(0.05)
                m = samples((await client.get("/metrics")).text)
            assert value(m, "acp_serve_journal_bytes_total") > 0
            count = value(
                m,
                "acp_serve_http_request_duration_seconds_count",
                route="/session/<session_id>/prompt",
            )
            assert count == 2
            published = value(m, "acp_serve_events_published_total")
            # Closing keeps the session's totals (counters never go backwards).
            assert (await client.delete(f"/session/{sid}")).status_code == 204
            m2 = samples((await client.get("/metrics")).text)
            assert value(m2, "acp_serve_sessions") == 0
            assert value(m2, "acp_serve_events_published_total") >= published
        assert TOKEN not in text
    finally:
        daemon.stop()
    access = [
        json.loads(line)
        for line in daemon.stderr().splitlines()
        if line.startswith("{") and '"logger":"serve.access"' in line
    ]
    prompt_line = next(a for a in access if a.get("request_id") == "req-abc-123")
    assert prompt_line["msg"].startswith("POST /session/<session_id>/prompt 200")
    assert prompt_line["session_id"] == sid
    assert TOKEN not in daemon.stderr()


async def test_the_answers_of_the_front_itself_are_counted(tmp_path: Path) -> None:
    """``GET /health`` and ``GET /capabilities`` are answered by the security front, below
    the framework's request hooks; they are counted all the same, under their routes."""
    settings = parse_settings(
        ["--workspace", str(tmp_path), "--token", TOKEN], {"HOME": str(tmp_path)}
    )
    host = build_host(settings)[0]
    transport = httpx.ASGITransport(app=create_app(host), client=("127.0.0.1", 40000))  # type: ignore[arg-type]
    base = f"http://127.0.0.1:{host.port}"
    async with httpx.AsyncClient(transport=transport, base_url=base, headers=AUTH) as client:
        for path, times in (("/health", 3), ("/capabilities", 2)):
            for _ in range(times):
                assert (await client.get(path)).status_code == 200
        m = samples((await client.get("/metrics")).text)
    for route, times in (("/health", 3), ("/capabilities", 2)):
        labels = {"method": "GET", "route": route, "status": "200"}
        assert value(m, "acp_serve_http_requests_total", **labels) == times

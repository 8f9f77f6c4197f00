"""The service demo through an ASGI test client: the team starts in the app's lifespan,
answers over HTTP, and shuts down with the app."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from teamrt.demos import research_writer
from teamrt.demos.service import app
from teamrt.errors import UsageError
from teamrt.models import allow_model_requests
from tests.support.brain_server import BrainServer


def test_service_asks_the_team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEAMRT_SERVICE_DIR", str(tmp_path / "svc"))
    monkeypatch.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    with TestClient(app) as client:
        assert client.get("/status").json()["researcher-1"]["state"] == "idle"
        response = client.post("/ask", json={"question": "Research the agent loop."})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["stop_reason"] == "answer"
        assert "the writer, who reports: Done: wrote" in body["answer"]
        assert client.post("/ask", json={"question": ""}).status_code == 400
        assert client.post("/ask", content=b"not json").status_code == 400
        team = app.state.team
    assert app.state.team is None
    assert {s.state for s in team.status.values()} == {"stopped"}
    assert (tmp_path / "scratch" / "agent-loop.md").exists()


@pytest.mark.parametrize("failing", [False, True])
def test_service_on_an_openai_compatible_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: bool
) -> None:
    """TEAMRT_SERVICE_MODEL=openai (as under uvicorn): the team asks the server over HTTP; a
    task that stopped without an answer is a 502 carrying its stop report."""
    monkeypatch.setenv("TEAMRT_SERVICE_DIR", str(tmp_path / "svc"))
    monkeypatch.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.setenv("TEAMRT_SERVICE_MODEL", "openai")
    monkeypatch.setenv("TEAMRT_SERVICE_REPLICAS", "1")
    monkeypatch.setenv("OPENAI_MODEL", "brain")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    routes = [
        (research_writer.RESEARCHER, research_writer.researcher_brain),
        (research_writer.WRITER, research_writer.writer_brain),
    ]
    with BrainServer(routes, status=400 if failing else None) as server, allow_model_requests():
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        with TestClient(app) as client:
            response = client.post("/ask", json={"question": "Research the agent loop."})
    body = response.json()
    if failing:
        assert response.status_code == 502
        assert body["stop_reason"] == "model_error"
        assert body["error"].startswith("researcher stopped early (model_error): brain at")
        assert "HTTP 400" in body["error"]
    else:
        assert response.status_code == 200, response.text
        assert body["stop_reason"] == "answer" and body["tokens"] > 0
        assert sum(server.calls.values()) == 6


def test_service_refuses_to_start_without_a_model_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAMRT_SERVICE_DIR", str(tmp_path / "svc"))
    monkeypatch.setenv("TEAMRT_SERVICE_MODEL", "openai")
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    with pytest.raises(UsageError, match="needs OPENAI_MODEL"), TestClient(app):
        pass


def test_the_service_streams_a_task_as_server_sent_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.setenv("TEAMRT_SERVICE_DIR", str(tmp_path / "svc"))
    monkeypatch.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    with (
        TestClient(app) as client,
        client.stream("POST", "/ask/stream", json={"question": "Research the agent loop."}) as r,
    ):
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    kinds = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert kinds[-1] == "result" and "progress" in kinds
    result = json.loads(lines[lines.index("event: result") + 1].removeprefix("data: "))
    assert result["stop_reason"] == "answer" and "the writer" in result["answer"]

"""The service demo through an ASGI test client: the team starts in the app's lifespan,
answers over HTTP, and shuts down with the app."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from teamrt.demos.service import app


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

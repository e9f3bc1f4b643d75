"""Shared fixtures: a scripted LLM server, settings in a temporary folder, a fresh app per test."""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from app import create_app
from app.config import Settings, load_settings
from tests.live import LiveServer, start_server
from tests.llm_server import ScriptedLLM

REPO = Path(__file__).resolve().parent.parent
TOKEN = "test-token-0123456789"
API_KEY = "sk-test-key-0123456789"


@pytest.fixture(autouse=True)
def _no_real_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach a real provider or read the developer's own keys."""
    for name in ("DEEPSEEK_API_KEY", "DEEPSEEK_API_BASE", "OLLAMA_HOST", "AU_API_TOKENS", "AU_CONFIG", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    """A scripted DeepSeek/Ollama server on 127.0.0.1."""
    server = ScriptedLLM().start()
    yield server
    server.stop()


@pytest.fixture
def live_server(tmp_path: Path, llm: ScriptedLLM) -> Iterator[LiveServer]:
    """`python run.py` as a user starts it, pointed at the scripted LLM."""
    server = start_server(tmp_path, llm.url, env={"DEEPSEEK_API_KEY": API_KEY, "AU_API_TOKENS": TOKEN})
    yield server
    server.stop()


@pytest.fixture
def make_settings(tmp_path: Path, llm: ScriptedLLM) -> Callable[..., Settings]:
    """Settings from a config file in tmp_path (with a copy of the repo's skills), pointed at the scripted server."""
    skills = tmp_path / "skills"
    if not skills.exists():
        shutil.copytree(REPO / "skills", skills)

    def build(config: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Settings:
        sections: dict[str, Any] = {
            "llm": {"provider": "deepseek", "model": "deepseek-chat", "base_url": llm.url, "max_retries": 0, "timeout_s": 10},
            "history": {"data_dir": "data"},
            "shell": {"workspace": "workspace", "timeout_s": 10},
            "agent": {"skills_dir": "skills"},
        }
        for section, values in (config or {}).items():
            sections.setdefault(section, {}).update(values)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(sections), encoding="utf-8")
        environ = {"DEEPSEEK_API_KEY": API_KEY, "AU_API_TOKENS": TOKEN, **(env or {})}
        environ = {key: value for key, value in environ.items() if value is not None}
        return load_settings(path, environ=environ, dotenv_path=None)

    return build


class Api:
    """Test client with the bearer header and URLs filled in (flaskr's AuthActions)."""

    def __init__(self, app: Flask, trace: io.StringIO) -> None:
        self.app = app
        self.client: FlaskClient = app.test_client()
        self.trace = trace
        self.headers = {"Authorization": f"Bearer {TOKEN}"}

    def chat(self, thread_id: str, message: Any, **kwargs: Any) -> TestResponse:
        return self.client.post(f"/au/api/threads/{thread_id}/chat", json={"message": message}, headers=self.headers, **kwargs)

    def get(self, path: str, **kwargs: Any) -> TestResponse:
        return self.client.get(f"/au/api{path}", headers=self.headers, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> TestResponse:
        return self.client.delete(f"/au/api{path}", headers=self.headers, **kwargs)

    def post(self, path: str, **kwargs: Any) -> TestResponse:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self.client.post(f"/au/api{path}", headers=headers, **kwargs)

    @property
    def store(self) -> Any:
        return self.app.extensions["au"].store

    def thread_file(self, thread_id: str) -> Path:
        return self.store.path(thread_id)


@pytest.fixture
def make_api(make_settings: Callable[..., Settings]) -> Callable[..., Api]:
    """Build a fresh app (and its Api helper) from config/env overrides."""

    def build(config: dict[str, Any] | None = None, env: dict[str, str] | None = None, **app_kwargs: Any) -> Api:
        trace = io.StringIO()
        app = create_app(make_settings(config, env), trace_stream=trace, **app_kwargs)
        return Api(app, trace)

    return build


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    """The default app: DeepSeek protocol against the scripted server, auth on."""
    return make_api()

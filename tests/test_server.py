"""`python run.py` for real: gunicorn, the start-up banner, and every curl command of the README."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request

from tests.conftest import API_KEY, REPO, TOKEN
from tests.live import LiveServer
from tests.llm_server import Response, ScriptedLLM

README_BASE = "http://127.0.0.1:5000"


def test_run_py_serves_with_gunicorn_and_prints_what_it_runs(live_server: LiveServer) -> None:
    with urllib.request.urlopen(f"{live_server.url}/au/api/health", timeout=5) as response:
        assert "gunicorn" in response.headers.get("Server", "")
        assert json.load(response)["llm"]["configured"] is True
    log = live_server.log()
    assert f"listening on {live_server.url}/au/api" in log
    assert "deepseek / deepseek-chat" in log
    assert "time-now" in log
    assert API_KEY not in log and TOKEN not in log


def readme_curl_commands() -> list[str]:
    """Every curl command in the README's shell blocks."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("curl ")]


def registered_routes() -> list[str]:
    """Every URL rule of the API blueprint."""
    from flask import Flask

    from app.api import api

    app = Flask(__name__)
    app.register_blueprint(api)
    return sorted({rule.rule for rule in app.url_map.iter_rules() if rule.rule.startswith("/au/api")})


def test_readme_has_a_curl_for_every_route() -> None:
    urls = [re.search(rf"{README_BASE}(/[^\s'\"?]*)", command) for command in readme_curl_commands()]
    documented = {url.group(1) for url in urls if url}
    for rule in registered_routes():
        pattern = re.sub(r"<[^>]+>", "[A-Za-z0-9_-]+", rule)
        assert any(re.fullmatch(pattern, path) for path in documented), f"no curl in the README for {rule}"


def test_every_readme_curl_command_works(live_server: LiveServer, llm: ScriptedLLM) -> None:
    llm.default(Response(content="Scripted answer."))
    for command in readme_curl_commands():
        assert README_BASE in command, command
        result = subprocess.run(
            ["bash", "-c", command.replace(README_BASE, live_server.url) + " -w '\\n%{http_code}'"],
            env={"PATH": os.environ["PATH"], "AU_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=60,
        )
        body, _, status = result.stdout.rpartition("\n")
        assert result.returncode == 0, (command, result.stderr)
        assert status.startswith("2"), (command, status, body)
        if body.startswith("event:"):
            assert "event: done" in body, (command, body)
        elif body.strip():
            json.loads(body)

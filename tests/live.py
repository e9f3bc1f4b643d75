"""`python run.py` started for real in a temporary folder, pointed at a scripted LLM server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent


@dataclass
class LiveServer:
    """A running `python run.py` and where it writes its log."""

    url: str
    process: subprocess.Popen[str]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen[str], timeout: float = 60) -> float:
    """Seconds until /health answered; fails if the process died first."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/au/api/health", timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except OSError:
            time.sleep(0.1)
    raise AssertionError("server did not become healthy")


def start_server(
    folder: Path, llm_url: str, *, env: dict[str, str], overrides: dict[str, dict[str, Any]] | None = None
) -> LiveServer:
    """Start run.py with the shipped config.yaml, its data and workspace in `folder`; return once healthy."""
    config = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    config["llm"].update({"base_url": llm_url, "max_retries": 0})
    config["agent"]["skills_dir"] = str(REPO / "skills")
    config["history"]["data_dir"] = str(folder / "data")
    config["shell"]["workspace"] = str(folder / "workspace")
    for section, values in (overrides or {}).items():
        config[section].update(values)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log_path = folder / "server.log"
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            [sys.executable, "run.py", "--config", str(path), "--port", str(port)],
            cwd=REPO,
            env={"PATH": os.environ["PATH"], "HOME": str(folder), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    server = LiveServer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_healthy(server.url, process)
    except BaseException:
        server.stop()
        raise
    return server

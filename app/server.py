"""Serve the app with gunicorn (threaded workers), after printing what the server runs on."""

from __future__ import annotations

import sys
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from app.config import Settings
from app.llm import is_configured
from app.skills import scan_skills


class _Gunicorn(BaseApplication):
    """gunicorn driven from code, so `python run.py` stays the one way to start au."""

    def __init__(self, settings: Settings, options: dict[str, Any]) -> None:
        self.settings = settings
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        # Imported here so each worker builds its own agent and store (nothing is built at import).
        from app import create_app

        return create_app(self.settings)


def base_url(settings: Settings) -> str:
    """Where the server answers, as a URL."""
    host = settings.server.host
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.server.port}"


def banner(settings: Settings) -> str:
    """What `python run.py` prints before it serves: address, provider, model, skills."""
    llm = settings.llm
    skills, errors = scan_skills(settings.agent.skills_dir)
    lines = [
        f"au listening on {base_url(settings)}/au/api",
        f"  llm: {llm.provider} / {llm.model} at {llm.base_url}"
        + ("" if is_configured(llm) else "  (not configured: set DEEPSEEK_API_KEY)"),
        f"  skills ({len(skills)}): {', '.join(s.name for s in skills) or 'none'}",
        *(f"  skipped skill {e.file}: {e.reason}" for e in errors),
        f"  data: {settings.history.data_dir}   workspace: {settings.shell.workspace}"
        + ("" if settings.shell.enabled else "  (shell disabled)"),
        "  auth: " + ("bearer tokens from AU_API_TOKENS" if settings.api_tokens else "none (loopback only)"),
    ]
    return "\n".join(lines)


def serve(settings: Settings) -> int:
    """Run the production server until it is stopped."""
    print(banner(settings), file=sys.stderr, flush=True)
    host, port = settings.server.host, settings.server.port
    options = {
        # An IPv6 address needs brackets before the port.
        "bind": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        "workers": settings.server.workers,
        "worker_class": "gthread",
        "threads": settings.server.threads,
        # A turn may run many model calls; gthread workers keep their heartbeat while a request runs,
        # so this only bounds a worker that is truly stuck.
        "timeout": 300,
        "graceful_timeout": 30,
        "accesslog": "-",
        "errorlog": "-",
        # gunicorn's control socket sits at one fixed path per user: a second au would take it over.
        "control_socket_disable": True,
    }
    _Gunicorn(settings, options).run()
    return 0

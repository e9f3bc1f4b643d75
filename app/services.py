"""The pieces one au server is made of, built once by create_app and shared by every request."""

from __future__ import annotations

from dataclasses import dataclass

from app.agent import Assistant
from app.config import Settings
from app.history import ThreadStore


@dataclass
class Services:
    """Settings, thread store and assistant of one app (the assistant is None until the LLM is configured)."""

    settings: Settings
    store: ThreadStore
    assistant: Assistant | None
    version: str

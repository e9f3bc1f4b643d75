"""The pieces one au server is made of, built once by create_app and shared by every request."""

from __future__ import annotations

from dataclasses import dataclass

from app.config import Settings
from app.history import ThreadStore
from app.turns import Conversations


@dataclass
class Services:
    """Settings, thread store and chat turns of one app (no turns until the LLM is configured)."""

    settings: Settings
    store: ThreadStore
    conversations: Conversations | None
    version: str

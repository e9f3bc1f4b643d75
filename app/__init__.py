"""au: a self-hosted personal assistant agent behind a small REST API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from flask import Flask
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool

    from app.config import Settings

__version__ = "0.1.0"


def create_app(
    settings: Settings,
    *,
    model: BaseChatModel | None = None,
    tools: Sequence[BaseTool] | None = None,
    trace_stream: TextIO | None = None,
) -> Flask:
    """Build one au server: thread store, agent (built once), routes and error handlers."""
    # Imported here: `python run.py chat` imports this package and needs none of the agent stack.
    from app.factory import build_app

    return build_app(settings, model=model, tools=tools, trace_stream=trace_stream, version=__version__)

"""Assembles one au server from its settings: store, model, agent, routes and error handlers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TextIO

from flask import Flask
from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from app.agent import Assistant, build_agent
from app.api import api
from app.config import Settings
from app.errors import register_error_handlers
from app.history import ThreadStore
from app.llm import context_window, is_configured, make_chat_model, translate_llm_error
from app.memory import ConversationMemory, budget_for
from app.services import Services
from app.tools import build_tools
from app.turns import Conversations
from trace_pretty import TracePrinter

log = logging.getLogger("app")


def build_app(
    settings: Settings,
    *,
    model: BaseChatModel | None = None,
    tools: Sequence[BaseTool] | None = None,
    trace_stream: TextIO | None = None,
    version: str,
) -> Flask:
    """Build one au server: thread store, agent (built once), routes and error handlers."""
    app = Flask(__name__)
    # Otherwise "//" in a path answers an HTML redirect instead of a JSON error.
    app.url_map.merge_slashes = False
    app.config["MAX_CONTENT_LENGTH"] = settings.server.max_body_bytes
    app.json.ensure_ascii = False  # replies are read by people; keep them readable in any language

    store = ThreadStore(settings.history.data_dir)
    for leftover in store.clean_stale_temporaries():
        log.warning("removed a temporary file left by an interrupted write: %s", leftover)

    conversations = None
    if model is not None or is_configured(settings.llm):
        window = context_window(settings.llm)
        model = model or make_chat_model(settings.llm, num_ctx=window)
        agent = build_agent(
            settings,
            model=model,
            tools=build_tools() if tools is None else tools,
            history_folder=store.offload_dir,
            context_window=window,
        )
        assistant = Assistant(
            agent,
            translate_error=lambda exc: translate_llm_error(exc, settings.llm),
            new_trace=lambda: TracePrinter(trace_stream, secrets=settings.secrets),
        )
        conversations = Conversations(store, assistant, ConversationMemory(model, budget_for(settings.history, window)))
    else:
        log.warning("the LLM is not configured (no DEEPSEEK_API_KEY): chat answers 503 until it is set")

    app.extensions["au"] = Services(settings=settings, store=store, conversations=conversations, version=version)
    app.register_blueprint(api)
    register_error_handlers(app)
    return app

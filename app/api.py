"""The HTTP API under /au/api: auth, input validation, and the routes of design.md."""

from __future__ import annotations

import hmac
import json
import uuid
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request

from app.errors import BadRequest, InvalidJson, PayloadTooLarge, Unauthorized, UnsupportedMediaType
from app.history import utc_now, validate_thread_id
from app.llm import is_configured, not_configured_error
from app.services import Services
from app.skills import scan_skills

api = Blueprint("api", __name__, url_prefix="/au/api")

PUBLIC_ENDPOINTS = {"api.health"}


def services() -> Services:
    """The pieces create_app built for this app."""
    return current_app.extensions["au"]


@api.before_request
def _authenticate() -> None:
    g.request_id = uuid.uuid4().hex[:8]
    if request.endpoint in PUBLIC_ENDPOINTS:
        return
    tokens = services().settings.api_tokens
    if not tokens:
        # No tokens configured: run.py allows this only on a loopback address.
        return
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise Unauthorized("Send 'Authorization: Bearer <token>' with one of the tokens in AU_API_TOKENS.")
    candidate = presented.strip().encode()
    # Compare against every token so the time taken does not tell which one was close.
    matches = [hmac.compare_digest(candidate, token.get_secret_value().encode()) for token in tokens]
    if not any(matches):
        raise Unauthorized("Unknown API token.")


@api.after_request
def _tag_request(response: Response) -> Response:
    if "request_id" in g:
        response.headers["X-Request-Id"] = g.request_id
    return response


@api.get("/health")
def health() -> Response:
    """Liveness and what the server runs on (no auth)."""
    svc = services()
    llm = svc.settings.llm
    skills, _ = scan_skills(svc.settings.agent.skills_dir)
    return jsonify(
        {
            "status": "ok",
            "version": svc.version,
            "llm": {"provider": llm.provider, "model": llm.model, "configured": is_configured(llm)},
            "skills": len(skills),
        }
    )


@api.post("/threads/<thread_id>/chat")
def chat(thread_id: str) -> Response:
    """Run one turn of a thread and store it once the agent has answered."""
    validate_thread_id(thread_id)
    svc = services()
    message = _chat_message(svc)
    if svc.assistant is None:
        raise not_configured_error(svc.settings.llm)
    user_ts = utc_now()
    with svc.store.lock(thread_id):
        stored = svc.store.load(thread_id)["messages"]
        result = svc.assistant.run_turn(thread_id, stored, message, request_id=g.request_id)
        svc.store.append_turn(thread_id, message, result.reply, user_ts=user_ts)
    return jsonify(
        {
            "thread_id": thread_id,
            "reply": result.reply,
            "finish_reason": result.finish_reason,
            "usage": result.usage,
        }
    )


def _chat_message(svc: Services) -> str:
    body = _json_object()
    message = body.get("message")
    if not isinstance(message, str) or not message.strip():
        raise BadRequest("Send a JSON object with a non-empty string 'message'.")
    limit = svc.settings.server.max_message_chars
    if len(message) > limit:
        raise PayloadTooLarge(f"'message' is {len(message)} characters; the limit is {limit} (server.max_message_chars).")
    return message


def _json_object() -> dict[str, Any]:
    if request.mimetype != "application/json":
        raise UnsupportedMediaType("Send the body as JSON with 'Content-Type: application/json'.")
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidJson("The body is not valid UTF-8 JSON.") from None
    if not isinstance(body, dict):
        raise InvalidJson("The body must be a JSON object.")
    return body

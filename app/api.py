"""The HTTP API under /au/api: auth, input validation, and the routes of design.md."""

from __future__ import annotations

import hmac
import json
import re
import uuid
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request

from app.errors import BadRequest, InvalidJson, PayloadTooLarge, Unauthorized, UnsupportedMediaType
from app.history import validate_thread_id
from app.llm import is_configured, not_configured_error
from app.services import Services
from app.skills import as_json, scan_skills
from app.turns import turn_body

api = Blueprint("api", __name__, url_prefix="/au/api")

PUBLIC_ENDPOINTS = {"api.health", "api.openapi"}
OPENAPI_PATH = Path(__file__).with_name("openapi.json")
LOCAL_HOST_NAMES = {"127.0.0.1", "localhost", "::1"}


def services() -> Services:
    """The pieces create_app built for this app."""
    return current_app.extensions["au"]


@api.before_app_request
def _assign_request_id() -> None:
    # App-wide, so unknown routes and wrong methods carry an id too.
    g.request_id = uuid.uuid4().hex[:8]


@api.before_request
def _authenticate() -> None:
    if request.endpoint in PUBLIC_ENDPOINTS:
        return
    tokens = services().settings.api_tokens
    if not tokens:
        # No tokens: allowed only on a loopback address (config.py). A web page the user visits could
        # still reach that address by rebinding its own host name to 127.0.0.1, so the name must be local.
        if request.host.rsplit(":", 1)[0].strip("[]").lower() not in LOCAL_HOST_NAMES:
            msg = "Without AU_API_TOKENS au only answers requests addressed to 127.0.0.1, [::1] or localhost."
            raise Unauthorized(msg)
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


@api.after_app_request
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


@api.get("/openapi.json")
def openapi() -> Response:
    """The hand-checked OpenAPI 3.1 description of this API (no auth)."""
    return Response(OPENAPI_PATH.read_bytes(), mimetype="application/json")


@api.post("/threads/<thread_id>/chat")
def chat(thread_id: str) -> Response:
    """Run one turn of a thread and store it once the agent has answered; streamed as SSE on request."""
    validate_thread_id(thread_id)
    svc = services()
    body = _json_object()
    message = _chat_message(body, svc)
    if svc.conversations is None:
        raise not_configured_error(svc.settings.llm)
    if _wants_stream(body):
        events = svc.conversations.chat_stream(thread_id, message, request_id=g.request_id)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return Response(events, mimetype="text/event-stream", headers=headers)
    result = svc.conversations.chat(thread_id, message, request_id=g.request_id)
    return jsonify(turn_body(thread_id, result))


@api.get("/threads")
def list_threads() -> Response:
    """Thread summaries, newest first, paged with limit/offset."""
    limit = _int_arg("limit", default=50, low=1, high=500)
    offset = _int_arg("offset", default=0, low=0, high=10**9)
    threads = services().store.list()
    return jsonify({"threads": threads[offset : offset + limit], "total": len(threads), "limit": limit, "offset": offset})


@api.post("/threads")
def create_thread() -> tuple[Response, int]:
    """Create an empty thread with a new id."""
    store = services().store
    thread_id = uuid.uuid4().hex
    with store.lock(thread_id):
        data = store.create(thread_id)
    return jsonify(data), 201


@api.get("/threads/<thread_id>")
def get_thread(thread_id: str) -> Response:
    """The thread file's content."""
    return jsonify(services().store.get(thread_id))


@api.delete("/threads/<thread_id>")
def delete_thread(thread_id: str) -> Response:
    """Delete a thread and everything kept for it."""
    services().store.delete(thread_id)
    return Response(status=204)


@api.get("/skills")
def list_skills() -> Response:
    """The skills that load, and why the others are skipped."""
    skills, errors = scan_skills(services().settings.agent.skills_dir)
    return jsonify({"skills": as_json(skills), "errors": as_json(errors)})


def _int_arg(name: str, *, default: int, low: int, high: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    # Plain ASCII digits only: int() would also take "1_0", "+5", " 5 " and other scripts' digits.
    value = int(raw) if re.fullmatch(r"[0-9]{1,10}", raw) else low - 1
    if not low <= value <= high:
        raise BadRequest(f"'{name}' must be an integer from {low} to {high}.")
    return value


def _wants_stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false.")
    return stream or request.accept_mimetypes.best == "text/event-stream"


def _chat_message(body: dict[str, Any], svc: Services) -> str:
    message = body.get("message")
    if not isinstance(message, str) or not message.strip():
        raise BadRequest("Send a JSON object with a non-empty string 'message'.")
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        # JSON lets "\ud800" through as a lone surrogate, which is no character: the model client and the
        # thread file would both fail on it later, as a 500.
        msg = "'message' contains an unpaired surrogate escape (\\ud800-\\udfff); send valid Unicode."
        raise BadRequest(msg) from None
    limit = svc.settings.server.max_message_chars
    if len(message) > limit:
        raise PayloadTooLarge(f"'message' is {len(message)} characters; the limit is {limit} (server.max_message_chars).")
    return message


def _json_object() -> dict[str, Any]:
    if request.mimetype != "application/json":
        raise UnsupportedMediaType("Send the body as JSON with 'Content-Type: application/json'.")
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    limit = services().settings.server.max_body_bytes
    if request.content_length is None and len(raw) >= limit:
        # Without a Content-Length (a chunked upload) werkzeug stops reading at the limit and raises nothing,
        # so a body that fills the limit may be longer: refuse it rather than parse a truncated prefix.
        raise PayloadTooLarge(f"Request body too large; the limit is {limit} bytes (server.max_body_bytes).")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        # RecursionError: json.loads gives up on deeply nested arrays/objects (e.g. "[" * 10_000),
        # which is a malformed body from the client, not a server fault.
        raise InvalidJson("The body is not valid UTF-8 JSON.") from None
    if not isinstance(body, dict):
        raise InvalidJson("The body must be a JSON object.")
    return body

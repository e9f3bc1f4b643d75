"""au's error hierarchy and its single mapping to JSON responses.

    AuError                      500 internal_error
    ├── BadRequest               400 invalid_request
    │   ├── InvalidJson          400 invalid_json
    │   └── InvalidThreadId      400 invalid_thread_id
    ├── Unauthorized             401 unauthorized
    ├── NotFound                 404 not_found
    ├── MethodNotAllowed         405 method_not_allowed
    ├── ThreadCorrupt            409 thread_corrupt
    ├── PayloadTooLarge          413 payload_too_large
    ├── UnsupportedMediaType     415 unsupported_media_type
    ├── LlmError                 502 llm_error
    ├── LlmNotConfigured         503 llm_not_configured
    ├── LlmUnavailable           503 llm_unavailable
    └── LlmTimeout               504 llm_timeout

ConfigError is apart: it stops start-up and never reaches a client.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ConfigError(Exception):
    """A bad configuration value; the message names the key."""


class AuError(Exception):
    """An error with an HTTP status and a stable snake_case code."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(AuError):
    status, code = 400, "invalid_request"


class InvalidJson(BadRequest):
    code = "invalid_json"


class InvalidThreadId(BadRequest):
    code = "invalid_thread_id"


class Unauthorized(AuError):
    status, code = 401, "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": 'Bearer realm="au"'})


class NotFound(AuError):
    status, code = 404, "not_found"


class MethodNotAllowed(AuError):
    status, code = 405, "method_not_allowed"


class ThreadCorrupt(AuError):
    status, code = 409, "thread_corrupt"


class PayloadTooLarge(AuError):
    status, code = 413, "payload_too_large"


class UnsupportedMediaType(AuError):
    status, code = 415, "unsupported_media_type"


class LlmError(AuError):
    status, code = 502, "llm_error"


class LlmNotConfigured(AuError):
    status, code = 503, "llm_not_configured"


class LlmUnavailable(AuError):
    status, code = 503, "llm_unavailable"


class LlmTimeout(AuError):
    status, code = 504, "llm_timeout"


# Flask/werkzeug raise their own exceptions before a view runs (unknown route, wrong method,
# body over MAX_CONTENT_LENGTH); they are mapped to the same shape here.
_HTTP_EXCEPTIONS: dict[int, type[AuError]] = {
    400: BadRequest,
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
}


def error_body(code: str, message: str) -> dict[str, Any]:
    """The JSON error object of design.md."""
    return {"error": {"code": code, "message": message}}


def error_response(error: AuError) -> Response:
    """Turn an AuError into its JSON response."""
    response = jsonify(error_body(error.code, error.message))
    response.status_code = error.status
    response.headers.update(error.headers)
    return response


def from_http_exception(exc: HTTPException) -> AuError:
    """Map one of werkzeug's HTTP exceptions onto au's hierarchy."""
    kind = _HTTP_EXCEPTIONS.get(exc.code or 500, AuError)
    messages = {
        404: "No such route. The API lives under /au/api; see /au/api/openapi.json.",
        405: f"Method not allowed here; allowed: {', '.join(getattr(exc, 'valid_methods', None) or [])}.",
        413: "Request body too large; see server.max_body_bytes.",
    }
    error = kind(messages.get(exc.code or 500, exc.description or "Request failed."))
    if kind is AuError:
        error.status = exc.code or 500
    if getattr(exc, "valid_methods", None):
        error.headers["Allow"] = ", ".join(exc.valid_methods)  # RFC 9110: a 405 names what is allowed
    return error


def register_error_handlers(app: Flask) -> None:
    """Install the one place where exceptions become JSON responses."""

    @app.errorhandler(AuError)
    def _au_error(error: AuError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        return error_response(from_http_exception(exc))

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unexpected error while serving a request")
        return error_response(AuError("Unexpected server error; the details are in the server log."))

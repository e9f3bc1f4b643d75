"""The OpenAPI document, app/openapi.json: served without auth, a valid OpenAPI 3.1 document, in step with the
app's routes, and true to what the server really answers.

Response bodies are checked with jsonschema_rs (Schemathesis's validator, JSON Schema 2020-12, formats
asserted) against the schema the document gives for the operation, status and content type; `$ref`s resolve
against the document's own `components`. An event stream is checked event by event, and each event's JSON
data against the `contentSchema` of its event type.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
from flask import Flask
from werkzeug.test import TestResponse

import app as au
from app import errors
from app.api import OPENAPI_PATH
from app.history import THREAD_ID
from tests.conftest import Api
from tests.llm_server import ScriptedLLM

TEXT = OPENAPI_PATH.read_text(encoding="utf-8")
DOC: dict[str, Any] = json.loads(TEXT)
BASE = "/au/api"
api_module = sys.modules["app.api"]  # `app.api` as an attribute is the blueprint that app/__init__.py imports
PUBLIC = {("GET", "/au/api/health"), ("GET", "/au/api/openapi.json")}
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
# Response objects whose output the server fixes completely: no other keys, every key always present.
CLOSED_SCHEMAS = (
    "Error", "ErrorDetail", "ChatResponse", "Usage", "Message", "ThreadSummary", "ThreadList", "Skill",
    "SkillError", "SkillList", "Health", "TextChunk", "ToolCall", "ToolResult", "ConversationSummary",
)  # fmt: skip
# The 404 and 405 answers to requests that match no operation (no route, or a route without that method).
UNROUTED = {("responses", "NoSuchRoute"), ("responses", "MethodNotAllowed")}
SSE_EVENTS = {"token", "reasoning", "tool_call", "tool_result", "done", "error"}
# Every error code of app/errors.py and its status.
ERROR_STATUS = {
    cls.code: cls.status for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.AuError)
}


# --- reading the document ------------------------------------------------------------------------


def pointer(ref: str) -> Any:
    """The node a local `$ref` ("#/a/b") points to."""
    assert ref.startswith("#/"), f"only local references are used: {ref}"
    node: Any = DOC
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    """A Response, Parameter or Header object, following a plain `$ref` to components."""
    while set(node) == {"$ref"}:
        node = pointer(node["$ref"])
    return node


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(METHOD, path, operation) for every documented operation."""
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield method.upper(), path, operation


def refs(node: Any) -> Iterator[str]:
    """Every `$ref` value anywhere under a node."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def validator(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """A JSON Schema 2020-12 validator for a schema of the document, its `$ref`s resolved in `components`."""
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "components": DOC["components"]}
    return jsonschema_rs.Draft202012Validator(root, validate_formats=True)


def schema_errors(schema: dict[str, Any], instance: Any) -> list[str]:
    """What is wrong with `instance` under `schema`, one line per error; empty when it fits."""
    return [
        f"{'/'.join(map(str, error.instance_path)) or '<root>'}: {error.message}"
        for error in validator(schema).iter_errors(instance)
    ]


def parse_sse(text: str) -> list[dict[str, str]]:
    """Events as an SSE client reads them: `event` (default "message") and `data`; comments skipped."""
    events = []
    for block in text.split("\n\n"):
        event, data = "message", []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
            else:
                raise AssertionError(f"unexpected SSE field {field!r} in {block!r}")
        if data:
            events.append({"event": event, "data": "\n".join(data)})
    return events


def sse_payload_schema(stream_schema: dict[str, Any], event: str) -> dict[str, Any]:
    """The `contentSchema` of the `data` of one event type of the stream's (per-event) schema."""
    branches = resolve(stream_schema)["oneOf"]
    matching = [b for b in branches if b["properties"]["event"]["const"] == event]
    assert len(matching) == 1, f"event {event!r} is not documented exactly once"
    return matching[0]["properties"]["data"]["contentSchema"]


def assert_matches(definition: dict[str, Any], response: TestResponse, label: str) -> None:
    """The response fits a Response object of the document: required headers, content type and body."""
    definition = resolve(definition)
    for name, header in definition.get("headers", {}).items():
        header = resolve(header)
        value = response.headers.get(name)
        if value is None:
            assert not header.get("required"), f"{label}: required header {name} is missing"
        else:
            assert not schema_errors(header["schema"], value), f"{label}: header {name}: {value!r}"
    content = definition.get("content")
    if content is None:
        assert response.get_data() == b"", f"{label}: a body where none is documented"
        return
    assert response.mimetype in content, f"{label}: content type {response.mimetype} is not documented"
    schema = content[response.mimetype]["schema"]
    if response.mimetype == "application/json":
        body = response.get_json()
        problems = schema_errors(schema, body)
        assert not problems, f"{label}: {problems}\n{json.dumps(body, indent=1)[:2000]}"
    else:
        assert response.mimetype == "text/event-stream", label
        events = parse_sse(response.get_data(as_text=True))
        assert events, f"{label}: an empty event stream"
        for event in events:
            assert not schema_errors(schema, event), f"{label}: event {event} {schema_errors(schema, event)}"
            payload = json.loads(event["data"])
            problems = schema_errors(sse_payload_schema(schema, event["event"]), payload)
            assert not problems, f"{label}: {event['event']} data {problems}"


class Checker:
    """Sends requests through the test client and checks each response against the document."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str, str]] = set()  # (METHOD, path template, status)
        self.events: set[str] = set()

    def check(self, response: TestResponse, method: str, template: str) -> TestResponse:
        operation = DOC["paths"][template][method.lower()]
        status = str(response.status_code)
        label = f"{method} {template} -> {status} {response.get_data(as_text=True)[:300]}"
        assert status in operation["responses"], f"undocumented status: {label}"
        assert_matches(operation["responses"][status], response, label)
        self.seen.add((method, template, status))
        if response.mimetype == "text/event-stream":
            self.events |= {event["event"] for event in parse_sse(response.get_data(as_text=True))}
        return response

    def request(
        self, api: Api, method: str, template: str, *, thread_id: str = "t1", auth: bool = True, **kwargs: Any
    ) -> TestResponse:
        url = template.replace("{thread_id}", thread_id)
        headers = {**(api.headers if auth else {}), **kwargs.pop("headers", {})}
        response = api.client.open(url, method=method, headers=headers, **kwargs)
        return self.check(response, method, template)


# --- served, and valid OpenAPI 3.1 -----------------------------------------------------------------


def test_document_is_served_without_auth_and_parses(api: Api) -> None:
    response = api.client.get(f"{BASE}/openapi.json")  # no Authorization header
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert response.get_json() == DOC
    assert response.get_data() == OPENAPI_PATH.read_bytes()


def test_document_is_pretty_printed_with_two_spaces() -> None:
    assert TEXT == json.dumps(DOC, indent=2, ensure_ascii=False) + "\n"


def test_document_is_valid_openapi_3_1() -> None:
    assert DOC["openapi"] == "3.1.0"
    # Schemathesis checks the document against the official OpenAPI 3.1 meta-schema (with jsonschema_rs).
    schemathesis.openapi.from_dict(copy.deepcopy(DOC)).validate()
    # ...and that check is no formality: a broken copy is rejected.
    broken = copy.deepcopy(DOC)
    del broken["paths"]["/au/api/health"]["get"]["responses"]["200"]["description"]
    with pytest.raises(jsonschema_rs.ValidationError):
        schemathesis.openapi.from_dict(broken).validate()


def test_every_schema_is_valid_json_schema_and_every_ref_resolves() -> None:
    for schema in DOC["components"]["schemas"].values():
        jsonschema_rs.meta.validate({"$schema": "https://json-schema.org/draft/2020-12/schema", **schema})
        validator(schema)  # compiles: every $ref inside resolves
    for ref in set(refs(DOC)):
        pointer(ref)  # raises KeyError on a dangling reference
    # No component is left unused, except the answers to requests that match no operation.
    used = set(refs(DOC))
    for kind, items in DOC["components"].items():
        for name in items:
            if kind != "securitySchemes" and (kind, name) not in UNROUTED:
                assert f"#/components/{kind}/{name}" in used, f"unused component {kind}/{name}"


def test_info_servers_and_security() -> None:
    assert DOC["info"]["title"] == "au"
    assert DOC["info"]["version"] == au.__version__
    assert DOC["servers"] == [{"url": "/"}]
    assert list(DOC["components"]["securitySchemes"]) == ["bearerAuth"]
    bearer = DOC["components"]["securitySchemes"]["bearerAuth"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    assert DOC["security"] == [{"bearerAuth": []}]
    for method, path, operation in operations():
        if (method, path) in PUBLIC:
            assert operation["security"] == [], f"{method} {path} must be public"
        else:
            assert "security" not in operation, f"{method} {path} must use the global bearer security"
            unauthorized = resolve(operation["responses"]["401"])
            assert "WWW-Authenticate" in unauthorized["headers"]


def test_operations_are_complete() -> None:
    operation_ids = [operation["operationId"] for _, _, operation in operations()]
    assert len(operation_ids) == len(set(operation_ids))
    assert set(DOC["components"]["schemas"]["ErrorDetail"]["properties"]["code"]["enum"]) == set(ERROR_STATUS)
    for method, path, operation in operations():
        responses = operation["responses"]
        assert "500" in responses, f"{method} {path}: 500 internal_error is not documented"
        assert "default" not in responses
        for status, definition in responses.items():
            definition = resolve(definition)
            assert definition["description"]
            assert "X-Request-Id" in definition["headers"], f"{method} {path} {status}"
            if int(status) >= 400:
                schema = definition["content"]["application/json"]["schema"]
                assert schema["$ref"] == "#/components/schemas/Error", f"{method} {path} {status}"
                codes = schema["properties"]["error"]["properties"]["code"]["enum"]
                # Each documented code is one of errors.py's, with this status.
                assert {ERROR_STATUS[code] for code in codes} == {int(status)}, f"{method} {path} {status}: {codes}"


def test_thread_id_parameter_and_schemas() -> None:
    parameter = DOC["components"]["parameters"]["ThreadId"]
    assert parameter["in"] == "path" and parameter["required"] is True and parameter["name"] == "thread_id"
    assert parameter["schema"]["pattern"] == f"^{THREAD_ID.pattern}$" == "^[A-Za-z0-9_-]{1,128}$"
    for path, item in DOC["paths"].items():
        if "{thread_id}" in path:
            assert item["parameters"] == [{"$ref": "#/components/parameters/ThreadId"}], path
    schemas = DOC["components"]["schemas"]
    for name in CLOSED_SCHEMAS:
        assert schemas[name]["additionalProperties"] is False, name
        assert set(schemas[name]["required"]) == set(schemas[name]["properties"]), name
    # The thread file may gain top-level keys (design.md); the server ignores unknown keys of a chat request.
    assert "additionalProperties" not in schemas["Thread"]
    assert schemas["ChatRequest"]["additionalProperties"] is True
    assert schemas["ChatRequest"]["required"] == ["message"]
    chat = DOC["paths"]["/au/api/threads/{thread_id}/chat"]["post"]["responses"]["200"]["content"]
    assert set(chat) == {"application/json", "text/event-stream"}
    branches = resolve(chat["text/event-stream"]["schema"])["oneOf"]
    assert {branch["properties"]["event"]["const"] for branch in branches} == SSE_EVENTS


# --- the document against the app ------------------------------------------------------------------


def registered_routes(app: Flask) -> set[tuple[str, str]]:
    """(METHOD, path) of every Flask route under /au/api, `<thread_id>` written `{thread_id}`."""
    routes = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith(f"{BASE}/"):
            path = re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", r"{\1}", rule.rule)
            routes |= {(method, path) for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}}
    return routes


def test_document_lists_exactly_the_registered_routes(api: Api) -> None:
    documented = {(method, path) for method, path, _ in operations()}
    assert registered_routes(api.app) == documented


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_real_responses_match_the_document(
    make_api: Callable[..., Api], llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Real requests for every documented status of every operation; each answer fits the document."""
    c = Checker()
    api = make_api(config={"server": {"max_message_chars": 100, "max_body_bytes": 2048}})
    chat, threads, thread = f"{BASE}/threads/{{thread_id}}/chat", f"{BASE}/threads", f"{BASE}/threads/{{thread_id}}"
    health, openapi, skills = f"{BASE}/health", f"{BASE}/openapi.json", f"{BASE}/skills"

    def post_chat(body: Any = None, *, thread_id: str = "t1", app: Api = api, **kwargs: Any) -> TestResponse:
        if body is not None:
            kwargs["json"] = body
        return c.request(app, "POST", chat, thread_id=thread_id, **kwargs)

    # System routes, public.
    assert c.request(api, "GET", health, auth=False).get_json()["status"] == "ok"
    c.request(api, "GET", openapi, auth=False)

    # Every authenticated operation answers 401 without a token, or with a wrong one.
    for method, path, _ in operations():
        if (method, path) not in PUBLIC:
            assert c.request(api, method, path, auth=False).status_code == 401
    wrong = c.request(api, "GET", threads, auth=False, headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401

    # Threads: create, list, page, read, delete.
    created = c.request(api, "POST", threads)
    new_id = created.get_json()["thread_id"]
    assert created.status_code == 201
    assert c.request(api, "GET", thread, thread_id=new_id).status_code == 200
    for query in ("limit=0", "limit=501", "offset=-1", "limit=many", "offset=1.5"):
        assert c.request(api, "GET", f"{threads}", query_string=query).status_code == 400
    assert c.request(api, "GET", thread, thread_id="bad.id").status_code == 400
    assert c.request(api, "GET", thread, thread_id="missing").status_code == 404
    assert c.request(api, "DELETE", thread, thread_id="bad.id").status_code == 400
    assert c.request(api, "DELETE", thread, thread_id=new_id).status_code == 204
    assert c.request(api, "DELETE", thread, thread_id=new_id).status_code == 404

    # Chat, plain and streamed (by body and by Accept), with reasoning, tools and the step limit.
    llm.reply("Hello there.", reasoning="The user greets me.")
    assert post_chat({"message": "hi", "extra": "ignored"}).get_json()["reply"] == "Hello there."
    llm.reply("Streamed answer.", reasoning="Thinking it over.")
    assert post_chat({"message": "stream it", "stream": True}).mimetype == "text/event-stream"
    llm.reply("", tool_calls=[("ls", {"path": "/"})])
    llm.reply("Listed.")
    post_chat({"message": "list files"}, headers={"Accept": "text/event-stream"})
    assert c.events >= {"reasoning", "token", "tool_call", "tool_result", "done"}
    listing = c.request(api, "GET", threads, query_string="limit=1&offset=0").get_json()
    assert listing["threads"][0]["thread_id"] == "t1" and listing["threads"][0]["message_count"] == 6
    assert len(c.request(api, "GET", thread).get_json()["messages"]) == 6
    # A long thread gets a stored summary, which reading the thread returns with its messages.
    summarising = make_api(config={"history": {"summary_trigger_tokens": 500, "keep_recent_tokens": 100}})
    turns = [
        {"role": role, "content": f"{role} turn {i}: " + "many words " * 60, "ts": "2026-01-01T00:00:00+00:00"}
        for i in range(6)
        for role in ("user", "assistant")
    ]
    (api.store.data_dir / "long.json").write_text(json.dumps({"thread_id": "long", "messages": turns}), "utf-8")
    llm.reply("The user and the assistant talked at length.")
    llm.reply("Short answer.")
    post_chat({"message": "and now?"}, thread_id="long", app=summarising)
    assert "summary" in c.request(api, "GET", thread, thread_id="long").get_json()
    limited = make_api(config={"agent": {"max_steps": 1}})
    llm.reply("", tool_calls=[("ls", {"path": "/"})])
    assert post_chat({"message": "loop"}, thread_id="t2", app=limited).get_json()["finish_reason"] == "step_limit"

    # Chat input errors.
    assert post_chat(data=b"{not json", content_type="application/json").get_json()["error"]["code"] == "invalid_json"
    assert post_chat(["a list"]).get_json()["error"]["code"] == "invalid_json"
    for body in ({}, {"message": ""}, {"message": " \n\t"}, {"message": 7}, {"message": "hi", "stream": "yes"}):
        assert post_chat(body).get_json()["error"]["code"] == "invalid_request", body
    assert post_chat({"message": "hi"}, thread_id="bad.id").get_json()["error"]["code"] == "invalid_thread_id"
    assert post_chat({"message": "x" * 101}).status_code == 413
    assert post_chat({"message": "x" * 90, "padding": "y" * 3000}).status_code == 413
    assert post_chat(data=b'{"message": "hi"}', content_type="text/plain").status_code == 415
    assert post_chat().status_code == 415  # no body at all

    # A corrupt thread file: 409 for reads and plain chat, an `error` event on a stream.
    (api.store.data_dir / "broken.json").write_text("{not json", encoding="utf-8")
    assert c.request(api, "GET", thread, thread_id="broken").status_code == 409
    assert post_chat({"message": "hi"}, thread_id="broken").status_code == 409
    streamed = post_chat({"message": "hi", "stream": True}, thread_id="broken")
    assert parse_sse(streamed.get_data(as_text=True))[-1]["event"] == "error"
    c.request(api, "GET", threads)  # the corrupt thread is left out of the list

    # Skills, with one broken folder reported under `errors`.
    (api.app.extensions["au"].settings.agent.skills_dir / "broken-skill").mkdir()
    listed = c.request(api, "GET", skills).get_json()
    assert listed["skills"] and listed["errors"]

    # LLM failures: rejected (502, also as an `error` event), rate limited, too slow, unreachable, unconfigured.
    llm.fail(401)
    assert post_chat({"message": "hi"}).get_json()["error"]["code"] == "llm_error"
    llm.fail(401)
    assert parse_sse(post_chat({"message": "hi", "stream": True}).get_data(as_text=True))[-1]["event"] == "error"
    llm.fail(429, headers={"Retry-After": "7"})
    assert post_chat({"message": "hi"}).headers["Retry-After"] == "7"
    slow = make_api(config={"llm": {"timeout_s": 0.5}})
    llm.hang()
    assert post_chat({"message": "hi"}, app=slow).get_json()["error"]["code"] == "llm_timeout"
    unreachable = make_api(config={"llm": {"base_url": closed_port_url()}})
    assert post_chat({"message": "hi"}, app=unreachable).get_json()["error"]["code"] == "llm_unavailable"
    keyless = make_api(env={"DEEPSEEK_API_KEY": None})
    assert post_chat({"message": "hi"}, app=keyless).get_json()["error"]["code"] == "llm_not_configured"
    assert c.request(keyless, "GET", health, auth=False).get_json()["llm"]["configured"] is False

    # Anything unexpected is a bare 500 internal_error, on every operation.
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("unexpected")

    with monkeypatch.context() as patch:
        patch.setattr(api_module, "scan_skills", boom)
        patch.setattr(api_module, "OPENAPI_PATH", tmp_path / "missing.json")
        for name in ("list", "create", "get", "delete"):
            patch.setattr(api.store, name, boom)
        patch.setattr(api.app.extensions["au"].conversations, "chat", boom)
        for method, path, _ in operations():
            response = c.request(api, method, path, auth=(method, path) not in PUBLIC, json={"message": "hi"})
            assert response.status_code == 500, f"{method} {path}"

    # Every status the document lists was produced above by a real request, and every documented event too.
    documented = {(method, path, status) for method, path, op in operations() for status in op["responses"]}
    assert documented - c.seen == set(), "documented but never produced"
    assert c.events == SSE_EVENTS


def test_unknown_routes_and_methods_answer_as_documented(api: Api) -> None:
    responses = DOC["components"]["responses"]
    missing = api.get("/nowhere")
    assert missing.status_code == 404
    assert_matches(responses["NoSuchRoute"], missing, "GET /au/api/nowhere")
    assert len(missing.headers["X-Request-Id"]) == 8
    wrong_methods = (("PUT", f"{BASE}/threads"), ("POST", f"{BASE}/threads/t1"), ("GET", f"{BASE}/threads/t1/chat"))
    for method, path in wrong_methods:
        response = api.client.open(path, method=method, headers=api.headers)
        assert response.status_code == 405, f"{method} {path}"
        assert_matches(responses["MethodNotAllowed"], response, f"{method} {path}")
        assert "allowed: " in response.get_json()["error"]["message"]
        assert method not in response.headers["Allow"] and "OPTIONS" in response.headers["Allow"]

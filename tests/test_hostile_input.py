"""Hostile and malformed requests: each is a 4xx JSON error with its stable code, writes nothing, calls no model."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from werkzeug.test import TestResponse

from app import create_app
from app.config import load_settings
from tests.conftest import API_KEY, REPO, TOKEN, Api
from tests.llm_server import ScriptedLLM

CHAT = "/au/api/threads/t1/chat"
MAX_BODY_BYTES = 64 * 1024
MAX_MESSAGE_CHARS = 100
LIMITS = {"server": {"max_body_bytes": MAX_BODY_BYTES, "max_message_chars": MAX_MESSAGE_CHARS}}


@pytest.fixture(scope="module")
def _shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, ScriptedLLM]]:
    """One app and scripted server for the whole module: every rejected request must leave both untouched
    (each test checks that), so sharing them only saves building an agent per case."""
    folder = tmp_path_factory.mktemp("hostile")
    shutil.copytree(REPO / "skills", folder / "skills")
    with ScriptedLLM() as llm:
        config = {
            **LIMITS,
            "llm": {"provider": "deepseek", "model": "deepseek-chat", "base_url": llm.url, "max_retries": 0},
            "history": {"data_dir": str(folder / "data")},
            "shell": {"workspace": str(folder / "workspace")},
            "agent": {"skills_dir": str(folder / "skills")},
        }
        (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        environ = {"DEEPSEEK_API_KEY": API_KEY, "AU_API_TOKENS": TOKEN}
        settings = load_settings(folder / "config.yaml", environ=environ, dotenv_path=None)
        yield Api(create_app(settings, trace_stream=io.StringIO()), io.StringIO()), llm


@pytest.fixture
def api(_shared: tuple[Api, ScriptedLLM]) -> Api:
    """The shared app (hostile cases only: nothing they send may change it)."""
    return _shared[0]


@pytest.fixture
def llm(_shared: tuple[Api, ScriptedLLM]) -> ScriptedLLM:
    """The shared scripted server, with the record of earlier tests' requests cleared."""
    _shared[1].requests.clear()
    return _shared[1]


@pytest.fixture
def small(make_api: Callable[..., Api]) -> Api:
    """A fresh app with the same limits, for the cases that are accepted (and so write a thread)."""
    return make_api(config=LIMITS)


def data_files(api: Api) -> set[Path]:
    """Everything under the data folder (thread files, lock files, temporaries, evicted history)."""
    return set(api.store.data_dir.rglob("*"))


def assert_rejected(
    api: Api, llm: ScriptedLLM, send: Callable[[], TestResponse], status: int, code: str | set[str]
) -> dict:
    """`send()` is answered with a JSON error of this status and code, writes nothing and calls no model."""
    before = data_files(api)
    response = send()
    text = response.get_data(as_text=True)
    assert response.status_code == status, text
    assert response.mimetype == "application/json"
    error = response.get_json()["error"]
    assert error["code"] in ({code} if isinstance(code, str) else code)
    assert error["message"]
    assert "Traceback" not in text
    assert llm.chat_requests() == []
    assert data_files(api) == before
    return error


def post_raw(api: Api, data: bytes, content_type: str | None = "application/json", **kwargs: Any) -> TestResponse:
    """POST raw bytes with the bearer token and the given content type (None: no Content-Type at all)."""
    headers = dict(api.headers)
    if content_type is not None:
        headers["Content-Type"] = content_type
    headers.update(kwargs.pop("headers", {}))
    return api.client.post(CHAT, data=data, headers=headers, **kwargs)


# --- content type ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        None,
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/json-seq",
        "application/jsonx",
    ],
)
def test_body_that_is_not_declared_json_is_415(api: Api, llm: ScriptedLLM, content_type: str | None) -> None:
    send = lambda: post_raw(api, b'{"message": "hi"}', content_type)  # noqa: E731
    assert_rejected(api, llm, send, 415, "unsupported_media_type")


def test_form_fields_are_415(api: Api, llm: ScriptedLLM) -> None:
    send = lambda: api.client.post(CHAT, data={"message": "hi"}, headers=api.headers)  # noqa: E731
    assert_rejected(api, llm, send, 415, "unsupported_media_type")


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
def test_json_content_type_with_parameters_or_capitals_is_accepted(
    small: Api, llm: ScriptedLLM, content_type: str
) -> None:
    llm.reply("accepted")
    response = post_raw(small, b'{"message": "hi"}', content_type)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["reply"] == "accepted"


# --- invalid JSON ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"[]",
        b'"str"',
        b"1",
        b"null",
        b'{"message": "hi",}',
        b"{'message': 'hi'}",
        b'{"message": "\xff"}',
        '{"message": "hi"}'.encode("utf-16"),
        b'\xef\xbb\xbf{"message": "hi"}',
        b'{"message": "hi", "n": ' + b"1" * 5000 + b"}",
    ],
    ids=[
        "empty",
        "open-brace",
        "array",
        "string",
        "number",
        "null",
        "trailing-comma",
        "single-quotes",
        "invalid-utf8",
        "utf16",
        "utf8-bom",
        "5000-digit-int",
    ],
)
def test_body_that_is_not_a_json_object_is_400_invalid_json(api: Api, llm: ScriptedLLM, body: bytes) -> None:
    assert_rejected(api, llm, lambda: post_raw(api, body), 400, "invalid_json")


# --- the message -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"message": None},
        {"message": 1},
        {"message": True},
        {"message": []},
        {"message": {}},
        {"message": ["hi"]},
        {"message": ""},
        {"message": "   "},
        {"message": "\n\t"},
        {"text": "hi"},
        {"message": "hi", "stream": "yes"},
        {"message": "hi", "stream": 1},
        {"message": "hi", "stream": None},
    ],
    ids=lambda body: json.dumps(body),
)
def test_missing_wrong_or_blank_message_is_400_invalid_request(api: Api, llm: ScriptedLLM, body: dict) -> None:
    assert_rejected(api, llm, lambda: post_raw(api, json.dumps(body).encode()), 400, "invalid_request")


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udfff", b"hi \\udc00 there"])
def test_message_with_an_unpaired_surrogate_is_400(api: Api, llm: ScriptedLLM, escape: bytes) -> None:
    assert_rejected(api, llm, lambda: post_raw(api, b'{"message": "' + escape + b'"}'), 400, "invalid_request")


def test_message_with_a_surrogate_pair_is_accepted(small: Api, llm: ScriptedLLM) -> None:
    llm.reply("nice")
    response = post_raw(small, b'{"message": "\\ud83d\\ude00"}')
    assert response.status_code == 200, response.get_json()
    assert small.store.load("t1")["messages"][0]["content"] == "\U0001f600"


# --- sizes -----------------------------------------------------------------------------------------


def test_body_over_max_body_bytes_is_413(api: Api, llm: ScriptedLLM) -> None:
    body = json.dumps({"message": "hi", "padding": "x" * MAX_BODY_BYTES}).encode()
    error = assert_rejected(api, llm, lambda: post_raw(api, body), 413, "payload_too_large")
    assert "server.max_body_bytes" in error["message"]


def test_chunked_body_over_max_body_bytes_is_413(api: Api, llm: ScriptedLLM) -> None:
    # What gunicorn hands over for `Transfer-Encoding: chunked`: no Content-Length, a stream it terminates.
    # Cut at the limit, this body would be a valid request if the rest were silently dropped.
    body = b'{"message": "hi"}' + b" " * (MAX_BODY_BYTES - 17) + b"and then garbage"

    def send() -> TestResponse:
        return api.client.post(
            CHAT,
            input_stream=io.BytesIO(body),
            headers={**api.headers, "Content-Type": "application/json", "Transfer-Encoding": "chunked"},
            environ_overrides={"wsgi.input_terminated": True},
        )

    assert_rejected(api, llm, send, 413, "payload_too_large")


def test_chunked_body_under_max_body_bytes_is_accepted(small: Api, llm: ScriptedLLM) -> None:
    llm.reply("chunked ok")
    response = small.client.post(
        CHAT,
        input_stream=io.BytesIO(b'{"message": "hi"}'),
        headers={**small.headers, "Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["reply"] == "chunked ok"


def test_message_over_max_message_chars_is_413(api: Api, llm: ScriptedLLM) -> None:
    message = "x" * (MAX_MESSAGE_CHARS + 1)
    error = assert_rejected(api, llm, lambda: api.chat("t1", message), 413, "payload_too_large")
    assert "server.max_message_chars" in error["message"]


@pytest.mark.parametrize("char", ["x", "ü", "😀"])
def test_message_of_exactly_max_message_chars_is_accepted(small: Api, llm: ScriptedLLM, char: str) -> None:
    # The limit counts characters, not bytes: 100 emoji are 400 bytes of UTF-8 and still fit.
    llm.reply("fits")
    message = char * MAX_MESSAGE_CHARS
    response = small.chat("t1", message)
    assert response.status_code == 200, response.get_json()
    assert llm.chat_requests()[0]["messages"][-1]["content"] == message


# --- thread ids ------------------------------------------------------------------------------------

HOSTILE_IDS = [
    "..",
    ".",
    "a.b",
    "x" * 129,
    "-" * 129,
    "%C3%BC",
    "%2e%2e",
    "..%2F..%2Fetc",
    "%2F",
    "a%00b",
    "a%20b",
    "t1%0A",
    "con.json",
    "a%5Cb",
    "%252e%252e",
]
# `%2F` is decoded to `/` before routing, so such a path names another route (or none): 404/405, still JSON.
ID_CODES = {400: "invalid_thread_id", 404: "not_found", 405: "method_not_allowed"}


@pytest.mark.parametrize("method", ["post", "get", "delete"])
@pytest.mark.parametrize("raw_id", HOSTILE_IDS)
def test_hostile_thread_id_is_a_4xx_that_touches_nothing(api: Api, llm: ScriptedLLM, raw_id: str, method: str) -> None:
    path = f"/au/api/threads/{raw_id}" + ("/chat" if method == "post" else "")
    kwargs = {"json": {"message": "hi"}} if method == "post" else {}
    before = data_files(api)
    response = getattr(api.client, method)(path, headers=api.headers, **kwargs)
    assert response.status_code in ID_CODES, response.get_data(as_text=True)
    assert response.get_json()["error"]["code"] == ID_CODES[response.status_code]
    assert llm.chat_requests() == []
    assert data_files(api) == before


@pytest.mark.parametrize("raw_id", ["..", "x" * 129, "%C3%BC", "a%00b", "con.json"])
def test_thread_id_that_reaches_the_route_is_400_invalid_thread_id(api: Api, llm: ScriptedLLM, raw_id: str) -> None:
    send = lambda: api.chat(raw_id, "hi")  # noqa: E731
    assert_rejected(api, llm, send, 400, "invalid_thread_id")


def test_thread_id_of_128_valid_characters_is_accepted(small: Api, llm: ScriptedLLM) -> None:
    thread_id = ("aZ09_-" * 22)[:128]
    llm.reply("long id ok")
    assert small.chat(thread_id, "hi").status_code == 200
    assert small.thread_file(thread_id).name == f"{thread_id}.json"
    assert small.get(f"/threads/{thread_id}").get_json()["messages"][1]["content"] == "long id ok"
    assert small.delete(f"/threads/{thread_id}").status_code == 204


# --- query parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=-1", "limit=abc", "limit=", "limit=1.5", "limit=501", "limit=1e3", "offset=-5", "offset=x", "limit=1_0", "limit=+5", "limit=%205%20", "limit=%D9%A5"],
)
def test_bad_paging_parameter_is_400_invalid_request(api: Api, llm: ScriptedLLM, query: str) -> None:
    error = assert_rejected(api, llm, lambda: api.get(f"/threads?{query}"), 400, "invalid_request")
    assert query.split("=")[0] in error["message"]


# --- sheer size and shape --------------------------------------------------------------------------


def test_huge_authorization_header_is_401(api: Api, llm: ScriptedLLM) -> None:
    headers = {"Authorization": "Bearer " + "a" * 100_000, "Content-Type": "application/json"}
    send = lambda: api.client.post(CHAT, data=b'{"message": "hi"}', headers=headers)  # noqa: E731
    assert_rejected(api, llm, send, 401, "unauthorized")


def test_huge_content_type_header_is_415(api: Api, llm: ScriptedLLM) -> None:
    send = lambda: post_raw(api, b'{"message": "hi"}', "text/plain; x=" + "a" * 100_000)  # noqa: E731
    assert_rejected(api, llm, send, 415, "unsupported_media_type")


def test_many_json_keys_without_a_message_is_400(api: Api, llm: ScriptedLLM) -> None:
    body = json.dumps({f"k{i}": i for i in range(4_000)}).encode()
    assert len(body) < MAX_BODY_BYTES
    assert_rejected(api, llm, lambda: post_raw(api, body), 400, "invalid_request")


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 10_000 + b"]" * 10_000,
        b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
        b'{"message": "hi", "deep": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    ],
    ids=["lists", "objects", "inside-a-valid-request"],
)
def test_deeply_nested_json_is_400_invalid_json(api: Api, llm: ScriptedLLM, body: bytes) -> None:
    assert_rejected(api, llm, lambda: post_raw(api, body), 400, "invalid_json")


def test_an_empty_path_segment_is_a_json_404_not_a_redirect(api: Api, llm: ScriptedLLM) -> None:
    assert_rejected(api, llm, lambda: api.get("/threads//t1"), 404, "not_found")

"""Provider failures over HTTP: design.md's status and code, a message naming the fix, the thread file untouched.

The real ChatDeepSeek / ChatOllama clients talk to the scripted server, so the exceptions are the ones the
libraries really raise; a last unit test lists every exception type they can raise and checks none of them
becomes a 500.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import httpx2
import ollama
import openai
import pytest
from langchain_core import exceptions as lc_exceptions
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from langchain_openai.chat_models import base as lc_openai
from pydantic import SecretStr
from werkzeug.test import TestResponse

from app.config import LlmSettings
from app.errors import AuError
from app.llm import translate_llm_error
from tests.conftest import API_KEY, TOKEN, Api
from tests.llm_server import ScriptedLLM

OLLAMA = {"llm": {"provider": "ollama", "model": "qwen3"}}
NO_KEY = {"DEEPSEEK_API_KEY": None}
FORBIDDEN_IN_BODIES = ("Traceback", 'File "', API_KEY, TOKEN)


# --- helpers ---------------------------------------------------------------------------------------


def closed_port_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (the port was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def merge(*configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Config sections merged key by key, later ones winning."""
    merged: dict[str, dict[str, Any]] = {}
    for config in configs:
        for section, values in config.items():
            merged.setdefault(section, {}).update(values)
    return merged


def provider_app(make_api: Callable[..., Api], provider: str, **llm: Any) -> Api:
    """An app on the scripted server for `provider`, with extra llm.* settings."""
    if provider == "ollama":
        return make_api(config=merge(OLLAMA, {"llm": llm}), env=NO_KEY)
    return make_api(config={"llm": llm})


def assert_clean_error(response: TestResponse, status: int, code: str, *mentions: str) -> str:
    """The response is design.md's JSON error with this status and code; its message names every mention."""
    text = response.get_data(as_text=True)
    assert response.status_code == status, text
    assert response.mimetype == "application/json"
    error = response.get_json()["error"]
    assert error["code"] == code
    for mention in mentions:
        assert mention in error["message"], f"{mention!r} not in {error['message']!r}"
    for forbidden in FORBIDDEN_IN_BODIES:
        assert forbidden not in text
    return error["message"]


def chat_requests_since(llm: ScriptedLLM, count: int) -> list[dict]:
    """Chat requests the server received after the first `count`."""
    return llm.chat_requests()[count:]


def first_turn(api: Api, llm: ScriptedLLM, thread_id: str = "t1") -> bytes:
    """Run one successful turn and return the thread file's bytes after it."""
    llm.reply("first answer")
    response = api.chat(thread_id, "first question")
    assert response.status_code == 200, response.get_json()
    return api.thread_file(thread_id).read_bytes()


def fails_and_keeps_the_file(
    api: Api,
    llm: ScriptedLLM,
    script: Callable[[], None],
    *,
    status: int,
    code: str,
    mentions: tuple[str, ...] = (),
    failing_api: Api | None = None,
    thread_id: str = "t1",
) -> TestResponse:
    """One good turn, then `script` enqueues the failure and a second turn (on `failing_api` if given) fails.

    Asserts the status, code and mentions of the error, and that the thread file is byte-for-byte unchanged.
    """
    before = first_turn(api, llm, thread_id)
    failing_api = failing_api or api
    # A second app must serve the same data folder, or "unchanged" would prove nothing.
    assert failing_api.thread_file(thread_id) == api.thread_file(thread_id)
    script()
    response = failing_api.chat(thread_id, "second question")
    assert_clean_error(response, status, code, *mentions)
    assert api.thread_file(thread_id).read_bytes() == before
    return response


def no_temporaries(api: Api) -> bool:
    """No half-written thread file was left in the data folder."""
    return not list(api.store.data_dir.glob("*.tmp"))


def parse_sse(text: str) -> list[tuple[str, dict]]:
    """(event, data) pairs of an SSE body; comment lines are skipped."""
    events = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line and not line.startswith(":")]
        if lines:
            fields = dict(line.split(": ", 1) for line in lines)
            events.append((fields["event"], json.loads(fields["data"])))
    return events


# --- DeepSeek --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "mentions"),
    [
        (401, ("DEEPSEEK_API_KEY",)),
        (403, ("DEEPSEEK_API_KEY",)),
        (404, ("'deepseek-chat'", "llm.model")),
        (400, ("scripted error (HTTP 400)",)),
        (402, ("balance", "top up")),
        (422, ("scripted error (HTTP 422)",)),
    ],
)
def test_deepseek_rejection_is_502_with_the_fix_and_is_not_retried(
    make_api: Callable[..., Api], llm: ScriptedLLM, status: int, mentions: tuple[str, ...]
) -> None:
    api = make_api(config={"llm": {"max_retries": 1}})
    fails_and_keeps_the_file(api, llm, lambda: llm.fail(status), status=502, code="llm_error", mentions=mentions)
    # A rejection does not get better by asking again: one request for the failing turn.
    assert len(chat_requests_since(llm, 1)) == 1


@pytest.mark.parametrize("status", [500, 503])
def test_deepseek_server_error_is_502_after_the_configured_retries(
    make_api: Callable[..., Api], llm: ScriptedLLM, status: int
) -> None:
    api = make_api(config={"llm": {"max_retries": 1}})

    def script() -> None:
        llm.fail(status)
        llm.fail(status)

    mentions = (f"HTTP {status}", "try again", "llm.max_retries=1")
    fails_and_keeps_the_file(api, llm, script, status=502, code="llm_error", mentions=mentions)
    assert len(chat_requests_since(llm, 1)) == 2


def test_deepseek_rate_limit_is_retried_within_max_retries(make_api: Callable[..., Api], llm: ScriptedLLM) -> None:
    api = make_api(config={"llm": {"max_retries": 1}})
    llm.fail(429, headers={"Retry-After": "0"})
    llm.reply("after the wait")
    response = api.chat("t1", "hi")
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["reply"] == "after the wait"
    assert len(llm.chat_requests()) == 2
    assert [m["content"] for m in api.store.load("t1")["messages"]] == ["hi", "after the wait"]


def test_deepseek_rate_limit_past_the_retries_is_502_passing_retry_after_on(
    make_api: Callable[..., Api], llm: ScriptedLLM
) -> None:
    api = make_api(config={"llm": {"max_retries": 1}})

    def script() -> None:
        llm.fail(429, headers={"Retry-After": "0"})
        llm.fail(429, headers={"Retry-After": "30"})

    response = fails_and_keeps_the_file(api, llm, script, status=502, code="llm_error", mentions=("rate limit",))
    # The last answer's advice reaches the client.
    assert response.headers["Retry-After"] == "30"
    assert len(chat_requests_since(llm, 1)) == 2


def test_deepseek_timeout_is_504_naming_llm_timeout_s(make_api: Callable[..., Api], llm: ScriptedLLM) -> None:
    api = make_api(config={"llm": {"timeout_s": 0.5}})
    mentions = ("llm.timeout_s=0.5s",)
    fails_and_keeps_the_file(api, llm, llm.hang, status=504, code="llm_timeout", mentions=mentions)


def test_deepseek_connection_refused_is_503_naming_the_address(make_api: Callable[..., Api], llm: ScriptedLLM) -> None:
    api = make_api()
    url = closed_port_url()
    unreachable = make_api(config={"llm": {"base_url": url}})
    mentions = (url, "DEEPSEEK_API_BASE")
    fails_and_keeps_the_file(
        api, llm, lambda: None, status=503, code="llm_unavailable", mentions=mentions, failing_api=unreachable
    )


def test_deepseek_without_a_key_is_503_and_keeps_an_existing_thread(
    make_api: Callable[..., Api], llm: ScriptedLLM
) -> None:
    api = make_api()
    keyless = make_api(env=NO_KEY)
    fails_and_keeps_the_file(
        api,
        llm,
        lambda: None,
        status=503,
        code="llm_not_configured",
        mentions=("DEEPSEEK_API_KEY",),
        failing_api=keyless,
    )
    assert len(llm.chat_requests()) == 1


def test_provider_error_text_that_echoes_the_key_is_masked(api: Api, llm: ScriptedLLM) -> None:
    body = {"error": {"message": f"bad request for key {API_KEY}", "type": "invalid_request_error", "code": None}}
    response = fails_and_keeps_the_file(api, llm, lambda: llm.fail(400, body), status=502, code="llm_error")
    assert "bad request for key ***" in response.get_json()["error"]["message"]


# --- Ollama ----------------------------------------------------------------------------------------


def test_ollama_not_running_is_503_saying_ollama_serve_and_the_address(
    make_api: Callable[..., Api], llm: ScriptedLLM
) -> None:
    api = make_api(config=OLLAMA, env=NO_KEY)
    url = closed_port_url()
    stopped = make_api(config=merge(OLLAMA, {"llm": {"base_url": url}}), env=NO_KEY)
    mentions = ("ollama serve", url)
    fails_and_keeps_the_file(
        api, llm, lambda: None, status=503, code="llm_unavailable", mentions=mentions, failing_api=stopped
    )


def test_ollama_unknown_model_is_502_saying_ollama_pull(make_api: Callable[..., Api], llm: ScriptedLLM) -> None:
    api = make_api(config=OLLAMA, env=NO_KEY)
    unknown = make_api(config=merge(OLLAMA, {"llm": {"model": "nope"}}), env=NO_KEY)
    mentions = ("ollama pull nope",)
    fails_and_keeps_the_file(
        api, llm, lambda: None, status=502, code="llm_error", mentions=mentions, failing_api=unknown
    )


def test_ollama_server_error_is_502(make_api: Callable[..., Api], llm: ScriptedLLM) -> None:
    api = make_api(config=OLLAMA, env=NO_KEY)
    fails_and_keeps_the_file(api, llm, lambda: llm.fail(500), status=502, code="llm_error", mentions=("HTTP 500",))


def test_ollama_timeout_is_504(make_api: Callable[..., Api], llm: ScriptedLLM) -> None:
    api = make_api(config=merge(OLLAMA, {"llm": {"timeout_s": 0.5}}), env=NO_KEY)
    fails_and_keeps_the_file(api, llm, llm.hang, status=504, code="llm_timeout", mentions=("llm.timeout_s=0.5s",))


# --- failures in the middle of a turn --------------------------------------------------------------


@pytest.mark.parametrize("provider", ["deepseek", "ollama"])
def test_failure_after_tools_ran_leaves_the_thread_file_unchanged(
    make_api: Callable[..., Api], llm: ScriptedLLM, provider: str
) -> None:
    api = provider_app(make_api, provider)

    def script() -> None:
        llm.reply("", tool_calls=[("execute", {"command": "echo ran > marker.txt"})])
        llm.reply("", tool_calls=[("write_file", {"file_path": "/note.txt", "content": "written"})])
        llm.fail(500)

    fails_and_keeps_the_file(api, llm, script, status=502, code="llm_error")
    workspace = api.app.extensions["au"].settings.shell.workspace
    # The tools really ran before the model failed: their effects stay, the turn is not stored.
    assert (workspace / "marker.txt").read_text().strip() == "ran"
    assert (workspace / "note.txt").read_text() == "written"
    assert len(chat_requests_since(llm, 1)) == 3
    assert no_temporaries(api)


@pytest.mark.parametrize(
    ("provider", "script", "code"),
    [
        ("deepseek", lambda llm: llm.fail(401), "llm_error"),
        ("deepseek", lambda llm: llm.hang(), "llm_timeout"),
        ("ollama", lambda llm: llm.fail(500), "llm_error"),
        ("ollama", lambda llm: llm.hang(), "llm_timeout"),
    ],
    ids=["deepseek-401", "deepseek-timeout", "ollama-500", "ollama-timeout"],
)
def test_streamed_failure_is_an_error_event_and_the_file_is_unchanged(
    make_api: Callable[..., Api], llm: ScriptedLLM, provider: str, script: Callable[[ScriptedLLM], None], code: str
) -> None:
    api = provider_app(make_api, provider, timeout_s=0.5)
    before = first_turn(api, llm)
    script(llm)
    response = api.client.post(
        "/au/api/threads/t1/chat", json={"message": "second question", "stream": True}, headers=api.headers
    )
    assert response.status_code == 200
    text = response.get_data(as_text=True)
    events = parse_sse(text)
    name, data = events[-1]
    assert name == "error" and data["code"] == code and data["message"]
    assert "done" not in [event for event, _ in events]
    for forbidden in FORBIDDEN_IN_BODIES:
        assert forbidden not in text
    assert api.thread_file("t1").read_bytes() == before


@pytest.mark.parametrize("provider", ["deepseek", "ollama"])
def test_failing_first_turn_creates_no_thread_file(
    make_api: Callable[..., Api], llm: ScriptedLLM, provider: str
) -> None:
    api = provider_app(make_api, provider)
    llm.fail(500)
    assert_clean_error(api.chat("fresh", "hello"), 502, "llm_error")
    assert not api.thread_file("fresh").exists()
    assert no_temporaries(api)
    assert api.get("/threads/fresh").status_code == 404


class _BrokenModel(BaseChatModel):
    """A chat model with a bug of its own (not a provider failure)."""

    @property
    def _llm_type(self) -> str:
        return "broken"

    def bind_tools(self, tools: Any, **kwargs: Any) -> _BrokenModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, **kwargs: Any) -> ChatResult:
        raise RuntimeError(f"internal bug near {API_KEY}")


@pytest.mark.parametrize("stream", [False, True])
def test_unexpected_error_is_500_without_details_and_keeps_the_file(
    make_api: Callable[..., Api], llm: ScriptedLLM, stream: bool
) -> None:
    api = make_api()
    before = first_turn(api, llm)
    broken = make_api(model=_BrokenModel())
    response = broken.client.post(
        "/au/api/threads/t1/chat", json={"message": "second", "stream": stream}, headers=broken.headers
    )
    text = response.get_data(as_text=True)
    if stream:
        name, data = parse_sse(text)[-1]
        assert name == "error" and data["code"] == "internal_error"
    else:
        assert_clean_error(response, 500, "internal_error", "server log")
    for forbidden in (*FORBIDDEN_IN_BODIES, "RuntimeError", "internal bug"):
        assert forbidden not in text
    assert api.thread_file("t1").read_bytes() == before


# --- every exception type the providers can raise ------------------------------------------------------

_URL = "http://127.0.0.1:9/v1/chat/completions"
# The libraries whose exceptions can reach the turn boundary (packages, by top-level module name).
_PROVIDER_PACKAGES = {"openai", "langchain_openai", "langchain_core", "httpx", "httpx2", "ollama"}
_NOT_FROM_A_CHAT_CALL = {"WebSocketConnectionClosedError", "WebSocketQueueFullError", "SubjectTokenProviderError"}


def _openai_response(status: int) -> httpx2.Response:
    headers = {"retry-after": "3"} if status == 429 else {}
    body = {"error": {"message": f"scripted {status}", "type": "x", "param": None, "code": None}}
    return httpx2.Response(status, json=body, headers=headers, request=httpx2.Request("POST", _URL))


def _langchain_typed(error: openai.APIError) -> Exception:
    """The exception ChatDeepSeek raises for an SDK error: langchain-openai's handlers, called the way it calls them."""
    try:
        try:
            raise error
        except openai.BadRequestError as bad:
            lc_openai._handle_openai_bad_request(bad)
        except openai.APIError as failed:
            # Re-raises `failed` itself (a bare raise) when it has no typed subclass, e.g. for 402 or 422.
            lc_openai._handle_openai_api_error(failed)
    except Exception as typed:  # noqa: BLE001 - the handlers always raise; that is what is collected
        return typed
    raise AssertionError("langchain-openai's handler did not raise")


def provider_exceptions() -> Iterator[tuple[Exception, str]]:
    """(exception, expected code) for every failure type of the openai/ollama SDKs, their HTTP clients and langchain."""
    client = openai.OpenAI(api_key="sk-unit", base_url=_URL)
    request = httpx2.Request("POST", _URL)
    for status in (400, 401, 402, 403, 404, 409, 422, 429, 500, 503):
        # Exactly what the SDK raises for the status, then what langchain-openai turns it into.
        sdk_error = client._make_status_error_from_response(_openai_response(status))
        yield sdk_error, "llm_error"
        yield _langchain_typed(sdk_error), "llm_error"
    yield openai.APIStatusError("teapot", response=_openai_response(418), body=None), "llm_error"
    yield openai.OAuthError(response=_openai_response(401), body={"error": "invalid_grant"}), "llm_error"
    yield openai.APIResponseValidationError(_openai_response(200), body="not json"), "llm_error"
    yield openai.APIError("stream error", request, body=None), "llm_error"
    yield openai.LengthFinishReasonError(completion=SimpleNamespace(usage=None)), "llm_error"  # type: ignore[arg-type]
    yield openai.ContentFilterFinishReasonError(), "llm_error"
    yield openai.OpenAIError("generic"), "llm_error"
    connection = openai.APIConnectionError(request=request)
    yield connection, "llm_unavailable"
    yield _langchain_typed(connection), "llm_unavailable"
    timeout = openai.APITimeoutError(request=request)
    yield timeout, "llm_timeout"
    yield _langchain_typed(timeout), "llm_timeout"
    overflow_400 = client._make_status_error_from_response(
        httpx2.Response(400, json={"error": {"message": "context_length_exceeded"}}, request=request)
    )
    yield _langchain_typed(overflow_400), "llm_error"
    yield _langchain_typed(openai.APIError("input exceeds the context window", request, body=None)), "llm_error"
    yield lc_openai.OpenAIRefusalError("refused"), "llm_error"

    # langchain_core's provider-neutral family.
    for kind in (
        lc_exceptions.ModelError,
        lc_exceptions.ModelAuthenticationError,
        lc_exceptions.ModelPermissionDeniedError,
        lc_exceptions.ModelInvalidRequestError,
        lc_exceptions.ModelNotFoundError,
        lc_exceptions.ModelRateLimitError,
        lc_exceptions.ModelAPIError,
        lc_exceptions.ContextOverflowError,
        lc_exceptions.ModelRefusalError,
    ):
        yield kind("provider said no"), "llm_error"
    yield lc_exceptions.ModelConnectionError("down"), "llm_unavailable"
    yield lc_exceptions.ModelTimeoutError("slow"), "llm_timeout"

    # ollama: HTTP errors carry the status; an error line mid-stream has none (-1).
    for status in (400, 401, 403, 404, 429, 500, 503, -1):
        yield ollama.ResponseError(json.dumps({"error": f"scripted {status}"}), status), "llm_error"
    yield ollama.RequestError("must provide a model"), "llm_error"

    # httpx (under ollama) and httpx2 (under openai) surface raw from both SDKs' streams.
    for module in (httpx, httpx2):
        for kind in _subclasses(module.HTTPError):
            if kind.__module__.split(".")[0] != module.__name__:
                continue
            yield _http_error(module, kind), _http_code(module, kind)

    # Plain Python: ollama raises ConnectionError itself; sockets raise the others.
    yield ConnectionError("Failed to connect to Ollama"), "llm_unavailable"
    yield ConnectionRefusedError(111, "Connection refused"), "llm_unavailable"
    yield ConnectionResetError(104, "Connection reset by peer"), "llm_unavailable"
    yield TimeoutError("timed out"), "llm_timeout"
    yield socket.timeout("timed out"), "llm_timeout"
    # langchain-deepseek re-raises this when a 200 answer is not JSON; ollama when a stream line is not.
    yield json.JSONDecodeError("DeepSeek API returned an invalid response", "<html>", 0), "llm_error"


def _subclasses(kind: type) -> list[type]:
    found = [kind]
    for sub in kind.__subclasses__():
        found += _subclasses(sub)
    return found


def _http_error(module: Any, kind: type) -> Exception:
    request = module.Request("POST", _URL)
    if issubclass(kind, module.HTTPStatusError):
        return kind("Server error '500'", request=request, response=module.Response(500, request=request))
    if issubclass(kind, module.RequestError):
        return kind("transport trouble", request=request)
    return kind("http trouble")


def _http_code(module: Any, kind: type) -> str:
    if issubclass(kind, module.TimeoutException):
        return "llm_timeout"
    if issubclass(kind, module.TransportError):
        return "llm_unavailable"
    return "llm_error"


PROVIDER_EXCEPTIONS = list(provider_exceptions())


def _settings(provider: str) -> LlmSettings:
    if provider == "ollama":
        return LlmSettings(provider="ollama", model="qwen3", base_url="http://127.0.0.1:11434")
    return LlmSettings(model="deepseek-chat", base_url="https://api.deepseek.com/v1", api_key=SecretStr(API_KEY))


def test_the_exception_list_covers_every_type_the_installed_libraries_define() -> None:
    listed = {type(exc) for exc, _ in PROVIDER_EXCEPTIONS}
    roots = (openai.OpenAIError, lc_exceptions.ModelError, httpx.HTTPError, httpx2.HTTPError)
    defined = {
        kind
        for root in roots
        for kind in _subclasses(root)
        if kind.__module__.split(".")[0] in _PROVIDER_PACKAGES
        # openai's client-side misuse errors (websockets, beta agents, azure options) never come from a chat call.
        and not kind.__module__.startswith(("openai.lib", "openai._extras", "openai._response"))
        and kind.__name__ not in _NOT_FROM_A_CHAT_CALL
        and not kind.__name__.startswith("_")
    }
    defined |= {ollama.ResponseError, ollama.RequestError}
    missing = sorted(f"{kind.__module__}.{kind.__qualname__}" for kind in defined - listed)
    assert not missing, f"add these to provider_exceptions(): {missing}"


@pytest.mark.parametrize("provider", ["deepseek", "ollama"])
@pytest.mark.parametrize(("exc", "code"), PROVIDER_EXCEPTIONS, ids=[type(e).__name__ for e, _ in PROVIDER_EXCEPTIONS])
def test_every_provider_exception_maps_to_an_llm_error_not_a_500(exc: Exception, code: str, provider: str) -> None:
    error = translate_llm_error(exc, _settings(provider))
    assert isinstance(error, AuError)
    assert error.status != 500
    assert error.code == code
    assert error.message and API_KEY not in error.message


def test_rate_limit_passes_the_providers_retry_after_on() -> None:
    sdk_error = openai.OpenAI(api_key="sk-unit", base_url=_URL)._make_status_error_from_response(_openai_response(429))
    error = translate_llm_error(_langchain_typed(sdk_error), _settings("deepseek"))
    assert error is not None and error.headers == {"Retry-After": "3"}


@pytest.mark.parametrize("exc", [RuntimeError("bug"), KeyError("messages"), ValueError("bad"), TypeError("bad")])
def test_exceptions_of_au_itself_are_not_provider_errors(exc: Exception) -> None:
    # None lets the turn boundary re-raise them: 500 internal_error, with the details in the log.
    assert translate_llm_error(exc, _settings("deepseek")) is None

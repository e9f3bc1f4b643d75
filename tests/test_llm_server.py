"""Proves ScriptedLLM speaks DeepSeek's and Ollama's wire formats well enough for the real clients."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import httpx
import ollama
import openai
import pytest
from langchain_core.exceptions import (
    ModelAPIError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelInvalidRequestError,
    ModelNotFoundError,
    ModelRateLimitError,
    ModelTimeoutError,
)
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_deepseek import ChatDeepSeek
from langchain_ollama import ChatOllama

from tests.llm_server import DEFAULT_REPLY, Response, ScriptedLLM

# Anything here would let the environment steer a client away from the scripted server.
_ENV_VARS = (
    "DEEPSEEK_API_KEY",
    "DEEPSEEK_API_BASE",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OLLAMA_HOST",
    "OLLAMA_API_KEY",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[ScriptedLLM]:
    with ScriptedLLM(ollama_models=("qwen3", "llama3.2:3b"), context_length=40960) as llm:
        yield llm


def deepseek(server: ScriptedLLM, model: str = "deepseek-chat", **kwargs: object) -> ChatDeepSeek:
    return ChatDeepSeek(model=model, api_key="test-key", api_base=server.url, max_retries=0, **kwargs)


def ollama_chat(server: ScriptedLLM, model: str = "qwen3", **kwargs: object) -> ChatOllama:
    return ChatOllama(model=model, base_url=server.url, **kwargs)


@tool
def read_file(path: str, limit: int = 10) -> str:
    """Read a file."""
    return path


def post_json(url: str, body: dict) -> tuple[int, dict]:
    """Plain HTTP POST, for checking the server without any client's interpretation."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# -- DeepSeek -----------------------------------------------------------------------------------------


def test_deepseek_invoke_returns_content_and_usage(server: ScriptedLLM) -> None:
    server.reply("Hello from DeepSeek", usage=(21, 4))

    message = deepseek(server).invoke("hi")

    assert message.content == "Hello from DeepSeek"
    assert message.usage_metadata is not None
    assert (message.usage_metadata["input_tokens"], message.usage_metadata["output_tokens"]) == (21, 4)
    assert message.usage_metadata["total_tokens"] == 25
    assert message.response_metadata["finish_reason"] == "stop"


def test_deepseek_request_is_recorded(server: ScriptedLLM) -> None:
    deepseek(server, temperature=0.2).invoke([("system", "be brief"), ("human", "hi")])

    [recorded] = server.requests
    assert (recorded.method, recorded.path) == ("POST", "/chat/completions")
    assert recorded.headers["authorization"] == "Bearer test-key"
    assert recorded.body["model"] == "deepseek-chat"
    assert recorded.body["temperature"] == 0.2
    assert recorded.body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert server.chat_requests() == [recorded.body]


def test_deepseek_v1_path_is_served(server: ScriptedLLM) -> None:
    server.reply("via v1")

    model = ChatDeepSeek(model="deepseek-chat", api_key="test-key", api_base=f"{server.url}/v1", max_retries=0)

    message = model.invoke("hi")

    assert message.content == "via v1"
    assert server.requests[-1].path == "/v1/chat/completions"


def test_deepseek_stream_yields_several_chunks_and_usage(server: ScriptedLLM) -> None:
    server.reply("one two three four", usage=(7, 4))

    chunks = list(deepseek(server).stream("hi", stream_usage=True))

    assert len([c for c in chunks if c.content]) >= 4
    full = chunks[0]
    for chunk in chunks[1:]:
        full += chunk
    assert full.content == "one two three four"
    assert full.usage_metadata is not None
    assert (full.usage_metadata["input_tokens"], full.usage_metadata["output_tokens"]) == (7, 4)
    assert server.chat_requests()[0]["stream"] is True
    assert server.chat_requests()[0]["stream_options"] == {"include_usage": True}


def test_deepseek_stream_without_stream_usage_reports_no_usage(server: ScriptedLLM) -> None:
    # ChatDeepSeek does not ask for streamed usage by default (unlike ChatOpenAI on api.openai.com).
    server.reply("one two")

    chunks = list(deepseek(server).stream("hi"))

    assert "stream_options" not in server.chat_requests()[0]
    assert all(chunk.usage_metadata is None for chunk in chunks)


def test_deepseek_stream_tokens_arrive_over_time(server: ScriptedLLM) -> None:
    server.reply("a b c d e", chunk_delay=0.05)

    arrivals = [time.monotonic() for chunk in deepseek(server).stream("hi") if chunk.content]

    assert len(arrivals) == 5
    assert arrivals[-1] - arrivals[0] >= 0.1  # 4 gaps of 0.05 s; half of it proves the chunks were not sent at once


def test_deepseek_tool_call_is_parsed(server: ScriptedLLM) -> None:
    server.reply(tool_calls=[("read_file", {"path": "notes.txt", "limit": 3})])

    message = deepseek(server).bind_tools([read_file]).invoke("read notes.txt")

    assert message.tool_calls == [
        {"name": "read_file", "args": {"path": "notes.txt", "limit": 3}, "id": "call_2", "type": "tool_call"}
    ]
    assert message.response_metadata["finish_reason"] == "tool_calls"
    sent_tools = server.chat_requests()[0]["tools"]
    assert [t["function"]["name"] for t in sent_tools] == ["read_file"]


def test_deepseek_streamed_tool_call_is_reassembled(server: ScriptedLLM) -> None:
    server.reply("Looking.", tool_calls=[("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"})])

    chunks = list(deepseek(server).bind_tools([read_file]).stream("read both"))
    full = chunks[0]
    for chunk in chunks[1:]:
        full += chunk

    assert full.content == "Looking."
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "b.txt"}),
    ]
    assert len({c["id"] for c in full.tool_calls}) == 2


def test_deepseek_tool_result_round_trip_is_recorded(server: ScriptedLLM) -> None:
    server.reply(tool_calls=[("read_file", {"path": "a.txt"})])
    server.reply("The file says hi.")
    model = deepseek(server).bind_tools([read_file])

    first = model.invoke([HumanMessage("read a.txt")])
    call_id = first.tool_calls[0]["id"]
    second = model.invoke([HumanMessage("read a.txt"), first, ToolMessage("hi", tool_call_id=call_id)])

    assert second.content == "The file says hi."
    sent = server.chat_requests()[1]["messages"]
    assert sent[1]["role"] == "assistant"
    assert sent[1]["tool_calls"][0]["id"] == call_id
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"path": "a.txt"}
    assert sent[2] == {"role": "tool", "content": "hi", "tool_call_id": call_id}


def test_deepseek_reasoner_reasoning_lands_in_additional_kwargs(server: ScriptedLLM) -> None:
    server.reply("42", reasoning="Six times seven.")
    server.reply("43", reasoning="Plus one, step by step.")
    model = deepseek(server, model="deepseek-reasoner")

    invoked = model.invoke("answer?")
    chunks = list(model.stream("again?"))
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk

    assert invoked.content == "42"
    assert invoked.additional_kwargs["reasoning_content"] == "Six times seven."
    assert streamed.content == "43"
    assert streamed.additional_kwargs["reasoning_content"] == "Plus one, step by step."
    assert sum(1 for c in chunks if c.additional_kwargs.get("reasoning_content")) >= 4


def test_deepseek_reasoner_rejects_tool_call_history_without_reasoning(server: ScriptedLLM) -> None:
    server.reply("never sent")
    history = [
        HumanMessage("read a.txt"),
        # Even with the reasoning present, stock ChatDeepSeek drops it from the request.
        AIMessage(
            "",
            tool_calls=[{"name": "read_file", "args": {"path": "a.txt"}, "id": "call_9"}],
            additional_kwargs={"reasoning_content": "I should read it."},
        ),
        ToolMessage("hi", tool_call_id="call_9"),
    ]

    with pytest.raises(openai.BadRequestError) as caught:
        deepseek(server, model="deepseek-reasoner").bind_tools([read_file]).invoke(history)

    assert isinstance(caught.value, ModelInvalidRequestError)
    assert caught.value.status_code == 400
    assert "message index 1" in caught.value.message
    assert caught.value.body["type"] == "invalid_request_error"
    assert "reasoning_content" not in server.chat_requests()[0]["messages"][1]
    assert server.pending() == 1  # the rejected request consumed nothing from the script


def test_reasoner_rule_shape_and_acceptance_over_plain_http(server: ScriptedLLM) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "ok", "tool_call_id": "call_1"},
    ]

    status, body = post_json(f"{server.url}/chat/completions", {"model": "deepseek-reasoner", "messages": messages})
    messages[1]["reasoning_content"] = "because"
    accepted, _ = post_json(f"{server.url}/chat/completions", {"model": "deepseek-reasoner", "messages": messages})
    del messages[1]["reasoning_content"]
    chat_ok, _ = post_json(f"{server.url}/chat/completions", {"model": "deepseek-chat", "messages": messages})

    assert status == 400
    assert body == {
        "error": {
            "message": body["error"]["message"],
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request_error",
        }
    }
    assert body["error"]["message"].startswith(
        "Missing `reasoning_content` field in the assistant message at message index 1."
    )
    assert (accepted, chat_ok) == (200, 200)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, (openai.BadRequestError, ModelInvalidRequestError)),
        (401, (openai.AuthenticationError, ModelAuthenticationError)),
        (404, (openai.NotFoundError, ModelNotFoundError)),
        (429, (openai.RateLimitError, ModelRateLimitError)),
        (500, (openai.InternalServerError, ModelAPIError)),
    ],
)
def test_deepseek_http_errors_map_to_typed_exceptions(
    server: ScriptedLLM, status: int, expected: tuple[type[Exception], type[Exception]]
) -> None:
    server.fail(status, headers={"retry-after": "3"})

    with pytest.raises(expected[0]) as caught:
        deepseek(server).invoke("hi")

    assert isinstance(caught.value, expected[1])
    assert caught.value.status_code == status
    assert caught.value.response.headers["retry-after"] == "3"


def test_deepseek_error_body_is_passed_through(server: ScriptedLLM) -> None:
    error = {"message": "Insufficient Balance", "type": "unknown_error", "param": None, "code": "invalid_request_error"}
    body = {"error": error}
    server.fail(402, body)

    with pytest.raises(openai.APIStatusError) as caught:
        deepseek(server).invoke("hi")

    assert caught.value.status_code == 402
    assert caught.value.body == body["error"]  # the SDK unwraps the top-level "error"
    assert "Insufficient Balance" in caught.value.message


def test_deepseek_timeout_on_hang(server: ScriptedLLM) -> None:
    server.hang()
    started = time.monotonic()

    with pytest.raises(openai.APITimeoutError) as caught:
        deepseek(server, timeout=0.3).invoke("hi")

    assert isinstance(caught.value, ModelTimeoutError)
    assert 0.25 <= time.monotonic() - started < 2


def test_deepseek_delay_models_a_slow_provider(server: ScriptedLLM) -> None:
    server.reply("slow", delay=0.3)
    started = time.monotonic()

    message = deepseek(server).invoke("hi")

    assert message.content == "slow"
    assert time.monotonic() - started >= 0.3


def test_deepseek_async_invoke_and_stream(server: ScriptedLLM) -> None:
    server.reply("async one")
    server.reply("async two three")
    model = deepseek(server)

    async def run() -> tuple[str, list[str]]:
        invoked = await model.ainvoke("hi")
        pieces = [chunk.content async for chunk in model.astream("hi") if chunk.content]
        return str(invoked.content), [str(p) for p in pieces]

    content, pieces = asyncio.run(run())

    assert content == "async one"
    assert "".join(pieces) == "async two three"
    assert len(pieces) == 3


# -- Ollama -------------------------------------------------------------------------------------------


def test_ollama_invoke_returns_content_and_usage(server: ScriptedLLM) -> None:
    server.reply("Hello from Ollama", usage=(30, 6))

    message = ollama_chat(server).invoke("hi")

    assert message.content == "Hello from Ollama"
    assert message.usage_metadata == {"input_tokens": 30, "output_tokens": 6, "total_tokens": 36}
    assert message.response_metadata["done_reason"] == "stop"
    [recorded] = server.requests
    assert (recorded.method, recorded.path) == ("POST", "/api/chat")
    assert recorded.body["model"] == "qwen3"
    assert recorded.body["stream"] is True
    assert recorded.body["messages"] == [{"role": "user", "content": "hi"}]


def test_ollama_stream_yields_several_chunks(server: ScriptedLLM) -> None:
    server.reply("alpha beta gamma", chunk_delay=0.05)

    arrivals: list[float] = []
    pieces: list[str] = []
    for chunk in ollama_chat(server).stream("hi"):
        if chunk.content:
            arrivals.append(time.monotonic())
            pieces.append(str(chunk.content))

    assert pieces == ["alpha ", "beta ", "gamma"]
    assert arrivals[-1] - arrivals[0] >= 0.05  # 2 gaps of 0.05 s; half of it proves the chunks were not sent at once


def test_ollama_tool_call_is_parsed(server: ScriptedLLM) -> None:
    server.reply(tool_calls=[("read_file", {"path": "notes.txt", "limit": 3})])

    message = ollama_chat(server).bind_tools([read_file]).invoke("read notes.txt")

    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("read_file", {"path": "notes.txt", "limit": 3})]
    assert server.chat_requests()[0]["tools"][0]["function"]["name"] == "read_file"


def test_ollama_reasoning_from_thinking(server: ScriptedLLM) -> None:
    server.reply("Paris.", reasoning="The capital of France is Paris.")

    message = ollama_chat(server, reasoning=True).invoke("capital?")

    assert message.content == "Paris."
    assert message.additional_kwargs["reasoning_content"] == "The capital of France is Paris."
    assert server.chat_requests()[0]["think"] is True


def test_ollama_think_false_gets_no_thinking(server: ScriptedLLM) -> None:
    server.reply("Paris.", reasoning="hidden")

    message = ollama_chat(server, reasoning=False).invoke("capital?")

    assert message.content == "Paris."
    assert "reasoning_content" not in message.additional_kwargs


def test_ollama_unknown_model_is_404(server: ScriptedLLM) -> None:
    server.reply("never sent")

    with pytest.raises(ollama.ResponseError) as caught:
        ollama_chat(server, model="mistral").invoke("hi")

    assert caught.value.status_code == 404
    assert caught.value.error == 'model "mistral" not found, try pulling it first'
    assert server.pending() == 1


def test_ollama_model_tags_resolve_like_ollama(server: ScriptedLLM) -> None:
    server.reply("tagged")
    server.reply("untagged")

    tagged = ollama_chat(server, model="qwen3:latest").invoke("hi")
    untagged = ollama_chat(server, model="llama3.2:3b").invoke("hi")

    assert (tagged.content, untagged.content) == ("tagged", "untagged")


def test_ollama_tags_and_validate_model_on_init(server: ScriptedLLM) -> None:
    listed = ollama.Client(host=server.url).list()

    assert [m.model for m in listed.models] == ["qwen3:latest", "llama3.2:3b"]
    ollama_chat(server, validate_model_on_init=True)  # does not raise
    with pytest.raises(ValueError, match="not found in Ollama"):
        ollama_chat(server, model="mistral", validate_model_on_init=True)


def test_ollama_show_returns_context_length(server: ScriptedLLM) -> None:
    client = ollama.Client(host=server.url)

    shown = client.show("qwen3")
    server.context_length = 8192
    reshown = client.show("llama3.2:3b")

    assert shown.modelinfo is not None and reshown.modelinfo is not None
    assert shown.modelinfo["qwen3.context_length"] == 40960
    assert reshown.modelinfo["llama3.2.context_length"] == 8192
    assert shown.details is not None and shown.details.family == "qwen3"
    assert shown.capabilities is not None and "tools" in shown.capabilities
    with pytest.raises(ollama.ResponseError) as caught:
        client.show("mistral")
    assert caught.value.status_code == 404
    assert caught.value.error == "model 'mistral' not found"


def test_ollama_non_streamed_chat(server: ScriptedLLM) -> None:
    server.reply("whole", reasoning="thought", tool_calls=[("read_file", {"path": "x"})], usage=(3, 2))

    answer = ollama.Client(host=server.url).chat(
        model="qwen3", messages=[{"role": "user", "content": "hi"}], stream=False, think=True
    )

    assert answer.done is True
    assert answer.message.content == "whole"
    assert answer.message.thinking == "thought"
    assert answer.message.tool_calls is not None
    assert answer.message.tool_calls[0].function.arguments == {"path": "x"}
    assert (answer.prompt_eval_count, answer.eval_count) == (3, 2)


@pytest.mark.parametrize("status", [400, 401, 429, 500])
def test_ollama_http_errors_raise_response_error(server: ScriptedLLM, status: int) -> None:
    server.fail(status)

    with pytest.raises(ollama.ResponseError) as caught:
        ollama_chat(server).invoke("hi")

    assert caught.value.status_code == status
    assert caught.value.error == f"scripted error (HTTP {status})"


def test_ollama_error_body_string_is_passed_through(server: ScriptedLLM) -> None:
    server.fail(500, {"error": "llama runner process has terminated"})

    with pytest.raises(ollama.ResponseError) as caught:
        ollama_chat(server).invoke("hi")

    assert caught.value.error == "llama runner process has terminated"


def test_ollama_timeout_on_hang_is_raw_httpx(server: ScriptedLLM) -> None:
    # ChatOllama has no timeout setting and does not wrap transport errors.
    server.hang()

    with pytest.raises(httpx.ReadTimeout):
        ollama_chat(server, client_kwargs={"timeout": 0.3}).invoke("hi")


def test_ollama_async_invoke(server: ScriptedLLM) -> None:
    server.reply("async ollama")

    message = asyncio.run(ollama_chat(server).ainvoke("hi"))

    assert message.content == "async ollama"


# -- the script itself --------------------------------------------------------------------------------


def test_queue_is_shared_between_protocols_then_default(server: ScriptedLLM) -> None:
    server.reply("first")
    server.reply("second")

    answers = [
        deepseek(server).invoke("a").content,
        ollama_chat(server).invoke("b").content,
        deepseek(server).invoke("c").content,
    ]
    server.default(Response(content="new default"))
    answers.append(ollama_chat(server).invoke("d").content)

    assert answers == ["first", "second", DEFAULT_REPLY, "new default"]
    assert [body["messages"][-1]["content"] for body in server.chat_requests()] == ["a", "b", "c", "d"]


def test_concurrent_requests_each_pop_one_entry(server: ScriptedLLM) -> None:
    def echo(body: dict) -> Response:
        return Response(content=f"echo {body['messages'][-1]['content']}", delay=0.3)

    for _ in range(3):
        server.respond_with(echo)
    results: dict[str, str] = {}

    def ask(prompt: str) -> None:
        results[prompt] = str(deepseek(server).invoke(prompt).content)

    threads = [threading.Thread(target=ask, args=(p,)) for p in ("x", "y", "z")]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=5)

    assert results == {"x": "echo x", "y": "echo y", "z": "echo z"}
    assert time.monotonic() - started < 0.8  # served in parallel, not 3 × 0.3 s
    assert server.pending() == 0


def test_default_callable_and_raising_callable(server: ScriptedLLM) -> None:
    server.default(lambda body: Response(content=f"default for {body['model']}"))
    server.respond_with(lambda body: 1 / 0)  # type: ignore[arg-type,return-value]

    with pytest.raises(openai.InternalServerError) as caught:
        deepseek(server).invoke("hi")
    message = deepseek(server).invoke("hi")

    assert "scripted callable raised ZeroDivisionError" in str(caught.value)
    assert message.content == "default for deepseek-chat"


def test_stop_releases_hanging_request_promptly() -> None:
    llm = ScriptedLLM().start()
    llm.hang()
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            ChatOllama(model="qwen3", base_url=llm.url).invoke("hi")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    client = threading.Thread(target=ask)
    client.start()
    deadline = time.monotonic() + 2
    while not llm.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    llm.stop()
    stopped_in = time.monotonic() - started
    client.join(timeout=2)

    assert llm.requests, "the client never reached the server"
    assert stopped_in < 0.5
    assert not client.is_alive()
    assert errors and isinstance(errors[0], httpx.HTTPError)


def test_stopped_server_refuses_connections() -> None:
    with ScriptedLLM() as llm:
        model = ChatDeepSeek(model="deepseek-chat", api_key="test-key", api_base=llm.url, max_retries=0)
        assert model.invoke("warm up the keep-alive connection").content == DEFAULT_REPLY

    with pytest.raises(openai.APIConnectionError) as caught:
        model.invoke("hi")
    assert isinstance(caught.value, ModelConnectionError)
    # ChatOllama's streamed chat does not wrap connect errors into ConnectionError.
    with pytest.raises(httpx.ConnectError):
        ChatOllama(model="qwen3", base_url=llm.url).invoke("hi")

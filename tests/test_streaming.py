"""Streamed turns: server-sent events as the model produces them, through Flask and through gunicorn."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlparse

from tests.conftest import TOKEN, Api
from tests.llm_server import ScriptedLLM
from tests.live import LiveServer


def parse_sse(text: str) -> list[tuple[str, dict]]:
    """(event, data) pairs of an SSE body; comment lines are skipped."""
    events = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line and not line.startswith(":")]
        if not lines:
            continue
        fields = dict(line.split(": ", 1) for line in lines)
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def stream_chat(api: Api, thread_id: str, message: str, **body: object) -> list[tuple[str, dict]]:
    response = api.client.post(
        f"/au/api/threads/{thread_id}/chat", json={"message": message, "stream": True, **body}, headers=api.headers
    )
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    return parse_sse(response.get_data(as_text=True))


def test_stream_sends_tool_events_tokens_and_done(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("", tool_calls=[("execute", {"command": "echo streamed-tool"})], usage=(100, 10))
    llm.reply("All done now.", usage=(150, 5))
    events = stream_chat(api, "t1", "run it")
    names = [name for name, _ in events]
    assert names[0] == "tool_call" and events[0][1] == {"name": "execute", "args": {"command": "echo streamed-tool"}}
    result = dict(events)["tool_result"]
    assert result["name"] == "execute" and "streamed-tool" in result["content"] and result["error"] is False
    tokens = "".join(data["text"] for name, data in events if name == "token")
    assert tokens == "All done now."
    assert names[-1] == "done"
    done = events[-1][1]
    assert done["reply"] == "All done now." and done["finish_reason"] == "stop"
    assert done["usage"] == {"input_tokens": 250, "output_tokens": 15, "total_tokens": 265, "model_calls": 2}


def test_streamed_turn_is_stored_like_a_plain_one(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("stored reply")
    stream_chat(api, "t1", "hello")
    stored = api.store.load("t1")["messages"]
    assert [(m["role"], m["content"]) for m in stored] == [("user", "hello"), ("assistant", "stored reply")]


def test_accept_header_asks_for_a_stream(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("via accept")
    response = api.client.post(
        "/au/api/threads/t1/chat", json={"message": "hi"}, headers={**api.headers, "Accept": "text/event-stream"}
    )
    assert response.mimetype == "text/event-stream"
    assert parse_sse(response.get_data(as_text=True))[-1][1]["reply"] == "via accept"


def test_reasoning_is_streamed_as_its_own_event(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config={"llm": {"model": "deepseek-reasoner"}})
    llm.reply("Paris.", reasoning="The capital of France is Paris.")
    events = stream_chat(api, "t1", "capital of France?")
    reasoning = "".join(data["text"] for name, data in events if name == "reasoning")
    assert reasoning == "The capital of France is Paris."
    assert "".join(data["text"] for name, data in events if name == "token") == "Paris."


def test_ollama_streams_tokens_and_usage(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config={"llm": {"provider": "ollama", "model": "qwen3"}}, env={"DEEPSEEK_API_KEY": None})
    llm.reply("offline and streaming", usage=(40, 3))
    events = stream_chat(api, "t1", "hi")
    assert "".join(data["text"] for name, data in events if name == "token") == "offline and streaming"
    assert events[-1][1]["usage"]["input_tokens"] == 40


def test_the_trace_of_a_streamed_turn_matches_a_plain_one(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("", tool_calls=[("ls", {"path": "/"})])
    llm.reply("plain and streamed")
    stream_chat(api, "t1", "list")
    trace = api.trace.getvalue()
    assert "ls" in trace and "plain and streamed" in trace and "2 steps" in trace


def test_stream_error_is_an_error_event_and_nothing_is_stored(api: Api, llm: ScriptedLLM) -> None:
    llm.fail(500)
    events = stream_chat(api, "t1", "hi")
    assert events[-1][0] == "error" and events[-1][1]["code"] == "llm_error"
    assert not api.thread_file("t1").exists()


def test_stream_value_must_be_boolean(api: Api, llm: ScriptedLLM) -> None:
    response = api.client.post("/au/api/threads/t1/chat", json={"message": "hi", "stream": "yes"}, headers=api.headers)
    assert response.status_code == 400
    assert llm.chat_requests() == []


# --- through the real WSGI server ------------------------------------------------------------------


def open_stream(server: LiveServer, thread_id: str, message: str) -> tuple[http.client.HTTPConnection, Iterator[str]]:
    url = urlparse(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = json.dumps({"message": message, "stream": True})
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    connection.request("POST", f"/au/api/threads/{thread_id}/chat", body=body, headers=headers)
    response = connection.getresponse()
    assert response.status == 200
    return connection, (line.decode() for line in response)


def test_tokens_reach_the_client_as_the_model_produces_them(live_server: LiveServer, llm: ScriptedLLM) -> None:
    llm.reply("one two three four five six", chunk_delay=0.25)
    connection, lines = open_stream(live_server, "live1", "count")
    arrivals: list[tuple[float, str]] = []
    for line in lines:
        if line.startswith("event: "):
            arrivals.append((time.monotonic(), line.removeprefix("event: ").strip()))
            if arrivals[-1][1] == "done":
                break
    connection.close()
    token_times = [at for at, name in arrivals if name == "token"]
    done_at = arrivals[-1][0]
    assert len(token_times) == 6
    # Six pieces 0.25 s apart: if the server buffered the response, all would arrive together with `done`.
    assert done_at - token_times[0] >= 0.6


def test_client_disconnect_mid_stream_still_completes_and_stores_the_turn(live_server: LiveServer, llm: ScriptedLLM) -> None:
    llm.reply("a slow reply that the client will not wait for", chunk_delay=0.2)
    connection, lines = open_stream(live_server, "gone", "start")
    for line in lines:
        if line.startswith("event: token"):
            break
    connection.close()
    thread_file = None
    for _ in range(100):
        body = get_json(live_server, "/au/api/threads/gone")
        if body and len(body["messages"]) == 2:
            thread_file = body
            break
        time.sleep(0.1)
    assert thread_file is not None, "the turn was not stored after the client left"
    assert thread_file["messages"][1]["content"] == "a slow reply that the client will not wait for"


def get_json(server: LiveServer, path: str) -> dict | None:
    """GET a route of the live server; None on an HTTP error."""
    request = urllib.request.Request(f"{server.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)
    except urllib.error.HTTPError:
        return None


def test_live_server_streams_with_accept_header(live_server: LiveServer, llm: ScriptedLLM) -> None:
    llm.reply("accepted")
    request = urllib.request.Request(
        f"{live_server.url}/au/api/threads/acc/chat",
        data=json.dumps({"message": "hi"}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", "Accept": "text/event-stream"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = parse_sse(response.read().decode())
    assert events[-1] == ("done", events[-1][1]) and events[-1][1]["reply"] == "accepted"


def test_streamed_reasoner_tool_loop_sends_reasoning_back(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config={"llm": {"model": "deepseek-reasoner"}})
    llm.reply("", tool_calls=[("ls", {"path": "/"})], reasoning="list first")
    llm.reply("Nothing there.", reasoning="empty")
    events = stream_chat(api, "t1", "what is there?")
    assert events[-1][0] == "done" and events[-1][1]["reply"] == "Nothing there."
    assistant = [m for m in llm.chat_requests()[1]["messages"] if m["role"] == "assistant"]
    assert assistant[0]["reasoning_content"] == "list first"

"""`python run.py chat`: SSE parsing and rendering, and the client against a real server."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.client import (
    DIM,
    Session,
    parse_sse,
    render_event,
    resolve_token,
    resolve_url,
    run_chat,
    use_color,
)
from tests.conftest import REPO, TOKEN
from tests.llm_server import ScriptedLLM
from tests.live import LiveServer, free_port

ANSI = re.compile(r"\x1b\[")


def scripted(*lines: str) -> Callable[[str], str]:
    """An input() that answers `lines` in order, then ends the input like Ctrl-D."""
    pending = list(lines)

    def fake_input(prompt: str) -> str:
        assert prompt == "you> "
        if not pending:
            raise EOFError
        return pending.pop(0)

    return fake_input


class Recorder(io.StringIO):
    """An output that remembers what each flush made visible."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def get_thread(server: LiveServer, thread_id: str) -> dict:
    response = httpx.get(f"{server.url}/au/api/threads/{thread_id}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    return response.json()


def chat(server: LiveServer, state: Path, *lines: str, thread_id: str | None = None, **kwargs) -> tuple[int, str]:
    out = kwargs.pop("out", None) or io.StringIO()
    code = run_chat(server.url, TOKEN, thread_id, input_fn=scripted(*lines), out=out, state_path=state, **kwargs)
    return code, out.getvalue()


def thread_of(output: str) -> str:
    match = re.search(r"thread ([A-Za-z0-9_-]+)", output)
    assert match, output
    return match.group(1)


# --- parse_sse -------------------------------------------------------------------------------------


def test_parse_sse_reads_events_and_joins_multi_line_data() -> None:
    lines = ["event: token", 'data: {"text": "a"}', "", "event: note", "data: first", "data:  second", ""]
    lines += ["data: x", ""]
    assert list(parse_sse(lines)) == [("token", '{"text": "a"}'), ("note", "first\n second"), ("message", "x")]


def test_parse_sse_skips_comments_and_empty_events() -> None:
    lines = [": keep-alive", "", "event: token", ": in the middle", 'data: {"text": "b"}', "", "event: lonely", ""]
    assert list(parse_sse(lines)) == [("token", '{"text": "b"}')]


def test_parse_sse_keeps_a_last_event_without_its_blank_line() -> None:
    lines = iter(["event: token", "data: 1", "", "event: done", "data: {}"])
    assert list(parse_sse(lines)) == [("token", "1"), ("done", "{}")]


def test_parse_sse_tolerates_crlf_and_no_space_after_colon() -> None:
    assert list(parse_sse(["event:error\r\n", "data:{}\r\n", "\r\n"])) == [("error", "{}")]


# --- render_event ----------------------------------------------------------------------------------


EVENTS: list[tuple[str, dict]] = [
    ("token", {"text": "Hel"}),
    ("reasoning", {"text": "thinking"}),
    ("tool_call", {"name": "ls", "args": {"path": "/"}}),
    ("tool_result", {"name": "ls", "content": "a\nb", "truncated": True, "error": False}),
    ("tool_result", {"name": "execute", "content": "boom", "truncated": False, "error": True}),
    ("done", {"thread_id": "t", "reply": "x", "finish_reason": "stop",
              "usage": {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15, "model_calls": 2}}),
    ("error", {"code": "llm_error", "message": "bad key"}),
]


@pytest.mark.parametrize(("event", "data"), EVENTS)
def test_render_event_has_no_ansi_without_color(event: str, data: dict) -> None:
    text = render_event(event, data, color=False)
    assert text and not ANSI.search(text)


def test_render_event_texts() -> None:
    render = dict((e, render_event(e, d, color=False)) for e, d in EVENTS[:4])
    assert render["token"] == "Hel"
    assert render["tool_call"] == '[tool call] ls {"path": "/"}\n'
    assert render["tool_result"] == "[tool result] ls: a b...\n"
    assert render_event(*EVENTS[4], color=False) == "[tool error] execute: boom\n"
    assert render_event(*EVENTS[5], color=False) == "[2 model calls, 15 tokens (12 in, 3 out)]\n"
    assert render_event(*EVENTS[6], color=False) == "error llm_error: bad key\n"
    step_limit = {"finish_reason": "step_limit", "usage": {"model_calls": 1}}
    assert "1 model call," in render_event("done", step_limit, color=False)
    assert "step_limit" in render_event("done", step_limit, color=False)
    assert render_event("something_new", {"text": "x"}, color=True) == ""


def test_render_event_dims_side_channels_but_not_the_reply() -> None:
    assert render_event("token", {"text": "Hel"}, color=True) == "Hel"
    for event, data in EVENTS[1:6]:
        assert render_event(event, data, color=True).startswith(DIM), event


def test_render_event_shortens_long_tool_output() -> None:
    text = render_event("tool_result", {"name": "read_file", "content": "x" * 5000}, color=False)
    assert len(text) < 300 and text.endswith("...\n")


# --- settings --------------------------------------------------------------------------------------


def test_url_and_token_defaults(tmp_path: Path) -> None:
    assert resolve_url(None, {}) == "http://127.0.0.1:5000"
    assert resolve_url(None, {"AU_URL": "http://h:1/"}) == "http://h:1"
    assert resolve_url("http://x:2", {"AU_URL": "http://h:1"}) == "http://x:2"
    dotenv = tmp_path / ".env"
    dotenv.write_text("AU_API_TOKENS=from-dotenv, second\n", encoding="utf-8")
    assert resolve_token("cli", {"AU_TOKEN": "env"}, str(dotenv)) == "cli"
    assert resolve_token(None, {"AU_TOKEN": "env"}, str(dotenv)) == "env"
    assert resolve_token(None, {}, str(dotenv)) == "from-dotenv"
    assert resolve_token(None, {"AU_API_TOKENS": " env-first ,x"}, str(dotenv)) == "env-first"
    assert resolve_token(None, {}, str(tmp_path / "missing.env")) is None


def test_color_only_on_a_terminal_without_no_color() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert use_color(Terminal(), {}) is True
    assert use_color(Terminal(), {"NO_COLOR": "1"}) is False
    assert use_color(io.StringIO(), {}) is False


# --- against a running server ----------------------------------------------------------------------


def test_chat_streams_the_reply_and_stores_the_turn(live_server: LiveServer, llm: ScriptedLLM, tmp_path: Path) -> None:
    llm.reply("Hello from au", chunk_delay=0.02)
    state = tmp_path / "state.json"
    out = Recorder()
    code, output = chat(live_server, state, "hi", out=out)
    assert code == 0
    thread_id = thread_of(output)
    assert "new thread" in output and "/new" in output and "/quit" in output
    assert "Hello from au\n" in output
    assert re.search(r"\[1 model call, \d+ tokens \(\d+ in, \d+ out\)\]", output)
    assert not ANSI.search(output)
    # Streamed: some flush showed part of the reply before the rest had arrived.
    assert any("Hel" in seen and "Hello from au" not in seen for seen in out.flushed)
    messages = get_thread(live_server, thread_id)["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [("user", "hi"), ("assistant", "Hello from au")]
    stored = json.loads((tmp_path / "data" / f"{thread_id}.json").read_text(encoding="utf-8"))
    assert len(stored["messages"]) == 2
    assert json.loads(state.read_text(encoding="utf-8")) == {live_server.url: {"thread_id": thread_id}}


def test_a_second_run_continues_the_thread_and_new_starts_another(
    live_server: LiveServer, llm: ScriptedLLM, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    llm.reply("first answer")
    _, first = chat(live_server, state, "one")
    thread_id = thread_of(first)
    llm.reply("second answer")
    code, second = chat(live_server, state, "/thread", "two")
    assert code == 0
    assert f"continuing thread {thread_id}" in second and f"\nthread {thread_id}\n" in second
    assert "second answer" in second
    assert [m["content"] for m in get_thread(live_server, thread_id)["messages"]] == [
        "one", "first answer", "two", "second answer"]
    # The model saw the earlier turn: the thread really continued.
    assert "first answer" in json.dumps(llm.chat_requests()[-1])

    llm.reply("fresh answer")
    code, third = chat(live_server, state, "/new", "three")
    new_id = re.search(r"new thread ([A-Za-z0-9_-]+)\n", third.split("/quit")[-1]).group(1)
    assert code == 0 and new_id != thread_id
    assert [m["content"] for m in get_thread(live_server, new_id)["messages"]] == ["three", "fresh answer"]
    assert json.loads(state.read_text(encoding="utf-8"))[live_server.url]["thread_id"] == new_id


def test_explicit_thread_is_used_and_remembered(live_server: LiveServer, llm: ScriptedLLM, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    llm.reply("on my thread")
    code, output = chat(live_server, state, "hello", thread_id="my-thread")
    assert code == 0 and "continuing thread my-thread" in output
    assert get_thread(live_server, "my-thread")["messages"][1]["content"] == "on my thread"
    assert json.loads(state.read_text(encoding="utf-8"))[live_server.url]["thread_id"] == "my-thread"
    code, output = chat(live_server, state, thread_id="not a/valid id")
    assert code == 1 and "error invalid_thread_id" in output


def test_tool_calls_are_shown_dimmed(live_server: LiveServer, llm: ScriptedLLM, tmp_path: Path) -> None:
    llm.reply("", tool_calls=[("ls", {"path": "/"})])
    llm.reply("The folder is listed.")
    code, output = chat(live_server, tmp_path / "state.json", "what is there?", color=True)
    assert code == 0
    assert f'{DIM}[tool call] ls {{"path": "/"}}' in output
    assert f"{DIM}[tool result] ls:" in output
    assert "The folder is listed.\n" in output
    assert output.index("[tool call] ls") < output.index("[tool result] ls") < output.index("The folder is listed.")
    assert f"{DIM}[2 model calls," in output


def test_errors_are_shown_and_the_session_goes_on(live_server: LiveServer, llm: ScriptedLLM, tmp_path: Path) -> None:
    llm.fail(500)  # provider fails after the stream started: an `error` event
    llm.reply("recovered")
    too_long = "x" * 40_000  # refused before the stream starts: a 413 JSON error
    code, output = chat(live_server, tmp_path / "state.json", "first", too_long, "again")
    assert code == 0
    assert re.search(r"^error llm_error: .+", output, re.MULTILINE), output
    assert re.search(r"^error payload_too_large: .+", output, re.MULTILINE), output
    assert output.rstrip().splitlines()[-2] == "recovered"
    assert [m["content"] for m in get_thread(live_server, thread_of(output))["messages"]] == ["again", "recovered"]


def test_a_wrong_token_stops_at_start(live_server: LiveServer, tmp_path: Path) -> None:
    out = io.StringIO()
    code = run_chat(live_server.url, "wrong-token", None, input_fn=scripted("hi"), out=out, state_path=tmp_path / "s")
    assert code == 1
    assert "error unauthorized" in out.getvalue() and "--token" in out.getvalue()
    assert not (tmp_path / "s").exists()


def test_unreachable_server_exits_1_with_a_hint(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    asked: list[str] = []
    out = io.StringIO()
    code = run_chat(url, TOKEN, None, input_fn=asked.append, out=out, state_path=tmp_path / "state.json")
    assert code == 1
    assert f"cannot reach au at {url}" in out.getvalue() and "python run.py" in out.getvalue()
    assert asked == []  # it says so before asking for input


def test_run_py_chat_in_a_subprocess(live_server: LiveServer, llm: ScriptedLLM, tmp_path: Path) -> None:
    llm.reply("Hello from the CLI")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AU_TOKEN": TOKEN}
    result = subprocess.run(
        [sys.executable, "run.py", "chat", "--url", live_server.url],
        cwd=REPO, env=env, input="hi\n", capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Hello from the CLI" in result.stdout
    assert "\x1b[" not in result.stdout  # not a terminal: plain text
    saved = json.loads((tmp_path / ".au_chat").read_text(encoding="utf-8"))
    assert saved[live_server.url]["thread_id"] == thread_of(result.stdout)



def test_a_reply_that_was_not_streamed_is_printed_and_a_cut_stream_is_reported() -> None:
    out = io.StringIO()
    session = Session(httpx.Client(), "http://au", out, color=False)  # _show never touches the network
    session.client.close()
    done = {"reply": "Stopped after 25 steps.", "finish_reason": "step_limit", "usage": {"model_calls": 25}}
    session._show([("tool_call", '{"name": "ls", "args": {}}'), ("done", json.dumps(done))])
    lines = out.getvalue().splitlines()
    assert lines[1:] == ["Stopped after 25 steps.", "[25 model calls, 0 tokens (0 in, 0 out), finish: step_limit]"]
    out.seek(0), out.truncate()
    session._show([("token", '{"text": "Half a rep"}')])
    assert out.getvalue() == "Half a rep\nerror incomplete_stream: the server ended the reply before it finished\n"

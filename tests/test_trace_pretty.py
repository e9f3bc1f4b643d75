"""Behaviour of the console trace printer (trace_pretty)."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.types import Overwrite

import trace_pretty as tp

ANSI = "\033["


def _call(name: str, args: dict[str, Any], call_id: str = "c1") -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class ScriptedChatModel(BaseChatModel):
    """In-process chat model that replays scripted AIMessages, one per call."""

    script: list[AIMessage]
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        reply = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return ChatResult(generations=[ChatGeneration(message=reply)])


def test_header_shows_thread_and_short_request_id() -> None:
    header = tp.format_header("thread-42", "0123456789abcdef")
    assert "thread-42" in header
    assert "01234567" in header and "0123456789abcdef" not in header


def test_tool_call_shows_name_and_args() -> None:
    msg = AIMessage(content="", tool_calls=[_call("get_weather", {"city": "Paris", "days": 2})])
    text = "\n".join(tp.format_update({"model": {"messages": [msg]}}))
    assert 'get_weather {"city":"Paris","days":2}' in text
    assert "reply" not in text  # a step that calls tools is not the final reply


def test_long_tool_args_are_truncated() -> None:
    msg = AIMessage(content="", tool_calls=[_call("write_file", {"content": "x" * 5000})])
    text = "\n".join(tp.format_update({"model": {"messages": [msg]}}))
    assert "x" * 5000 not in text
    assert "more chars cut" in text


def test_final_reply_is_labelled_reply() -> None:
    msg = AIMessage(content=[{"type": "text", "text": "It is sunny."}])
    lines = tp.format_update({"model": {"messages": [msg]}})
    assert any("reply:" in line and "It is sunny." in line for line in lines)


def test_reasoning_is_shown() -> None:
    from_kwargs = AIMessage(content="ok", additional_kwargs={"reasoning_content": "user wants weather"})
    from_blocks = AIMessage(content=[{"type": "reasoning", "reasoning": "check units"}, {"type": "text", "text": "ok"}])
    text = "\n".join(tp.format_update({"model": {"messages": [from_kwargs]}, "x": {"messages": [from_blocks]}}))
    assert "thinking: user wants weather" in text
    assert "thinking: check units" in text


def test_tool_result_shows_name_and_content() -> None:
    msg = ToolMessage(content="sunny in Paris", name="get_weather", tool_call_id="c1")
    lines = tp.format_update({"tools": {"messages": [msg]}})
    assert lines == ["  tool get_weather -> sunny in Paris"]


def test_long_tool_result_is_truncated() -> None:
    msg = ToolMessage(content="a" * 1000, name="read_file", tool_call_id="c1")
    text = "\n".join(tp.format_update({"tools": {"messages": [msg]}}, max_result_chars=300))
    assert "a" * 300 in text and "a" * 301 not in text
    assert "700 more chars cut" in text


def test_many_line_tool_result_is_truncated_by_lines() -> None:
    msg = ToolMessage(content="\n".join(f"line {i}" for i in range(40)), name="ls", tool_call_id="c1")
    text = "\n".join(tp.format_update({"tools": {"messages": [msg]}}))
    assert "line 0" in text and "line 39" not in text
    assert "more chars cut" in text


def test_error_tool_result_is_marked() -> None:
    ok = ToolMessage(content="fine", name="ls", tool_call_id="c1")
    bad = ToolMessage(content="Error: no such file", name="read_file", tool_call_id="c2", status="error")
    lines = tp.format_update({"tools": {"messages": [ok, bad]}})
    assert "ERROR" not in lines[0]
    assert "read_file ERROR -> Error: no such file" in lines[1]


def test_none_update_is_skipped() -> None:
    assert tp.format_update(None) == []
    assert tp.format_update({"PatchToolCallsMiddleware.before_agent": None}) == []
    out = io.StringIO()
    tp.TracePrinter(out, color=False).update({"SkillsMiddleware.before_model": None})
    assert out.getvalue() == ""


def test_non_message_updates_are_skipped() -> None:
    history = [HumanMessage("hi"), AIMessage(content="old answer")]
    update = {
        "SkillsMiddleware.before_agent": {"skills_metadata": [{"name": "demo"}], "skills_load_errors": []},
        "Rewrite.before_model": {"messages": Overwrite(history)},
        "PatchToolCallsMiddleware.before_agent": {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *history]},
        "weird": "not a mapping",
    }
    assert tp.format_update(update) == []


def test_footer_counts_tokens_and_steps() -> None:
    footer = tp.format_footer(
        steps=3, tool_calls=1, usage={"input_tokens": 1200, "output_tokens": 85}, elapsed_s=4.26, finish_reason="stop"
    )
    assert "3 steps" in footer and "1 tool call " in footer
    assert "1200 in" in footer and "85 out" in footer
    assert "4.3s" in footer and "finish=stop" in footer


def test_error_line_shows_code_and_message() -> None:
    assert "error MODEL_TIMEOUT: no answer in 60s" in tp.format_error("MODEL_TIMEOUT", "no answer in 60s")


def test_secrets_are_masked() -> None:
    key = "sk-live-0123456789"
    assert tp.mask_secrets(f"auth {key} and {key}", [key, "", "abc"]) == "auth *** and ***"
    assert tp.mask_secrets("abc is short", ["abc"]) == "abc is short"  # too short to be a real secret

    out = io.StringIO()
    printer = tp.TracePrinter(out, secrets=[key, "Bearer tok-abcdef"], color=False)
    printer.begin("t1", "r1")
    call = AIMessage(content="", tool_calls=[_call("http_get", {"headers": {"Authorization": "Bearer tok-abcdef"}})])
    printer.update({"model": {"messages": [call]}})
    printer.update({"tools": {"messages": [ToolMessage(content=f"echo {key}", name="http_get", tool_call_id="c1")]}})
    printer.note(f"key was {key}")
    printer.error("E", f"failed with {key}")
    text = out.getvalue()
    assert key not in text and "tok-abcdef" not in text
    assert text.count("***") == 4


def test_secret_cut_by_truncation_does_not_leak_a_prefix() -> None:
    key = "sk-0123456789abcdef"
    out = io.StringIO()
    result = "x" * 290 + key  # truncation at 300 chars would cut the key in half
    tp.TracePrinter(out, secrets=[key], color=False).update(
        {"tools": {"messages": [ToolMessage(content=result, name="t", tool_call_id="c1")]}}
    )
    assert "sk-01234" not in out.getvalue()


def test_a_turn_is_written_once_as_one_block_at_its_end() -> None:
    class CountingStream(io.StringIO):
        writes = 0

        def write(self, s: str) -> int:
            self.writes += 1
            return super().write(s)

    out = CountingStream()
    calls = [_call("a", {}), _call("b", {}, "c2")]
    msg = AIMessage(content="", tool_calls=calls, additional_kwargs={"reasoning_content": "r"})
    printer = tp.TracePrinter(out, color=False)
    printer.begin("t1", "r1")
    printer.update({"model": {"messages": [msg]}})
    assert out.writes == 0
    printer.finish(steps=1, tool_calls=2, usage={}, elapsed_s=0.1, finish_reason="stop")
    assert out.writes == 1
    assert out.getvalue().count("\n") == 6


def test_concurrent_turns_do_not_interleave() -> None:
    class SlowStream(io.StringIO):
        """Writes one char at a time, yielding the GIL, like a stream whose write is not atomic."""

        def write(self, s: str) -> int:
            for ch in s:
                super().write(ch)
                time.sleep(0)
            return len(s)

    out = SlowStream()

    def turn(name: str) -> None:
        msg = AIMessage(content="", tool_calls=[_call(f"{name}_{i}", {"who": name}, f"c{i}") for i in range(5)])
        printer = tp.TracePrinter(out, color=False)
        printer.begin(name, name)
        for _ in range(20):
            printer.update({"model": {"messages": [msg]}})
            time.sleep(0)
        printer.finish(steps=20, tool_calls=100, usage={}, elapsed_s=0.1, finish_reason="stop")

    threads = [threading.Thread(target=turn, args=(n,)) for n in ("alpha", "beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    block = lambda n: "  model\n" + "".join(f'    call {n}_{i} {{"who":"{n}"}}\n' for i in range(5))  # noqa: E731
    text = out.getvalue()
    for name in ("alpha", "beta"):
        start = text.index(f"thread {name}")
        assert text[start:].split("\n", 1)[1].startswith(block(name) * 20)


def test_no_color_when_not_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    printer = tp.TracePrinter(out)
    printer.begin("t1", "r1")
    printer.update({"tools": {"messages": [ToolMessage(content="boom", name="x", tool_call_id="c", status="error")]}})
    printer.finish(steps=1, tool_calls=0, usage={}, elapsed_s=0.1, finish_reason="stop")
    assert out.getvalue() and ANSI not in out.getvalue()


def test_color_on_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = FakeTTY()
    printer = tp.TracePrinter(out)
    printer.begin("t1", "r1")
    printer.error("llm_error", "boom")
    assert ANSI in out.getvalue()


def test_color_respects_NO_COLOR(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    out = FakeTTY()
    printer = tp.TracePrinter(out)
    printer.begin("t1", "r1")
    printer.finish(steps=1, tool_calls=0, usage={}, elapsed_s=0.1, finish_reason="stop")
    assert "thread t1" in out.getvalue() and ANSI not in out.getvalue()


def test_default_stream_is_stderr_at_call_time(capsys: pytest.CaptureFixture[str]) -> None:
    printer = tp.TracePrinter(color=False)
    printer.begin("t1", "r1")
    printer.note("summarised 40 older messages")
    printer.error("llm_error", "boom")
    captured = capsys.readouterr()
    assert "  note: summarised 40 older messages\n" in captured.err
    assert captured.out == ""


def test_real_deepagents_run_is_traced() -> None:
    deepagents = pytest.importorskip("deepagents")

    def get_weather(city: str) -> str:
        """Return the weather for a city."""
        return f"sunny in {city}"

    model = ScriptedChatModel(
        script=[
            AIMessage(
                content="",
                additional_kwargs={"reasoning_content": "need the weather tool"},
                tool_calls=[_call("get_weather", {"city": "Paris"})],
                usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
            ),
            AIMessage(content="It is sunny in Paris."),
        ]
    )
    agent = deepagents.create_deep_agent(model=model, tools=[get_weather])
    out = io.StringIO()
    printer = tp.TracePrinter(out, color=False)
    printer.begin("thread-1", "req-abc")
    for event in agent.stream({"messages": [HumanMessage("Weather in Paris?")]}, stream_mode="updates"):
        printer.update(event)
    printer.finish(steps=model.calls, tool_calls=1, usage={"input_tokens": 10, "output_tokens": 5},
                   elapsed_s=0.5, finish_reason="stop")
    text = out.getvalue()
    assert 'call get_weather {"city":"Paris"}' in text
    assert "tool get_weather -> sunny in Paris" in text
    assert "reply: It is sunny in Paris." in text
    assert "thinking: need the weather tool" in text
    assert "2 steps" in text
    # Order matters for a readable trace: call, then its result, then the reply.
    assert text.index("call get_weather") < text.index("tool get_weather") < text.index("reply:")

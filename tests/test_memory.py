"""Long threads stay cheap: a rolling summary in the thread file, recent turns within a budget."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.config import HistorySettings
from app.memory import SUMMARY_HEADER, Budget, ConversationMemory, budget_for
from tests.conftest import Api
from tests.llm_server import Response, ScriptedLLM

SMALL = {"history": {"summary_trigger_tokens": 500, "keep_recent_tokens": 200}}
FILLER = "lorem ipsum dolor sit amet " * 8  # ~55 tokens


def is_summary_request(body: dict[str, Any]) -> bool:
    return "You keep the memory" in json.dumps(body["messages"][-1]["content"])


def scripted(llm: ScriptedLLM, *, summary: Response | None = None) -> list[int]:
    """Answer summary requests with SUMMARY-<n> (or `summary`) and chat requests with 'answer'; count summaries."""
    summaries: list[int] = []

    def respond(body: dict[str, Any]) -> Response:
        if is_summary_request(body):
            summaries.append(len(summaries) + 1)
            return summary or Response(content=f"SUMMARY-{len(summaries)}: the user likes tea")
        return Response(content="answer " + FILLER)

    llm.default(respond)
    return summaries


def chat_many(api: Api, count: int, start: int = 0) -> None:
    for index in range(start, start + count):
        response = api.chat("long", f"question {index} {FILLER}")
        assert response.status_code == 200, response.get_json()


def agent_requests(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [body for body in llm.chat_requests() if not is_summary_request(body)]


def test_after_a_refresh_the_model_sees_the_summary_and_only_recent_turns(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config=SMALL)
    scripted(llm)
    chat_many(api, 12)
    stored = api.store.load("long")
    summary = stored["summary"]
    assert summary["text"].startswith("SUMMARY-") and 0 < summary["covers"] < len(stored["messages"])
    chat_many(api, 1, start=12)
    sent = agent_requests(llm)[-1]["messages"]
    stored = api.store.load("long")
    assert sent[1]["role"] == "system" and SUMMARY_HEADER.strip() in sent[1]["content"]
    assert stored["summary"]["text"] in sent[1]["content"]
    recent = [m["content"] for m in stored["messages"][stored["summary"]["covers"] : -2]]
    assert [m["content"] for m in sent[2:-1]] == recent
    assert sent[-1]["content"].startswith("question 12")
    assert "question 0 " not in json.dumps(sent)


def test_nothing_is_lost_from_the_thread_file(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config=SMALL)
    scripted(llm)
    chat_many(api, 15)
    messages = api.store.load("long")["messages"]
    assert len(messages) == 30
    assert [m["content"].split()[1] for m in messages[::2]] == [str(i) for i in range(15)]


def test_summary_is_refreshed_once_per_many_turns_not_every_turn(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config=SMALL)
    summaries = scripted(llm)
    chat_many(api, 30)
    assert 1 <= len(summaries) <= 8
    assert len(llm.chat_requests()) <= 30 * 1.3


def test_the_next_summary_builds_on_the_previous_one(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config=SMALL)
    scripted(llm)
    chat_many(api, 20)
    summary_requests = [body for body in llm.chat_requests() if is_summary_request(body)]
    assert len(summary_requests) >= 2
    assert "SUMMARY-1" in json.dumps(summary_requests[1]["messages"])
    assert api.store.load("long")["summary"]["text"].startswith(f"SUMMARY-{len(summary_requests)}")


def test_refresh_shows_in_the_trace_and_in_usage(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config=SMALL)
    summaries = scripted(llm)
    calls = []
    while not summaries:
        calls.append(api.chat("long", f"question {FILLER}").get_json()["usage"]["model_calls"])
    assert calls[-1] == 2 and set(calls[:-1]) == {1}
    assert "summary refreshed" in api.trace.getvalue()


def test_a_failed_summary_falls_back_to_truncation_and_keeps_the_turn(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config=SMALL)
    scripted(llm, summary=Response(status=500))
    chat_many(api, 12)
    stored = api.store.load("long")
    assert "summary" not in stored and len(stored["messages"]) == 24
    assert "summary failed" in api.trace.getvalue()


def test_a_failed_turn_does_not_store_the_refreshed_summary(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config=SMALL)
    summaries = scripted(llm)
    chat_many(api, 5)  # ~600 tokens stored: the next turn must refresh the summary first
    assert not summaries
    before = api.thread_file("long").read_bytes()

    def respond(body: dict[str, Any]) -> Response:
        if is_summary_request(body):
            summaries.append(1)
            return Response(content="SUMMARY-new")
        return Response(status=500)

    llm.default(respond)
    response = api.chat("long", "one more")
    assert response.status_code == 502
    assert summaries, "the stored tail should have forced a refresh"
    assert api.thread_file("long").read_bytes() == before


def test_ollama_gets_num_ctx_from_the_models_context_length(make_api, llm: ScriptedLLM) -> None:
    llm.context_length = 16384
    api = make_api(config={"llm": {"provider": "ollama", "model": "qwen3"}}, env={"DEEPSEEK_API_KEY": None})
    llm.reply("ok")
    api.chat("t1", "hi")
    assert llm.chat_requests()[0]["options"]["num_ctx"] == 16384
    assert any(r.path == "/api/show" for r in llm.requests)


def test_ollama_context_is_capped_unless_configured(make_api, llm: ScriptedLLM) -> None:
    llm.context_length = 262144
    capped = make_api(config={"llm": {"provider": "ollama", "model": "qwen3"}}, env={"DEEPSEEK_API_KEY": None})
    llm.reply("ok")
    capped.chat("t1", "hi")
    assert llm.chat_requests()[-1]["options"]["num_ctx"] == 32768
    explicit = make_api(
        config={"llm": {"provider": "ollama", "model": "qwen3", "context_window": 65536}}, env={"DEEPSEEK_API_KEY": None}
    )
    llm.reply("ok")
    explicit.chat("t2", "hi")
    assert llm.chat_requests()[-1]["options"]["num_ctx"] == 65536


@pytest.mark.parametrize("window, expected_room", [(128_000, 128_000 - 6_000 - 4_096), (8_192, 1_000)])
def test_budget_leaves_room_for_tools_skills_and_the_reply(window: int, expected_room: int) -> None:
    budget = budget_for(HistorySettings(), window)
    assert budget.history_tokens == expected_room
    assert budget.refresh_tokens <= budget.history_tokens
    assert budget.keep_tokens <= budget.refresh_tokens // 2


def test_recent_turns_are_cut_to_the_budget_starting_at_a_question() -> None:
    memory = ConversationMemory(model=None, budget=Budget(history_tokens=120, refresh_tokens=10**6, keep_tokens=50))  # type: ignore[arg-type]
    stored = []
    for index in range(10):
        stored += [{"role": "user", "content": f"q{index} " + "x" * 100}, {"role": "assistant", "content": f"a{index} " + "y" * 100}]
    prepared = memory.prepare({"thread_id": "t", "messages": stored}, "new")
    contents = [m.content for m in prepared.messages]
    assert contents[-1] == "new"
    assert contents[0].startswith("q") and contents[-2].startswith("a9")
    assert len(contents) < 21
    assert any("left out" in note for note in prepared.notes)

"""A turn end to end over HTTP: the real ChatDeepSeek/ChatOllama clients against the scripted server."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from tests.conftest import API_KEY, TOKEN, Api
from tests.llm_server import Response, ScriptedLLM


def tool_results(request: dict) -> list[str]:
    """Contents of the tool messages the model was sent in one request."""
    return [str(m["content"]) for m in request["messages"] if m["role"] == "tool"]


def tool_names(request: dict) -> set[str]:
    return {tool["function"]["name"] for tool in request.get("tools", [])}


# --- auth and health -------------------------------------------------------------------------------


def test_health_needs_no_token(api: Api, llm: ScriptedLLM) -> None:
    body = api.client.get("/au/api/health").get_json()
    assert body["status"] == "ok"
    assert body["llm"] == {"provider": "deepseek", "model": "deepseek-chat", "configured": True}
    assert body["skills"] >= 3


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", f"Basic {TOKEN}", "Bearer wrong-token", f"Bearer {TOKEN}x", f"bearer{TOKEN}"],
)
def test_chat_without_a_valid_token_is_401(api: Api, llm: ScriptedLLM, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    response = api.client.post("/au/api/threads/t1/chat", json={"message": "hi"}, headers=headers)
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "unauthorized"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert llm.chat_requests() == []
    assert not api.thread_file("t1").exists()


def test_any_of_several_tokens_is_accepted(make_api, llm: ScriptedLLM) -> None:
    api = make_api(env={"AU_API_TOKENS": f"first-token-abcdef, {TOKEN}"})
    llm.reply("hello")
    assert api.chat("t1", "hi").status_code == 200


def test_unknown_route_and_wrong_method_are_json(api: Api) -> None:
    missing = api.get("/nope")
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "not_found"
    wrong = api.get("/threads/t1/chat")
    assert wrong.status_code == 405 and wrong.get_json()["error"]["code"] == "method_not_allowed"


# --- a turn ----------------------------------------------------------------------------------------


def test_chat_round_trip_returns_reply_and_usage(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("Hello there!", usage=(120, 7))
    response = api.chat("t1", "hi")
    assert response.status_code == 200
    assert response.get_json() == {
        "thread_id": "t1",
        "reply": "Hello there!",
        "finish_reason": "stop",
        "usage": {"input_tokens": 120, "output_tokens": 7, "total_tokens": 127, "model_calls": 1},
    }
    sent = llm.chat_requests()[0]
    assert sent["model"] == "deepseek-chat"
    assert sent["messages"][0]["role"] == "system"
    assert "You are au" in json.dumps(sent["messages"][0]["content"])
    assert sent["messages"][-1] == {"role": "user", "content": "hi"}


def test_second_turn_sends_the_rebuilt_history(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("Nice to meet you, Ada.")
    llm.reply("Your name is Ada.")
    api.chat("t1", "My name is Ada.")
    api.chat("t1", "What is my name?")
    second = llm.chat_requests()[1]["messages"]
    assert [(m["role"], m["content"]) for m in second[1:]] == [
        ("user", "My name is Ada."),
        ("assistant", "Nice to meet you, Ada."),
        ("user", "What is my name?"),
    ]


def test_threads_do_not_see_each_other(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("one")
    llm.reply("two")
    api.chat("a", "secret of thread a")
    api.chat("b", "hello from b")
    assert "secret of thread a" not in json.dumps(llm.chat_requests()[1]["messages"])


def test_thread_file_holds_user_and_assistant_turns_with_utc_timestamps(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("", tool_calls=[("ls", {"path": "/"})])
    llm.reply("Done.")
    api.chat("t1", "list my files")
    stored = json.loads(api.thread_file("t1").read_text(encoding="utf-8"))
    assert stored["thread_id"] == "t1"
    assert [(m["role"], m["content"]) for m in stored["messages"]] == [("user", "list my files"), ("assistant", "Done.")]
    for message in stored["messages"]:
        assert datetime.fromisoformat(message["ts"]).utcoffset().total_seconds() == 0


def test_tool_loop_runs_the_shell_and_feeds_the_result_back(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("", tool_calls=[("execute", {"command": "echo $((6*7))"})])
    llm.reply("The answer is 42.")
    body = api.chat("t1", "compute 6*7").get_json()
    assert body["reply"] == "The answer is 42."
    assert body["usage"]["model_calls"] == 2
    assert any("42" in result for result in tool_results(llm.chat_requests()[1]))


def test_a_tool_that_raises_comes_back_to_the_model_as_an_error(make_api, llm: ScriptedLLM) -> None:
    from langchain_core.tools import tool

    @tool
    def explode(what: str) -> str:
        """Always fails."""
        raise RuntimeError(f"cannot {what}")

    api = make_api(tools=[explode])
    llm.reply("", tool_calls=[("explode", {"what": "fly"})])
    llm.reply("That tool failed, sorry.")
    response = api.chat("t1", "try it")
    assert response.status_code == 200
    assert response.get_json()["reply"] == "That tool failed, sorry."
    assert any("cannot fly" in result and "Error" in result for result in tool_results(llm.chat_requests()[1]))


def test_step_limit_ends_the_turn_with_a_plain_reply(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config={"agent": {"max_steps": 3}})
    llm.default(Response(tool_calls=[("ls", {"path": "/"})]))
    body = api.chat("t1", "loop forever").get_json()
    assert body["finish_reason"] == "step_limit"
    assert "3 steps" in body["reply"]
    assert body["usage"]["model_calls"] == 3
    assert len(llm.chat_requests()) == 3
    stored = api.store.load("t1")["messages"]
    assert stored[-1]["content"] == body["reply"]


def test_trace_shows_the_turn_without_secrets(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("", tool_calls=[("execute", {"command": "echo hello-trace"})], reasoning=None)
    llm.reply(f"final answer (key {API_KEY})")
    api.chat("t1", "run it")
    trace = api.trace.getvalue()
    assert "t1" in trace
    assert "execute" in trace and "echo hello-trace" in trace
    assert "final answer" in trace
    assert "2 steps" in trace
    assert API_KEY not in trace and TOKEN not in trace


def test_shell_commands_do_not_see_secrets(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("", tool_calls=[("execute", {"command": "env"})])
    llm.reply("ok")
    api.chat("t1", "show env")
    output = tool_results(llm.chat_requests()[1])[0]
    assert "PATH=" in output
    assert API_KEY not in output and TOKEN not in output
    assert "DEEPSEEK" not in output


def test_shell_disabled_removes_the_execute_tool(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config={"shell": {"enabled": False}})
    llm.reply("no shell here")
    api.chat("t1", "hi")
    tools = tool_names(llm.chat_requests()[0])
    assert "execute" not in tools
    assert {"read_file", "http_request"} <= tools


# --- skills ----------------------------------------------------------------------------------------


def test_model_sees_skill_names_and_reads_a_skill_with_read_file(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("", tool_calls=[("read_file", {"file_path": "/skills/time-now/SKILL.md", "limit": 1000})])
    llm.reply("It is noon.")
    api.chat("t1", "what time is it?")
    first, second = llm.chat_requests()
    system = json.dumps(first["messages"][0]["content"])
    assert "time-now" in system and "/skills/time-now/SKILL.md" in system
    assert any("name: time-now" in result for result in tool_results(second))


def test_skill_added_while_the_server_runs_is_offered_on_the_next_request(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("first")
    api.chat("t1", "hi")
    folder = api.app.extensions["au"].settings.agent.skills_dir / "weather-check"
    folder.mkdir()
    (folder / "SKILL.md").write_text(
        "---\nname: weather-check\ndescription: Use when the user asks about the weather.\n---\n# Weather\nFetch it.\n",
        encoding="utf-8",
    )
    llm.reply("second")
    api.chat("t1", "weather?")
    first, second = llm.chat_requests()
    assert "weather-check" not in json.dumps(first["messages"][0]["content"])
    assert "weather-check" in json.dumps(second["messages"][0]["content"])


def test_malformed_skill_is_skipped_and_the_server_keeps_serving(api: Api, llm: ScriptedLLM, caplog) -> None:
    folder = api.app.extensions["au"].settings.agent.skills_dir / "Bad_Name"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: Bad_Name\ndescription: broken\n---\nbody\n", encoding="utf-8")
    llm.reply("still fine")
    response = api.chat("t1", "hi")
    assert response.status_code == 200
    assert "Bad_Name" not in json.dumps(llm.chat_requests()[0]["messages"][0]["content"])
    assert any("Bad_Name" in record.getMessage() and "SKILL.md" in record.getMessage() for record in caplog.records)


# --- providers -------------------------------------------------------------------------------------


def test_reasoner_tool_loop_sends_reasoning_back(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config={"llm": {"model": "deepseek-reasoner"}})
    llm.reply("", tool_calls=[("ls", {"path": "/"})], reasoning="I should list the files first.")
    llm.reply("There are no files.", reasoning="The listing was empty.")
    response = api.chat("t1", "what files do I have?")
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["reply"] == "There are no files."
    assistant = [m for m in llm.chat_requests()[1]["messages"] if m["role"] == "assistant"]
    assert assistant[0]["reasoning_content"] == "I should list the files first."
    assert "I should list the files first." in api.trace.getvalue()


def test_ollama_provider_round_trip_with_a_tool(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config={"llm": {"provider": "ollama", "model": "qwen3"}}, env={"DEEPSEEK_API_KEY": None})
    llm.reply("", tool_calls=[("execute", {"command": "echo from-ollama"})], usage=(50, 5))
    llm.reply("Done offline.", usage=(80, 4))
    response = api.chat("t1", "run it")
    assert response.status_code == 200
    body = response.get_json()
    assert body["reply"] == "Done offline."
    assert body["usage"] == {"input_tokens": 130, "output_tokens": 9, "total_tokens": 139, "model_calls": 2}
    paths = [r.path for r in llm.requests]
    assert "/api/chat" in paths
    assert any("from-ollama" in str(m.get("content")) for m in llm.chat_requests()[1]["messages"] if m["role"] == "tool")


def test_health_shows_ollama_configured_without_a_key(make_api) -> None:
    api = make_api(config={"llm": {"provider": "ollama", "model": "qwen3"}}, env={"DEEPSEEK_API_KEY": None})
    assert api.client.get("/au/api/health").get_json()["llm"] == {"provider": "ollama", "model": "qwen3", "configured": True}


def test_deepseek_without_a_key_starts_and_chat_is_503(make_api, llm: ScriptedLLM) -> None:
    api = make_api(env={"DEEPSEEK_API_KEY": None})
    assert api.client.get("/au/api/health").get_json()["llm"]["configured"] is False
    response = api.chat("t1", "hi")
    assert response.status_code == 503
    error = response.get_json()["error"]
    assert error["code"] == "llm_not_configured" and "DEEPSEEK_API_KEY" in error["message"]
    assert llm.chat_requests() == []
    assert not api.thread_file("t1").exists()


# --- summarisation inside a turn ---------------------------------------------------------------------


def test_evicted_history_is_kept_per_thread_outside_the_workspace(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config={"summarization": {"trigger_tokens": 1000, "keep_messages": 2}})
    llm.reply("", tool_calls=[("execute", {"command": "echo step-one"})])
    llm.default(Response(content="summary or answer"))
    response = api.chat("t9", "do a long task")
    assert response.status_code == 200
    settings = api.app.extensions["au"].settings
    offloaded = list((settings.history.data_dir / "conversation_history" / "t9").glob("*.md"))
    assert offloaded, "summarisation should have written the evicted messages"
    assert "do a long task" in offloaded[0].read_text(encoding="utf-8")
    assert not list(settings.shell.workspace.rglob("*.md"))


def test_the_model_cannot_rewrite_skills(api: Api, llm: ScriptedLLM) -> None:
    llm.reply("", tool_calls=[("write_file", {"file_path": "/skills/evil/SKILL.md", "content": "---\nname: evil\n---\n"})])
    llm.reply("I could not.")
    assert api.chat("t1", "make a skill").status_code == 200
    skills_dir = api.app.extensions["au"].settings.agent.skills_dir
    assert not (skills_dir / "evil").exists()
    assert any("denied" in result.lower() for result in tool_results(llm.chat_requests()[1]))


@pytest.mark.parametrize("host", ["attacker.example:5000", "evil.test", "127.0.0.1.nip.io"])
def test_without_tokens_only_local_host_names_are_answered(make_api, llm: ScriptedLLM, host: str) -> None:
    api = make_api(env={"AU_API_TOKENS": None})
    llm.reply("hi")
    assert api.client.post("/au/api/threads", headers={"Host": "localhost:5000"}).status_code == 201
    response = api.client.get("/au/api/threads", headers={"Host": host})
    assert response.status_code == 401
    assert "127.0.0.1" in response.get_json()["error"]["message"]


def test_large_tool_results_are_kept_per_thread_outside_the_workspace(make_api, llm: ScriptedLLM) -> None:
    from langchain_core.tools import tool

    @tool
    def dump(size: int) -> str:
        """Return a lot of text."""
        return "word " * size

    api = make_api(tools=[dump])
    llm.reply("", tool_calls=[("dump", {"size": 40_000})])
    llm.reply("done")
    assert api.chat("big", "dump it").status_code == 200
    settings = api.app.extensions["au"].settings
    offloaded = list((settings.history.data_dir / "conversation_history" / "big" / "large_tool_results").iterdir())
    assert offloaded and "word word" in offloaded[0].read_text(encoding="utf-8")
    assert not (settings.shell.workspace / "large_tool_results").exists()
    assert len(json.dumps(llm.chat_requests()[1]["messages"])) < 100_000

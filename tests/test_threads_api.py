"""Managing threads, skills and health over HTTP without opening files."""

from __future__ import annotations

import json
import re

from app import __version__
from tests.conftest import Api
from tests.llm_server import Response, ScriptedLLM


def chat_turns(api: Api, llm: ScriptedLLM, thread_id: str, *messages: str) -> None:
    for message in messages:
        llm.reply(f"re: {message}")
        assert api.chat(thread_id, message).status_code == 200


def test_list_threads_newest_first_with_titles_and_counts(api: Api, llm: ScriptedLLM) -> None:
    chat_turns(api, llm, "older", "first question of the older thread")
    chat_turns(api, llm, "newer", "a " * 60 + "long opening message", "second")
    # Timestamps have one-second resolution; make the order unambiguous.
    data = api.store.load("older")
    data["messages"][-1]["ts"] = "2020-01-01T00:00:00+00:00"
    api.thread_file("older").write_text(json.dumps(data), encoding="utf-8")
    body = api.get("/threads").get_json()
    assert [t["thread_id"] for t in body["threads"]] == ["newer", "older"]
    newer, older = body["threads"]
    assert newer["message_count"] == 4 and older["message_count"] == 2
    assert older["title"] == "first question of the older thread"
    assert len(newer["title"]) <= 60 and newer["title"].startswith("a a a")
    assert body["total"] == 2


def test_list_threads_pages_with_limit_and_offset(api: Api, llm: ScriptedLLM) -> None:
    for index in range(5):
        api.store.create(f"t{index}")
    first = api.get("/threads?limit=2").get_json()
    rest = api.get("/threads?limit=10&offset=2").get_json()
    assert len(first["threads"]) == 2 and len(rest["threads"]) == 3
    ids = {t["thread_id"] for t in first["threads"] + rest["threads"]}
    assert ids == {f"t{index}" for index in range(5)}


def test_get_thread_returns_the_file_content(api: Api, llm: ScriptedLLM) -> None:
    chat_turns(api, llm, "t1", "hello")
    body = api.get("/threads/t1").get_json()
    assert body == api.store.load("t1")
    assert [m["content"] for m in body["messages"]] == ["hello", "re: hello"]


def test_unknown_thread_is_404_for_get_and_delete(api: Api) -> None:
    for response in (api.get("/threads/nope"), api.delete("/threads/nope")):
        assert response.status_code == 404
        assert response.get_json()["error"]["code"] == "not_found"


def test_delete_removes_the_thread_and_a_new_chat_starts_fresh(api: Api, llm: ScriptedLLM) -> None:
    chat_turns(api, llm, "t1", "remember 42")
    response = api.delete("/threads/t1")
    assert response.status_code == 204 and response.data == b""
    assert not api.thread_file("t1").exists()
    assert api.get("/threads/t1").status_code == 404
    llm.reply("fresh")
    api.chat("t1", "what did I say?")
    assert "remember 42" not in str(llm.chat_requests()[-1]["messages"])


def test_create_thread_returns_a_new_empty_thread(api: Api) -> None:
    first = api.post("/threads")
    second = api.post("/threads")
    assert first.status_code == 201
    body = first.get_json()
    assert body["messages"] == [] and re.fullmatch(r"[A-Za-z0-9_-]{1,128}", body["thread_id"])
    assert body["thread_id"] != second.get_json()["thread_id"]
    assert api.get(f"/threads/{body['thread_id']}").get_json() == body


def test_thread_routes_need_a_token(api: Api) -> None:
    for method, path in [("get", "/threads"), ("post", "/threads"), ("get", "/threads/t1"), ("delete", "/threads/t1"), ("get", "/skills")]:
        response = getattr(api.client, method)(f"/au/api{path}")
        assert response.status_code == 401, (method, path)


def test_skills_lists_loaded_skills_and_why_others_are_skipped(api: Api) -> None:
    skills_dir = api.app.extensions["au"].settings.agent.skills_dir
    broken = skills_dir / "broken-one"
    broken.mkdir()
    (broken / "SKILL.md").write_text("no front matter here\n", encoding="utf-8")
    mismatch = skills_dir / "other-name"
    mismatch.mkdir()
    (mismatch / "SKILL.md").write_text("---\nname: not-the-folder\ndescription: x\n---\n", encoding="utf-8")
    body = api.get("/skills").get_json()
    names = {s["name"] for s in body["skills"]}
    assert {"time-now", "notes", "web-page"} <= names
    time_now = next(s for s in body["skills"] if s["name"] == "time-now")
    assert time_now["path"] == "/skills/time-now/SKILL.md" and time_now["description"]
    errors = {e["file"].split("/")[-2]: e["reason"] for e in body["errors"]}
    assert "front matter" in errors["broken-one"]
    assert "folder name" in errors["other-name"]
    assert "broken-one" not in names and "not-the-folder" not in names


def test_health_reports_version_provider_and_skill_count(api: Api) -> None:
    body = api.client.get("/au/api/health").get_json()
    skills = api.get("/skills").get_json()["skills"]
    assert body["version"] == __version__
    assert body["skills"] == len(skills)
    assert body["llm"]["provider"] == "deepseek"


def test_deleting_a_thread_removes_its_evicted_history(make_api, llm: ScriptedLLM) -> None:
    api = make_api(config={"summarization": {"trigger_tokens": 1000, "keep_messages": 2}})
    llm.reply("", tool_calls=[("ls", {"path": "/"})])
    llm.default(Response(content="summary or answer"))
    api.chat("t1", "long task")
    folder = api.store.data_dir / "conversation_history" / "t1"
    assert any(folder.iterdir())
    api.delete("/threads/t1")
    assert not folder.exists()

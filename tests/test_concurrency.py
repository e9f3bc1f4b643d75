"""Concurrent clients: same-thread turns are serialised (also across worker processes), other threads never wait.

Serialisation is proven by what the model was sent: the k-th turn of a thread must see the k-1 turns
before it. Parallelism is proven with a barrier inside the scripted model: two model calls must be in
flight at the same time to pass it, otherwise it times out and the turn fails. No timed assertions.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import API_KEY, TOKEN, Api
from tests.llm_server import Response, ScriptedLLM
from tests.live import LiveServer, start_server

HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def last_user_message(body: dict) -> str:
    return next(str(m["content"]) for m in reversed(body["messages"]) if m["role"] == "user")


def echo(body: dict, delay: float = 0.05) -> Response:
    return Response(content="echo: " + last_user_message(body), delay=delay)


def conversation(body: dict) -> list[tuple[str, str]]:
    """The user/assistant messages the model was sent (system prompt left out)."""
    return [(m["role"], str(m["content"])) for m in body["messages"] if m["role"] in ("user", "assistant")]


def barrier_reply(parties: int = 2) -> Callable[[dict], Response]:
    """A model that answers only once `parties` calls are waiting at the same time (else it raises → 502)."""
    barrier = threading.Barrier(parties, timeout=5)

    def respond(body: dict) -> Response:
        barrier.wait()
        return Response(content="together: " + last_user_message(body))

    return respond


def assert_turns_stored_in_order(messages: list[dict[str, Any]], questions: list[str]) -> None:
    """Every question once, each reply right after its own question, roles alternating."""
    assert len(messages) == 2 * len(questions)
    assert [m["role"] for m in messages] == ["user", "assistant"] * len(questions)
    for user, assistant in zip(messages[::2], messages[1::2], strict=True):
        assert assistant["content"] == "echo: " + user["content"]
    assert sorted(m["content"] for m in messages[::2]) == sorted(questions)


def assert_history_grew_by_one_turn_per_call(requests: list[dict], messages: list[dict[str, Any]]) -> None:
    """The k-th model call saw exactly the k-1 turns stored before it, then its own question."""
    stored = [(m["role"], m["content"]) for m in messages]
    assert len(requests) == len(messages) // 2
    for k, body in enumerate(requests):
        seen = conversation(body)
        assert len(seen) == 2 * k + 1, f"call {k} saw {len(seen)} messages"
        assert seen[:-1] == stored[: 2 * k]
        assert seen[-1] == stored[2 * k]


# --- one process, several Python threads (Flask test clients) ---------------------------------------


def test_same_thread_requests_are_serialised_and_every_turn_is_stored_in_order(api: Api, llm: ScriptedLLM) -> None:
    llm.default(echo)
    questions = [f"question {n}" for n in range(8)]

    def ask(question: str) -> tuple[int, dict]:
        client = api.app.test_client()
        response = client.post("/au/api/threads/shared/chat", json={"message": question}, headers=HEADERS)
        return response.status_code, response.get_json()

    with ThreadPoolExecutor(max_workers=len(questions)) as pool:
        results = list(pool.map(ask, questions))

    for question, (status, body) in zip(questions, results, strict=True):
        assert status == 200, body
        assert body["reply"] == "echo: " + question
    messages = api.store.load("shared")["messages"]
    assert_turns_stored_in_order(messages, questions)
    assert_history_grew_by_one_turn_per_call(llm.chat_requests(), messages)


def test_different_threads_run_their_model_calls_at_the_same_time(api: Api, llm: ScriptedLLM) -> None:
    llm.default(barrier_reply())

    def ask(thread_id: str) -> tuple[int, dict]:
        client = api.app.test_client()
        message = {"message": f"hi from {thread_id}"}
        response = client.post(f"/au/api/threads/{thread_id}/chat", json=message, headers=HEADERS)
        return response.status_code, response.get_json()

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(("a", "b"), pool.map(ask, ("a", "b")), strict=True))

    for thread_id, (status, body) in results.items():
        assert status == 200, body
        assert body["reply"] == f"together: hi from {thread_id}"
        assert len(api.store.load(thread_id)["messages"]) == 2


# --- several worker processes (python run.py with server.workers: 2) --------------------------------


def post_chat(server: LiveServer, thread_id: str, message: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{server.url}/au/api/threads/{thread_id}/chat",
        data=json.dumps({"message": message}).encode(),
        headers={**HEADERS, "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def lock_holders(lock_file: Path) -> set[int]:
    """PIDs holding (not waiting for) a flock on lock_file, read from /proc/locks."""
    inode = str(lock_file.stat().st_ino)
    holders = set()
    for line in Path("/proc/locks").read_text(encoding="ascii").splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue
        if fields[5].rsplit(":", 1)[-1] == inode:
            holders.add(int(fields[4]))
    return holders


def chat_batch(
    server: LiveServer, llm: ScriptedLLM, thread_id: str, questions: list[str]
) -> tuple[list[tuple[int, dict]], list[set[int]]]:
    """Send every question to one thread at once; the answers, and who held the thread's lock in each model call."""
    lock_file = server.log_path.parent / "data" / f"{thread_id}.lock"
    holders: list[set[int]] = []

    def respond(body: dict) -> Response:
        # Runs while the worker that sent this call holds the thread's lock.
        holders.append(lock_holders(lock_file))
        return echo(body, delay=0.1)

    llm.default(respond)
    with ThreadPoolExecutor(max_workers=len(questions)) as pool:
        results = list(pool.map(lambda question: post_chat(server, thread_id, question), questions))
    return results, holders


@pytest.fixture(scope="module")
def shared_llm() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory, shared_llm: ScriptedLLM) -> Iterator[LiveServer]:
    """run.py with `server.workers: 2`, returned once both worker processes have served a turn."""
    tmp_path = tmp_path_factory.mktemp("two_workers")
    server = start_server(
        tmp_path,
        shared_llm.url,
        env={"DEEPSEEK_API_KEY": API_KEY, "AU_API_TOKENS": TOKEN},
        overrides={"server": {"workers": 2}, "llm": {"timeout_s": 30}},
    )
    try:
        # /health answers as soon as one worker is up; the other may still be building its agent.
        seen: set[int] = set()
        for _ in range(30):
            _, holders = chat_batch(server, shared_llm, "warm-up", [f"warm-up {n}" for n in range(4)])
            seen = seen.union(*holders)
            if len(seen) == 2:
                break
        assert len(seen) == 2, f"the second worker never served a request:\n{server.log()}"
        shared_llm.requests.clear()
        yield server
    finally:
        server.stop()


def test_same_thread_is_serialised_across_worker_processes(two_workers: LiveServer, shared_llm: ScriptedLLM) -> None:
    shared_llm.requests.clear()
    questions: list[str] = []
    workers: set[int] = set()
    # Which worker accepts a connection is up to the kernel; repeat until both took turns on the thread.
    for batch in range(5):
        batch_questions = [f"batch {batch} turn {n}" for n in range(10)]
        results, holders = chat_batch(two_workers, shared_llm, "multi", batch_questions)
        questions += batch_questions

        for question, (status, body) in zip(batch_questions, results, strict=True):
            assert status == 200, body
            assert body["reply"] == "echo: " + question
        # Every model call of the thread ran while exactly one process held the thread's lock.
        assert all(len(pids) == 1 for pids in holders), holders
        workers = workers.union(*holders)
        if len(workers) == 2:
            break

    assert len(workers) == 2, "only one worker process served the thread"
    stored = json.loads((two_workers.log_path.parent / "data" / "multi.json").read_text(encoding="utf-8"))
    assert_turns_stored_in_order(stored["messages"], questions)
    assert_history_grew_by_one_turn_per_call(shared_llm.chat_requests(), stored["messages"])


def test_different_threads_run_at_the_same_time_with_two_worker_processes(
    two_workers: LiveServer, shared_llm: ScriptedLLM
) -> None:
    shared_llm.default(barrier_reply())

    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = pool.map(lambda thread_id: post_chat(two_workers, thread_id, f"hi from {thread_id}"), ("x", "y"))
        results = dict(zip(("x", "y"), answers, strict=True))

    for thread_id, (status, body) in results.items():
        assert status == 200, body
        assert body["reply"] == f"together: hi from {thread_id}"

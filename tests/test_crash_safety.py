"""Crash safety of thread files: kills mid-write, stale temporaries, corrupt files that are never overwritten."""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.history import ThreadStore
from tests.conftest import REPO, Api
from tests.llm_server import ScriptedLLM

# Helper processes import app.history without app/__init__.py, which pulls in the whole agent stack
# and would make every start take seconds.
PRELUDE = """
import sys, types
package = types.ModuleType("app")
package.__path__ = ["app"]
sys.modules["app"] = package
"""

# Appends big turns to thread t1 for as long as it lives; the file is reset now and then to bound its size.
WRITER = """
import itertools, sys
from pathlib import Path
from app.history import ThreadStore, utc_now

store = ThreadStore(Path(sys.argv[1]))
question, answer = "q" * 300_000, "a" * 300_000
for n in itertools.count():
    with store.lock("t1"):
        if n % 6 == 0:
            store.create("t1")
        store.append_turn("t1", f"{n} {question}", f"{n} {answer}", user_ts=utc_now())
    if n == 0:
        print("ready", flush=True)
"""

# Appends big turns to t1 under its lock for a while, starting the thread afresh every 5 turns to bound
# its size; prints how many turns it wrote, or fails (exit 1) on the first write that fails.
BUSY_WORKER = """
import sys, time
from pathlib import Path
from app.history import ThreadStore, utc_now

store = ThreadStore(Path(sys.argv[1]))
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[2])
turns = 0
while time.monotonic() < deadline:
    with store.lock("t1"):
        if turns % 5 == 0:
            store.create("t1")
        store.append_turn("t1", f"q{turns} " + "q" * 200_000, f"a{turns}", user_ts=utc_now())
    turns += 1
print(turns, flush=True)
"""


def start(script: str, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", PRELUDE + script, *args]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        errors = process.stderr.read() if process.stderr else ""
        raise AssertionError(f"helper process did not start: {line!r}\n{errors}")


def assert_design_shape(data: Any, thread_id: str) -> None:
    """The thread file shape of design.md: thread id, then alternating user/assistant messages."""
    assert isinstance(data, dict)
    assert data["thread_id"] == thread_id
    messages = data["messages"]
    assert isinstance(messages, list)
    assert len(messages) % 2 == 0
    for position, message in enumerate(messages):
        assert set(message) == {"role", "content", "ts"}
        assert message["role"] == ("user", "assistant")[position % 2]
        assert isinstance(message["content"], str) and isinstance(message["ts"], str)


def temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """The data folder make_settings points the app at (history.data_dir: data, next to config.yaml)."""
    folder = tmp_path / "data"
    folder.mkdir()
    return folder


# --- a process killed mid-write ---------------------------------------------------------------------


def test_a_process_killed_mid_write_never_leaves_a_partial_thread_file(data_dir: Path) -> None:
    seed = random.randrange(1 << 30)
    moments = random.Random(seed)
    path = data_dir / "t1.json"
    for kill in range(6):
        writer = start(WRITER, str(data_dir))
        try:
            # "ready" comes after the first turn is on disk, so the file exists from here on.
            wait_ready(writer)
            time.sleep(moments.uniform(0.0, 0.3))
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.communicate(timeout=10)
        assert writer.returncode == -signal.SIGKILL, (seed, kill, writer.returncode)

        assert_design_shape(json.loads(path.read_text(encoding="utf-8")), "t1")
    left = temporaries(data_dir)

    removed = ThreadStore(data_dir).clean_stale_temporaries()

    assert sorted(removed) == left
    assert temporaries(data_dir) == []
    assert_design_shape(json.loads(path.read_text(encoding="utf-8")), "t1")


def test_start_up_removes_a_stale_temporary_and_logs_it(
    make_api: Callable[..., Api], data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = data_dir / "t1.json"
    good.write_text(json.dumps({"thread_id": "t1", "messages": []}), encoding="utf-8")
    stale = data_dir / ".t1.abc123.tmp"
    stale.write_text('{"thread_id": "t1", "messa', encoding="utf-8")

    with caplog.at_level(logging.WARNING):
        api = make_api()

    assert not stale.exists()
    assert good.exists() and api.store.load("t1")["messages"] == []
    assert any(str(stale) in record.getMessage() for record in caplog.records)


def test_start_up_spares_the_temporary_of_a_turn_another_worker_is_writing(
    make_api: Callable[..., Api], data_dir: Path
) -> None:
    # gunicorn starts (and restarts) workers while the others serve: a new worker's clean-up must
    # not pull the temporary file from under a write that is still in progress.
    worker = start(BUSY_WORKER, str(data_dir), "2.5")
    try:
        wait_ready(worker)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            ThreadStore(data_dir).clean_stale_temporaries()
        make_api()
        output, errors = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()

    assert worker.returncode == 0, errors
    turns = int(output.split()[-1])
    data = json.loads((data_dir / "t1.json").read_text(encoding="utf-8"))
    assert_design_shape(data, "t1")
    assert len(data["messages"]) == 2 * ((turns - 1) % 5 + 1)
    assert data["messages"][-2]["content"].startswith(f"q{turns - 1} ")
    assert temporaries(data_dir) == []


# --- a corrupt thread file ---------------------------------------------------------------------------

CORRUPT = {
    "truncated": b'{"thread_id": "bad", "messages": [{"role": "user", "cont',
    "wrong_shape": b'["not", "a", "thread"]',
    "not_utf8": b'{"thread_id": "bad", "messages": [], "x": "\xff\xfe"}',
}


@pytest.fixture(params=sorted(CORRUPT))
def corrupt_thread(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[tuple[Path, bytes]]:
    content = CORRUPT[request.param]
    path = data_dir / "bad.json"
    path.write_bytes(content)
    yield path, content


def error_code(response: Any) -> str:
    return response.get_json()["error"]["code"]


def test_chat_on_a_corrupt_thread_is_409_and_the_file_is_never_touched(
    make_api: Callable[..., Api], llm: ScriptedLLM, corrupt_thread: tuple[Path, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    path, content = corrupt_thread
    api = make_api()

    with caplog.at_level(logging.ERROR):
        response = api.chat("bad", "hello?")

    assert response.status_code == 409
    assert error_code(response) == "thread_corrupt"
    assert path.read_bytes() == content
    assert llm.chat_requests() == []
    assert any(str(path) in record.getMessage() for record in caplog.records)
    assert temporaries(path.parent) == []


def test_a_corrupt_thread_cannot_be_read_but_other_threads_keep_working(
    make_api: Callable[..., Api], llm: ScriptedLLM, corrupt_thread: tuple[Path, bytes]
) -> None:
    path, content = corrupt_thread
    api = make_api()
    llm.reply("first answer")
    llm.reply("second answer")

    got = api.get("/threads/bad")
    first = api.chat("good", "hello")
    second = api.chat("other", "hi")
    listed = api.get("/threads")

    assert got.status_code == 409 and error_code(got) == "thread_corrupt"
    assert first.status_code == 200 and first.get_json()["reply"] == "first answer"
    assert second.status_code == 200 and second.get_json()["reply"] == "second answer"
    assert listed.status_code == 200
    assert {thread["thread_id"] for thread in listed.get_json()["threads"]} == {"good", "other"}
    assert api.get("/threads/good").status_code == 200
    assert path.read_bytes() == content


def test_streamed_chat_on_a_corrupt_thread_ends_with_an_error_event(
    make_api: Callable[..., Api], llm: ScriptedLLM, corrupt_thread: tuple[Path, bytes]
) -> None:
    path, content = corrupt_thread
    api = make_api()

    response = api.post("/threads/bad/chat", json={"message": "hello?", "stream": True})
    body = response.get_data(as_text=True)

    assert "event: error" in body and "thread_corrupt" in body
    assert "event: done" not in body
    assert path.read_bytes() == content
    assert llm.chat_requests() == []


def test_deleting_a_corrupt_thread_is_the_way_to_start_over(
    make_api: Callable[..., Api], llm: ScriptedLLM, corrupt_thread: tuple[Path, bytes]
) -> None:
    path, _ = corrupt_thread
    api = make_api()
    llm.reply("fresh start")

    deleted = api.delete("/threads/bad")
    again = api.chat("bad", "hello again")

    assert deleted.status_code == 204
    assert again.status_code == 200
    stored = json.loads(path.read_text(encoding="utf-8"))["messages"]
    assert [m["content"] for m in stored] == ["hello again", "fresh start"]

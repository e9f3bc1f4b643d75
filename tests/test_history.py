"""Tests for app/history.py: ThreadStore (design.md, thread file format, atomic writes, locking)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import app.history as history
from app.errors import InvalidThreadId, NotFound, ThreadCorrupt
from app.history import ThreadStore, utc_now

REPO = Path(__file__).resolve().parent.parent
TS = "2026-08-11T01:30:00+00:00"


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    return ThreadStore(tmp_path / "data")


def tree(root: Path) -> set[str]:
    """Every file and folder under root, relative to it."""
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def temporaries(folder: Path) -> list[Path]:
    return sorted(path for path in folder.iterdir() if path.name.endswith(".tmp"))


# --- loading and appending --------------------------------------------------------------------------


def test_loading_an_unknown_thread_gives_an_empty_thread_and_creates_no_file(store: ThreadStore) -> None:
    before = tree(store.data_dir)

    data = store.load("t1")

    assert data == {"thread_id": "t1", "messages": []}
    assert not store.exists("t1")
    assert tree(store.data_dir) == before


def test_append_turn_writes_the_design_file_shape(store: ThreadStore) -> None:
    store.append_turn("t1", "What time is it? ✓", "Noon, héllo.", user_ts=TS)

    on_disk = json.loads(store.path("t1").read_text(encoding="utf-8"))
    assert store.path("t1") == store.data_dir / "t1.json"
    assert set(on_disk) == {"thread_id", "messages"}
    assert on_disk["thread_id"] == "t1"
    user, assistant = on_disk["messages"]
    assert set(user) == set(assistant) == {"role", "content", "ts"}
    assert user == {"role": "user", "content": "What time is it? ✓", "ts": TS}
    assert (assistant["role"], assistant["content"]) == ("assistant", "Noon, héllo.")
    assert store.load("t1") == on_disk


def test_append_turn_stamps_the_assistant_message_with_iso_utc_now(store: ThreadStore) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    data = store.append_turn("t1", "hi", "hello", user_ts=utc_now())
    after = datetime.now(UTC)

    for message in data["messages"]:
        stamp = datetime.fromisoformat(message["ts"])
        assert stamp.utcoffset() == timedelta(0)
        assert before <= stamp <= after


def test_utc_now_is_iso_8601_with_utc_offset() -> None:
    stamp = utc_now()
    parsed = datetime.fromisoformat(stamp)
    assert parsed.utcoffset() == timedelta(0)
    assert stamp.endswith("+00:00")


def test_two_appends_keep_their_order(store: ThreadStore) -> None:
    store.append_turn("t1", "first question", "first answer", user_ts=TS)
    store.append_turn("t1", "second question", "second answer", user_ts=TS)

    messages = store.load("t1")["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "first question"),
        ("assistant", "first answer"),
        ("user", "second question"),
        ("assistant", "second answer"),
    ]


def test_threads_are_stored_in_separate_files(store: ThreadStore) -> None:
    store.append_turn("t1", "one", "uno", user_ts=TS)
    store.append_turn("t2", "two", "dos", user_ts=TS)

    assert [m["content"] for m in store.load("t1")["messages"]] == ["one", "uno"]
    assert [m["content"] for m in store.load("t2")["messages"]] == ["two", "dos"]


def test_get_returns_an_existing_thread(store: ThreadStore) -> None:
    store.append_turn("t1", "hi", "hello", user_ts=TS)
    assert store.get("t1")["messages"][0]["content"] == "hi"


def test_get_of_an_unknown_thread_raises_not_found(store: ThreadStore) -> None:
    with pytest.raises(NotFound):
        store.get("nobody")
    assert not store.exists("nobody")


# --- thread ids -------------------------------------------------------------------------------------

BAD_IDS = ["", "a/b", "..", "../x", "a.b", "x" * 129, "ü", "%2e%2e", "a b", "a\x00b", "abc\n", "/etc/passwd", "a\\b"]

OPERATIONS: dict[str, Callable[[ThreadStore, str], Any]] = {
    "path": lambda s, t: s.path(t),
    "exists": lambda s, t: s.exists(t),
    "load": lambda s, t: s.load(t),
    "get": lambda s, t: s.get(t),
    "append_turn": lambda s, t: s.append_turn(t, "hi", "hello", user_ts=TS),
    "create": lambda s, t: s.create(t),
    "delete": lambda s, t: s.delete(t),
    "offload_dir": lambda s, t: s.offload_dir(t),
    "lock": lambda s, t: s.lock(t).__enter__(),
}


@pytest.mark.parametrize("thread_id", BAD_IDS, ids=repr)
def test_invalid_thread_id_is_rejected_by_every_operation_without_touching_disk(
    tmp_path: Path, store: ThreadStore, thread_id: str
) -> None:
    before = tree(tmp_path)
    for name, operation in OPERATIONS.items():
        with pytest.raises(InvalidThreadId):
            operation(store, thread_id)
        assert tree(tmp_path) == before, f"{name} touched the disk"


def test_thread_id_of_128_characters_is_accepted(store: ThreadStore) -> None:
    thread_id = "A-z_0" + "x" * 123
    assert len(thread_id) == 128

    store.append_turn(thread_id, "hi", "hello", user_ts=TS)

    assert (store.data_dir / f"{thread_id}.json").is_file()
    assert len(store.load(thread_id)["messages"]) == 2


# --- atomic writes ----------------------------------------------------------------------------------


def test_thread_file_is_valid_json_at_every_instant_while_appending(store: ThreadStore) -> None:
    store.append_turn("t1", "turn 0", "answer 0", user_ts=TS)
    path = store.path("t1")
    stop = threading.Event()
    problems: list[str] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                text = path.read_bytes().decode("utf-8")
                data = json.loads(text)
                assert isinstance(data["messages"], list)
            except Exception as exc:  # noqa: BLE001 - any failure is a finding
                problems.append(f"{type(exc).__name__}: {exc}")
            reads += 1

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for turn in range(1, 200):
            store.append_turn("t1", f"turn {turn}", f"answer {turn}", user_ts=TS)
    finally:
        stop.set()
        thread.join(10)

    assert problems == []
    assert reads > 0
    assert len(store.load("t1")["messages"]) == 400
    assert temporaries(store.data_dir) == []


class DiskFull(OSError):
    pass


@pytest.mark.parametrize("error", [DiskFull, KeyboardInterrupt])
def test_write_failing_midway_leaves_the_old_file_unchanged_and_removes_the_temporary(
    store: ThreadStore, monkeypatch: pytest.MonkeyPatch, error: type[BaseException]
) -> None:
    store.append_turn("t1", "kept question", "kept answer", user_ts=TS)
    path = store.path("t1")
    original = path.read_bytes()
    seen_temporaries: list[Path] = []

    def dump_half_then_fail(obj: Any, fp: Any, **kwargs: Any) -> None:
        fp.write('{"thread_id": "t1", "messages": [{"role": "us')
        fp.flush()
        seen_temporaries.extend(temporaries(store.data_dir))
        raise error("simulated failure mid-write")

    monkeypatch.setattr(history.json, "dump", dump_half_then_fail)

    with pytest.raises(error):
        store.append_turn("t1", "lost question", "lost answer", user_ts=TS)

    assert len(seen_temporaries) == 1, "the write must go through a temporary file in the data folder"
    assert path.read_bytes() == original
    assert temporaries(store.data_dir) == []
    assert not seen_temporaries[0].exists()


def test_failed_rename_leaves_the_old_file_unchanged_and_removes_the_temporary(
    store: ThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.append_turn("t1", "kept question", "kept answer", user_ts=TS)
    original = store.path("t1").read_bytes()

    def failing_replace(src: Any, dst: Any) -> None:
        raise OSError("simulated rename failure")

    monkeypatch.setattr(history.os, "replace", failing_replace)

    with pytest.raises(OSError, match="simulated rename failure"):
        store.append_turn("t1", "lost", "lost", user_ts=TS)

    assert store.path("t1").read_bytes() == original
    assert temporaries(store.data_dir) == []


def test_failed_first_write_creates_no_thread_file(store: ThreadStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_dump(obj: Any, fp: Any, **kwargs: Any) -> None:
        fp.write("{")
        raise OSError("simulated failure")

    monkeypatch.setattr(history.json, "dump", failing_dump)

    with pytest.raises(OSError):
        store.append_turn("new", "q", "a", user_ts=TS)

    assert not store.exists("new")
    assert temporaries(store.data_dir) == []


def test_clean_stale_temporaries_removes_only_thread_temporaries(store: ThreadStore) -> None:
    store.append_turn("t1", "hi", "hello", user_ts=TS)
    (store.data_dir / "t1.lock").touch()
    store.offload_dir("t1").mkdir(parents=True)
    evicted = store.offload_dir("t1") / ".t1.keepme.tmp"
    evicted.write_text("evicted history", encoding="utf-8")
    stale = [store.data_dir / ".t1.abc123.tmp", store.data_dir / ".other_thread-2.x9y8.tmp"]
    for path in stale:
        path.write_text('{"partial', encoding="utf-8")
    keep = [
        store.path("t1"),
        store.data_dir / "t1.lock",
        store.data_dir / "notes.tmp",
        store.data_dir / ".t1.json.bak",
        evicted,
    ]
    (store.data_dir / "notes.tmp").write_text("not ours", encoding="utf-8")
    (store.data_dir / ".t1.json.bak").write_text("not ours", encoding="utf-8")

    removed = store.clean_stale_temporaries()

    assert sorted(removed) == sorted(stale)
    assert not any(path.exists() for path in stale)
    assert all(path.exists() for path in keep)
    assert store.load("t1")["messages"][0]["content"] == "hi"
    assert store.clean_stale_temporaries() == []


# --- corrupt files ----------------------------------------------------------------------------------

CORRUPT_CONTENTS = [
    pytest.param(b"{not json", id="not-json"),
    pytest.param(b"", id="empty"),
    pytest.param(b'{"thread_id": "bad", "messages": [{"role": "us', id="truncated"),
    pytest.param(b'{"thread_id": "bad"}', id="no-messages"),
    pytest.param(b'{"thread_id": "bad", "messages": "hello"}', id="messages-not-a-list"),
    pytest.param(b"[]", id="top-level-list"),
    pytest.param(b'"just a string"', id="top-level-string"),
    pytest.param(b"\xff\xfe\x00g\x00a\x00r\x00b\x00a\x00g\x00e", id="not-utf8"),
    pytest.param(b'{"thread_id": "bad", "messages": [1, "two"]}', id="message-not-an-object"),
    pytest.param(b'{"messages": [{"content": "no role"}]}', id="message-without-role"),
    pytest.param(b'{"messages": [{"role": "user", "content": "x", "ts": 5}]}', id="ts-not-a-string"),
    pytest.param(b'{"messages": [], "summary": "x"}', id="summary-not-an-object"),
    pytest.param(b'{"messages": [], "summary": {"text": "x", "covers": "2"}}', id="summary-covers-not-an-int"),
]


@pytest.mark.parametrize("content", CORRUPT_CONTENTS)
def test_corrupt_thread_file_raises_thread_corrupt_for_that_thread_only(store: ThreadStore, content: bytes) -> None:
    store.append_turn("good", "still here", "yes", user_ts=TS)
    bad = store.data_dir / "bad.json"
    bad.write_bytes(content)

    with pytest.raises(ThreadCorrupt):
        store.load("bad")
    with pytest.raises(ThreadCorrupt):
        store.get("bad")
    with pytest.raises(ThreadCorrupt):
        store.append_turn("bad", "q", "a", user_ts=TS)

    assert bad.read_bytes() == content
    assert temporaries(store.data_dir) == []
    store.append_turn("good", "again", "sure", user_ts=TS)
    assert len(store.load("good")["messages"]) == 4
    assert [t["thread_id"] for t in store.list()] == ["good"]


def test_thread_file_with_non_object_messages_does_not_break_listing_other_threads(store: ThreadStore) -> None:
    store.append_turn("good", "still here", "yes", user_ts=TS)
    (store.data_dir / "odd.json").write_text('{"thread_id": "odd", "messages": [1, "two"]}', encoding="utf-8")

    listed = [t["thread_id"] for t in store.list()]

    assert "good" in listed


# --- locking ----------------------------------------------------------------------------------------


def test_two_threads_appending_under_the_lock_lose_no_turns(store: ThreadStore) -> None:
    workers, turns = 2, 50
    start = threading.Barrier(workers)
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            start.wait(5)
            for turn in range(turns):
                with store.lock("shared"):
                    store.append_turn("shared", f"u-{worker}-{turn}", f"a-{worker}-{turn}", user_ts=utc_now())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert errors == []
    messages = store.load("shared")["messages"]
    assert len(messages) == workers * turns * 2
    for user, assistant in zip(messages[::2], messages[1::2], strict=True):
        assert user["role"] == "user"
        assert assistant["role"] == "assistant"
        assert assistant["content"] == "a" + user["content"][1:]
    for worker in range(workers):
        mine = [m["content"] for m in messages[::2] if m["content"].startswith(f"u-{worker}-")]
        assert mine == [f"u-{worker}-{turn}" for turn in range(turns)]


def test_lock_blocks_another_thread_on_the_same_thread_id(store: ThreadStore) -> None:
    acquired = threading.Event()

    def take() -> None:
        with store.lock("a"):
            acquired.set()

    with store.lock("a"):
        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        assert not acquired.wait(0.2)
    assert acquired.wait(5)
    thread.join(5)


def test_locks_of_different_threads_do_not_block_each_other(store: ThreadStore) -> None:
    acquired = threading.Event()

    def take() -> None:
        with store.lock("b"):
            acquired.set()

    with store.lock("a"):
        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        assert acquired.wait(1)
    thread.join(5)


def test_lock_is_released_when_the_body_raises(store: ThreadStore) -> None:
    with pytest.raises(RuntimeError), store.lock("a"):
        raise RuntimeError("boom")

    acquired = threading.Event()

    def take() -> None:
        with store.lock("a"):
            acquired.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    assert acquired.wait(1)
    thread.join(5)


def test_two_stores_on_one_folder_share_the_file_lock(tmp_path: Path) -> None:
    first, second = ThreadStore(tmp_path / "data"), ThreadStore(tmp_path / "data")
    acquired = threading.Event()

    def take() -> None:
        with second.lock("t"):
            acquired.set()

    with first.lock("t"):
        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        assert not acquired.wait(0.2)
    assert acquired.wait(5)
    thread.join(5)


# The child imports app.history without app/__init__.py (which builds the whole agent stack: ~2 s).
CHILD = """
import sys, time, types
from pathlib import Path
repo, data, markers = sys.argv[1:4]
package = types.ModuleType("app")
package.__path__ = [repo + "/app"]
sys.modules["app"] = package
from app.history import ThreadStore
store = ThreadStore(Path(data))
markers = Path(markers)
with store.lock("t"):
    (markers / "held").touch()
    deadline = time.monotonic() + 30
    while not (markers / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    (markers / "child-releasing").touch()
"""


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "child died"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def test_lock_held_by_another_process_blocks_until_it_releases(tmp_path: Path, store: ThreadStore) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(REPO), str(store.data_dir), str(markers)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    acquired = threading.Event()
    child_had_released: list[bool] = []

    def take() -> None:
        with store.lock("t"):
            child_had_released.append((markers / "child-releasing").exists())
            acquired.set()

    try:
        wait_for(markers / "held", proc)
        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        assert not acquired.wait(0.3), "got the lock while another process held it"
        (markers / "go").touch()
        assert acquired.wait(30)
        thread.join(5)
        assert proc.wait(30) == 0
    finally:
        (markers / "go").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert child_had_released == [True]


# --- list, delete -----------------------------------------------------------------------------------


def append_at(store: ThreadStore, monkeypatch: pytest.MonkeyPatch, thread_id: str, user: str, when: str) -> None:
    """append_turn with the assistant's timestamp (the thread's updated_at) fixed to `when`."""
    monkeypatch.setattr(history, "utc_now", lambda: when)
    store.append_turn(thread_id, user, "ok", user_ts=when)


def test_list_returns_summaries_newest_first(store: ThreadStore, monkeypatch: pytest.MonkeyPatch) -> None:
    append_at(store, monkeypatch, "old", "oldest question", "2026-01-01T00:00:00+00:00")
    append_at(store, monkeypatch, "new", "newest question", "2026-03-01T00:00:00+00:00")
    append_at(store, monkeypatch, "mid", "middle question", "2026-02-01T00:00:00+00:00")
    append_at(store, monkeypatch, "old", "second turn", "2026-01-02T00:00:00+00:00")

    threads = store.list()

    assert [t["thread_id"] for t in threads] == ["new", "mid", "old"]
    old = threads[2]
    assert old["title"] == "oldest question"
    assert old["message_count"] == 4
    assert old["updated_at"] == "2026-01-02T00:00:00+00:00"
    assert threads[0]["message_count"] == 2


def test_list_title_comes_from_the_first_user_message_shortened(store: ThreadStore) -> None:
    store.append_turn("short", "  Hello\n\n   world  ", "hi", user_ts=TS)
    long_message = "word " * 100
    store.append_turn("long", long_message, "hi", user_ts=TS)
    store.append_turn("long", "a later question", "hi", user_ts=TS)

    titles = {t["thread_id"]: t["title"] for t in store.list()}

    assert titles["short"] == "Hello world"
    assert 10 < len(titles["long"]) <= 80
    assert len(titles["long"]) < len(long_message.strip())
    assert titles["long"].startswith("word word word")
    assert "later" not in titles["long"]


def test_list_ignores_locks_temporaries_and_offloaded_history(store: ThreadStore) -> None:
    store.append_turn("t1", "hi", "hello", user_ts=TS)
    with store.lock("t2"):
        pass
    store.offload_dir("t1").mkdir(parents=True)
    (store.offload_dir("t1") / "evicted.json").write_text("{}", encoding="utf-8")
    (store.data_dir / ".t1.abc.tmp").write_text("{", encoding="utf-8")

    assert [t["thread_id"] for t in store.list()] == ["t1"]


def test_list_of_an_empty_store_is_empty(store: ThreadStore) -> None:
    assert store.list() == []


def test_delete_removes_the_file_and_the_offloaded_history(store: ThreadStore) -> None:
    store.append_turn("t1", "hi", "hello", user_ts=TS)
    store.append_turn("t2", "other", "thread", user_ts=TS)
    offload = store.offload_dir("t1")
    offload.mkdir(parents=True)
    (offload / "evicted.md").write_text("old turns", encoding="utf-8")
    other_offload = store.offload_dir("t2")
    other_offload.mkdir(parents=True)
    (other_offload / "evicted.md").write_text("keep me", encoding="utf-8")

    store.delete("t1")

    assert not store.path("t1").exists()
    assert not offload.exists()
    assert store.load("t1") == {"thread_id": "t1", "messages": []}
    with pytest.raises(NotFound):
        store.get("t1")
    assert [t["thread_id"] for t in store.list()] == ["t2"]
    assert (other_offload / "evicted.md").read_text(encoding="utf-8") == "keep me"
    assert len(store.load("t2")["messages"]) == 2


def test_deleting_an_unknown_thread_raises_not_found(store: ThreadStore) -> None:
    store.append_turn("t1", "hi", "hello", user_ts=TS)

    with pytest.raises(NotFound):
        store.delete("nobody")

    assert store.exists("t1")


def test_deleting_twice_raises_not_found_the_second_time(store: ThreadStore) -> None:
    store.append_turn("t1", "hi", "hello", user_ts=TS)
    store.delete("t1")
    with pytest.raises(NotFound):
        store.delete("t1")

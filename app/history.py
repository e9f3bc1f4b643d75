"""ThreadStore: the only code that opens the data folder."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.errors import InvalidThreadId, NotFound, ThreadCorrupt

log = logging.getLogger(__name__)

THREAD_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_TMP_SUFFIX = ".tmp"
_OFFLOAD_DIR = "conversation_history"


def utc_now() -> str:
    """An ISO-8601 UTC timestamp, as stored with every message."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def validate_thread_id(thread_id: str) -> str:
    """Return the id if it is safe as a file name; raise InvalidThreadId otherwise."""
    if not THREAD_ID.fullmatch(thread_id):
        msg = "Thread ids are 1-128 characters of A-Z, a-z, 0-9, '_' and '-'."
        raise InvalidThreadId(msg)
    return thread_id


class ThreadStore:
    """Owns `<data_dir>/<thread_id>.json`: one JSON file per thread.

    A file holds `{"thread_id", "messages": [{"role": "user"|"assistant", "content", "ts"}]}`, and once
    the thread is long, `"summary": {"text", "covers", "updated_at"}` (the first `covers` messages,
    summarised); only finished user/assistant turns are stored, never tool messages. Every write goes to a temporary
    file in the same folder, is fsynced and then renamed over the old one, so the file is valid JSON
    at every instant. `lock(thread_id)` serialises a thread's turns: a thread lock inside the process
    and an OS file lock (`<thread_id>.lock`) across worker processes; different threads never share a
    lock. `<data_dir>/conversation_history/<thread_id>/` holds what the agent's summarisation evicted.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def clean_stale_temporaries(self) -> list[Path]:
        """Remove temporary files left by a process killed mid-write; return what was removed.

        gunicorn starts and restarts workers while the others serve, so a temporary file may belong
        to a turn being written right now: one whose thread lock is held elsewhere is left alone.
        """
        removed = []
        for path in self.data_dir.glob(f".*{_TMP_SUFFIX}"):
            # _write names temporaries `.<thread_id>.<random>.tmp`; anything else is not ours to remove.
            thread_id = path.name[1:].split(".", 1)[0]
            if not THREAD_ID.fullmatch(thread_id):
                continue
            with self._lock_if_free(thread_id) as free:
                if not free:
                    continue
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue
                removed.append(path)
        return removed

    def path(self, thread_id: str) -> Path:
        """Where a thread's file lives."""
        return self.data_dir / f"{validate_thread_id(thread_id)}.json"

    def offload_dir(self, thread_id: str) -> Path:
        """The per-thread folder for what the agent offloads (evicted history, large tool results).

        It lies outside the shell workspace, so other conversations' commands do not stumble on it;
        it is created by the first write into it.
        """
        return self.data_dir / _OFFLOAD_DIR / validate_thread_id(thread_id)

    def exists(self, thread_id: str) -> bool:
        """Whether the thread has a file."""
        return self.path(thread_id).is_file()

    def load(self, thread_id: str) -> dict[str, Any]:
        """The thread's content; an empty thread when it has no file yet."""
        path = self.path(thread_id)
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
            _check_shape(data)
        except FileNotFoundError:
            return {"thread_id": thread_id, "messages": []}
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors too
            log.error("thread file %s is corrupt (%s); it is left untouched", path, exc)
            msg = f"Thread '{thread_id}' has a corrupt file on the server; it is kept untouched for repair."
            raise ThreadCorrupt(msg) from None
        return data

    def get(self, thread_id: str) -> dict[str, Any]:
        """The thread's content; NotFound when it does not exist."""
        if not self.exists(thread_id):
            raise NotFound(f"No thread '{thread_id}'.")
        return self.load(thread_id)

    def append_turn(
        self, thread_id: str, user: str, assistant: str, *, user_ts: str, summary: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Append a finished user/assistant turn (and a refreshed summary) in one atomic write; call it under `lock`."""
        data = self.load(thread_id)
        if summary is not None:
            data["summary"] = summary
        data["messages"] += [
            {"role": "user", "content": user, "ts": user_ts},
            {"role": "assistant", "content": assistant, "ts": utc_now()},
        ]
        self._write(thread_id, data)
        return data

    def create(self, thread_id: str) -> dict[str, Any]:
        """Write an empty thread file for a new id (POST /threads makes a fresh uuid); call it under `lock`."""
        data = {"thread_id": thread_id, "messages": []}
        self._write(thread_id, data)
        return data

    def delete(self, thread_id: str) -> None:
        """Remove a thread's file and what summarisation evicted from it; NotFound if absent."""
        with self.lock(thread_id):
            path = self.path(thread_id)
            if not path.is_file():
                raise NotFound(f"No thread '{thread_id}'.")
            path.unlink()
            shutil.rmtree(self.data_dir / _OFFLOAD_DIR / thread_id, ignore_errors=True)

    def list(self) -> list[dict[str, Any]]:
        """Every thread's summary (id, title, updated_at, message_count), newest first."""
        threads = []
        for path in self.data_dir.glob("*.json"):
            thread_id = path.stem
            if not THREAD_ID.fullmatch(thread_id):
                continue
            try:
                messages = self.load(thread_id)["messages"]
                threads.append(_summary(thread_id, messages, path))
            except (ThreadCorrupt, FileNotFoundError):  # corrupt, or deleted while we looked
                continue
        return sorted(threads, key=lambda t: t["updated_at"], reverse=True)

    @contextlib.contextmanager
    def lock(self, thread_id: str) -> Iterator[None]:
        """Hold the thread's lock, in this process and across processes."""
        with self._thread_lock(thread_id):
            lock_path = self.data_dir / f"{validate_thread_id(thread_id)}.lock"
            with open(lock_path, "a+b") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _lock_if_free(self, thread_id: str) -> Iterator[bool]:
        """Hold the thread's OS file lock if nobody holds it; yield whether it is held here."""
        lock_path = self.data_dir / f"{thread_id}.lock"
        with open(lock_path, "a+b") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                free = False
            else:
                free = True
            try:
                yield free
            finally:
                if free:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    def _thread_lock(self, thread_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(thread_id, threading.Lock())

    def _write(self, thread_id: str, data: dict[str, Any]) -> None:
        target = self.path(thread_id)
        fd, tmp_name = tempfile.mkstemp(dir=self.data_dir, prefix=f".{thread_id}.", suffix=_TMP_SUFFIX)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, ensure_ascii=False, indent=1)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        _fsync_dir(self.data_dir)


def _check_shape(data: Any) -> None:
    """Raise ValueError unless `data` has the shape this store writes (a hand-edited file may not)."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ValueError("no 'messages' list")
    for message in data["messages"]:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise ValueError("a message is not an object with role 'user' or 'assistant'")
        if not isinstance(message.get("content"), str) or not isinstance(message.get("ts", ""), str):
            raise ValueError("a message's 'content' or 'ts' is not a string")
    summary = data.get("summary")
    if summary is not None and not (
        isinstance(summary, dict) and isinstance(summary.get("text"), str) and type(summary.get("covers")) is int
    ):
        raise ValueError("'summary' is not an object with a 'text' string and a 'covers' integer")


def _summary(thread_id: str, messages: list[dict[str, Any]], path: Path) -> dict[str, Any]:
    first_user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    title = " ".join(str(first_user).split())
    updated = messages[-1].get("ts") if messages else None
    if not updated:
        updated = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    return {
        "thread_id": thread_id,
        "title": title if len(title) <= 60 else title[:59] + "…",
        "updated_at": updated,
        "message_count": len(messages),
    }


def _fsync_dir(folder: Path) -> None:
    # The rename is durable only once the folder's entry is on disk too.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

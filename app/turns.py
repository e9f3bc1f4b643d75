"""One chat turn of a thread: lock it, rebuild it, run the agent, store the finished turn; plain or streamed."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

from app.agent import Assistant, EventSink, TurnResult, UsageCounter
from app.errors import AuError
from app.events import format_sse
from app.history import ThreadStore, utc_now
from app.memory import ConversationMemory

log = logging.getLogger(__name__)

# A comment line now and then keeps proxies from closing a quiet stream while a tool runs,
# and lets the server notice a client that has gone.
KEEPALIVE_S = 15.0


def turn_body(thread_id: str, result: TurnResult) -> dict[str, Any]:
    """What a finished turn answers: the plain response, and the `done` event of a stream."""
    return {"thread_id": thread_id, "reply": result.reply, "finish_reason": result.finish_reason, "usage": result.usage}


class Conversations:
    """Runs chat turns against the store; a turn is stored only once the agent has answered."""

    def __init__(self, store: ThreadStore, assistant: Assistant, memory: ConversationMemory) -> None:
        self.store = store
        self.assistant = assistant
        self.memory = memory

    def chat(self, thread_id: str, message: str, *, request_id: str, on_event: EventSink | None = None) -> TurnResult:
        """Run one turn under the thread's lock and append it to the thread file."""
        with self.store.lock(thread_id):
            # Taken under the lock, so a queued turn's question is never dated before the previous reply.
            user_ts = utc_now()
            counter = UsageCounter()
            context = self.memory.prepare(self.store.load(thread_id), message, callbacks=[counter])
            result = self.assistant.run_turn(
                thread_id,
                context.messages,
                request_id=request_id,
                on_event=on_event,
                counter=counter,
                notes=context.notes,
            )
            # A refreshed summary is stored with the turn, in the same atomic write, or not at all.
            self.store.append_turn(thread_id, message, result.reply, user_ts=user_ts, summary=context.summary)
        return result

    def chat_stream(self, thread_id: str, message: str, *, request_id: str) -> Iterator[str]:
        """Start the turn in its own thread and return its server-sent events.

        The turn does not depend on the client: if it disconnects, the generator is closed, and the
        turn still runs to the end and is stored.
        """
        events: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()

        def run() -> None:
            try:
                result = self.chat(thread_id, message, request_id=request_id, on_event=lambda n, d: events.put((n, d)))
                events.put(("done", turn_body(thread_id, result)))
            except AuError as error:
                events.put(("error", {"code": error.code, "message": error.message}))
            except Exception:
                log.exception("unexpected error in a streamed turn of thread %s", thread_id)
                events.put(("error", {"code": "internal_error", "message": "Unexpected server error; see the server log."}))
            finally:
                events.put(None)

        threading.Thread(target=run, name=f"turn-{thread_id}-{request_id}").start()
        return _drain(events)


def _drain(events: queue.Queue[tuple[str, dict[str, Any]] | None]) -> Iterator[str]:
    while True:
        try:
            item = events.get(timeout=KEEPALIVE_S)
        except queue.Empty:
            yield ": keep-alive\n\n"
            continue
        if item is None:
            return
        yield format_sse(*item)

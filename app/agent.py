"""Build the deep agent once, and run one turn of a thread with stream_mode="updates"."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepagents import create_deep_agent
from deepagents.middleware.filesystem import FilesystemPermission
from deepagents.middleware.summarization import SummarizationMiddleware
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.outputs import LLMResult
from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph

from app.config import Settings
from app.errors import AuError
from app.events import new_messages, token_events, update_events
from app.middleware import StepLimitMiddleware, StrictSkillsMiddleware, ToolErrorMiddleware, is_step_limit_reply
from app.workspace import HISTORY_ROUTE, SKILLS_ROUTE, build_backend
from trace_pretty import TracePrinter

EventSink = Callable[[str, dict[str, Any]], None]
FINISH_STOP = "stop"
FINISH_STEP_LIMIT = "step_limit"


@dataclass
class TurnResult:
    """What one finished turn produced."""

    reply: str
    finish_reason: str
    usage: dict[str, int]
    tool_calls: int = 0


def build_agent(
    settings: Settings,
    *,
    model: BaseChatModel,
    tools: Sequence[BaseTool] = (),
    history_folder: Callable[[str], Path],
    context_window: int,
) -> CompiledStateGraph:
    """Create the deep agent (~50 ms): built once at start-up, shared by every request."""
    backend = build_backend(settings.shell, skills_dir=settings.agent.skills_dir, history_folder=history_folder)
    summary = settings.summarization
    return create_deep_agent(
        model=model,
        tools=list(tools),
        system_prompt=settings.agent.system_prompt,
        backend=backend,
        skills=[SKILLS_ROUTE],
        # Skills and evicted history are the server's, not the model's to rewrite.
        permissions=[FilesystemPermission(operations=["write"], paths=[f"{SKILLS_ROUTE}**", f"{HISTORY_ROUTE}**"], mode="deny")],
        middleware=[
            SummarizationMiddleware(
                model,
                backend=backend,
                # Never later than 80% of the window: the provider would reject the call first.
                trigger=("tokens", min(summary.trigger_tokens, int(context_window * 0.8))),
                keep=("messages", summary.keep_messages),
                trim_tokens_to_summarize=summary.trim_tokens,
            ),
            StrictSkillsMiddleware(backend=backend, source=SKILLS_ROUTE, skills_dir=settings.agent.skills_dir),
            StepLimitMiddleware(settings.agent.max_steps),
            ToolErrorMiddleware(),
        ],
    )


class UsageCounter(BaseCallbackHandler):
    """Sums token usage over every model call of a turn, summarisation and subagents included."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "model_calls": 0}

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        with self._lock:
            self.usage["model_calls"] += 1
            for generations in response.generations:
                for generation in generations:
                    metadata = getattr(getattr(generation, "message", None), "usage_metadata", None) or {}
                    for key in ("input_tokens", "output_tokens", "total_tokens"):
                        self.usage[key] += int(metadata.get(key, 0) or 0)


@dataclass
class _TurnState:
    """What the updates of one turn told so far."""

    reply: str = ""
    finish_reason: str = FINISH_STOP
    tool_calls: int = 0

    def absorb(self, update: Mapping[str, Any] | None) -> None:
        for message in new_messages(update):
            if isinstance(message, AIMessage):
                self._absorb_ai(message)

    def _absorb_ai(self, message: AIMessage) -> None:
        if is_step_limit_reply(message):
            self.finish_reason = FINISH_STEP_LIMIT
        self.tool_calls += len(message.tool_calls)
        if not message.tool_calls:
            self.reply = message.text


class Assistant:
    """Runs turns of the agent; holds no conversation state between them."""

    def __init__(
        self,
        agent: CompiledStateGraph,
        *,
        translate_error: Callable[[BaseException], AuError | None],
        new_trace: Callable[[], TracePrinter],
    ) -> None:
        self.agent = agent
        self.translate_error = translate_error
        self.new_trace = new_trace

    def run_turn(
        self,
        thread_id: str,
        messages: list[AnyMessage],
        *,
        request_id: str,
        on_event: EventSink | None = None,
        counter: UsageCounter | None = None,
        notes: Iterable[str] = (),
    ) -> TurnResult:
        """Run one turn over the rebuilt conversation; a provider failure is raised as an AuError.

        With `on_event`, the model's tokens are streamed too and every client event is passed to it.
        `counter` may already hold the usage of calls made for this turn before it (a summary refresh).
        """
        started = time.monotonic()
        counter = counter or UsageCounter()
        state = _TurnState()
        trace = self.new_trace()
        trace.begin(thread_id, request_id)
        for note in notes:
            trace.note(note)
        config = {"configurable": {"thread_id": thread_id}, "callbacks": [counter]}
        modes = ["updates", "messages"] if on_event else ["updates"]
        try:
            for mode, payload in self.agent.stream({"messages": messages}, config, stream_mode=modes):
                if mode == "messages":
                    events = token_events(*payload)
                else:
                    trace.update(payload)
                    state.absorb(payload)
                    events = update_events(payload)
                for name, data in events if on_event else ():
                    on_event(name, data)
        except Exception as exc:
            # The one boundary where provider exceptions become au's typed errors.
            error = self.translate_error(exc)
            trace.error(error.code if error else "internal_error", error.message if error else repr(exc))
            if error is None:
                raise
            raise error from exc
        usage = dict(counter.usage)
        trace.finish(
            steps=usage["model_calls"],
            tool_calls=state.tool_calls,
            usage=usage,
            elapsed_s=time.monotonic() - started,
            finish_reason=state.finish_reason,
        )
        return TurnResult(reply=state.reply, finish_reason=state.finish_reason, usage=usage, tool_calls=state.tool_calls)

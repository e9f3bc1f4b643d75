"""au's own agent middleware: strict skills, a bound on model calls per turn, tool failures sent back to the model."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deepagents.backends.protocol import BackendProtocol
from deepagents.middleware.skills import SkillsMiddleware
from langchain.agents.middleware import AgentMiddleware, ModelCallLimitMiddleware
from langchain.agents.middleware.types import ToolCallRequest, hook_config
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime
from langgraph.types import Command

from app.skills import scan_skills

log = logging.getLogger(__name__)

STEP_LIMIT_MARK = "au_step_limit"


def is_step_limit_reply(message: Any) -> bool:
    """Whether a message is the plain reply StepLimitMiddleware ends a turn with."""
    return isinstance(message, AIMessage) and message.additional_kwargs.get(STEP_LIMIT_MARK) is True


class StrictSkillsMiddleware(SkillsMiddleware):
    """SkillsMiddleware that offers the model only the skills au's checks accept.

    deepagents still loads a skill whose name breaks the naming rules (and warns on every request);
    au skips it, and warns once per problem, naming the file.
    """

    def __init__(self, *, backend: BackendProtocol, source: str, skills_dir: Path) -> None:
        super().__init__(backend=backend, sources=[source])
        self.skills_dir = skills_dir
        self._warned: set[tuple[str, str]] = set()

    @property
    def name(self) -> str:
        # Same name as deepagents' default, so create_deep_agent puts this one in its place.
        return "SkillsMiddleware"

    def before_agent(self, state: Any, runtime: Runtime, config: RunnableConfig) -> dict[str, Any] | None:
        update = super().before_agent(state, runtime, config)
        if update:
            valid, errors = scan_skills(self.skills_dir)
            for error in errors:
                if (error.file, error.reason) not in self._warned:
                    self._warned.add((error.file, error.reason))
                    log.warning("skill skipped: %s: %s", error.file, error.reason)
            names = {skill.name for skill in valid}
            update["skills_metadata"] = [s for s in update["skills_metadata"] if s["name"] in names]
        return update

    async def abefore_agent(self, state: Any, runtime: Runtime, config: RunnableConfig) -> dict[str, Any] | None:
        return self.before_agent(state, runtime, config)


class StepLimitMiddleware(ModelCallLimitMiddleware):
    """Ends a turn with a plain reply once it has used `max_steps` model calls.

    deepagents' own bound is a recursion limit of 9,999 graph steps, far past what a chat turn
    should cost; the stock middleware's closing message is written for developers, not users.
    """

    def __init__(self, max_steps: int) -> None:
        super().__init__(run_limit=max_steps, exit_behavior="end")
        self.max_steps = max_steps

    @property
    def name(self) -> str:
        return "StepLimitMiddleware"

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        if state.get("run_model_call_count", 0) < self.max_steps:
            return None
        text = (
            f"I stopped after {self.max_steps} steps without finishing this request. "
            "Tell me to continue, or break the task into smaller parts."
        )
        return {"jump_to": "end", "messages": [AIMessage(content=text, additional_kwargs={STEP_LIMIT_MARK: True})]}

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self.before_model(state, runtime)


class ToolErrorMiddleware(AgentMiddleware):
    """Turns an exception raised by a tool into an error result the model can read and act on."""

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        try:
            return handler(request)
        except GraphBubbleUp:
            # Interrupts and other control flow of LangGraph are not failures.
            raise
        except Exception as exc:  # noqa: BLE001 - any tool failure goes back to the model
            return _error_message(request, exc)

    async def awrap_tool_call(self, request: ToolCallRequest, handler: Callable[..., Any]) -> ToolMessage | Command[Any]:
        try:
            return await handler(request)
        except GraphBubbleUp:
            raise
        except Exception as exc:  # noqa: BLE001 - any tool failure goes back to the model
            return _error_message(request, exc)


def _error_message(request: ToolCallRequest, exc: Exception) -> ToolMessage:
    call = request.tool_call
    log.warning("tool %s failed: %s: %s", call["name"], type(exc).__name__, exc)
    return ToolMessage(
        content=f"Error: the tool {call['name']} failed ({type(exc).__name__}: {exc}). Fix the arguments or try another way.",
        tool_call_id=call["id"],
        name=call["name"],
        status="error",
    )

"""Bounded context across turns: a rolling summary stored in the thread file, and the recent turns that fit."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.messages.utils import count_tokens_approximately

from app.config import HistorySettings
from app.history import utc_now

log = logging.getLogger(__name__)

SUMMARY_PROMPT = """You keep the memory of a long conversation between a user and their assistant.
Write an updated summary of the conversation so far, for the assistant's own later use: facts about the user,
their preferences and plans, decisions taken, open tasks and promises, names, numbers and dates that may matter
later. Drop small talk. Use short bullet points, at most {max_words} words. Write only the summary.

Summary so far:
{previous}

Newer messages to fold in:
{messages}"""
# What a prompt holds besides the stored conversation: tool schemas (~3,500 tokens), skills, system prompt.
PROMPT_OVERHEAD_TOKENS = 6_000
REPLY_RESERVE_TOKENS = 4_096
SUMMARY_HEADER = "Summary of the earlier part of this conversation (older messages are not shown):\n"


@dataclass(frozen=True)
class Budget:
    """How much of the stored conversation goes into a prompt, in (approximate) tokens."""

    history_tokens: int  # most the stored turns may take in a prompt
    refresh_tokens: int  # the unsummarised tail is folded into the summary once it grows past this
    keep_tokens: int  # what stays verbatim after a refresh
    summary_words: int = 400


def budget_for(history: HistorySettings, context_window: int) -> Budget:
    """The history budget that leaves room in the context window for tools, skills and the reply."""
    room = max(1_000, context_window - PROMPT_OVERHEAD_TOKENS - REPLY_RESERVE_TOKENS)
    refresh = min(history.summary_trigger_tokens, room)
    return Budget(history_tokens=room, refresh_tokens=refresh, keep_tokens=min(history.keep_recent_tokens, refresh // 2))


@dataclass
class PreparedContext:
    """The conversation to send for one turn, and the summary to store with it (if refreshed)."""

    messages: list[AnyMessage]
    summary: dict[str, Any] | None = None  # a new summary to write with the turn
    notes: list[str] = field(default_factory=list)  # what happened, for the trace


def tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Approximate token count of stored messages."""
    return count_tokens_approximately([(m["role"], m["content"]) for m in messages]) if messages else 0


class ConversationMemory:
    """Builds each prompt from the thread file: summary + recent turns within the budget.

    The summary is refreshed only when the unsummarised tail outgrows `refresh_tokens`, so a thread
    pays one summarisation call per many turns; a failed refresh falls back to truncation.
    """

    def __init__(self, model: BaseChatModel, budget: Budget) -> None:
        self.model = model
        self.budget = budget

    def prepare(self, thread: Mapping[str, Any], new_message: str, *, callbacks: list[Any] | None = None) -> PreparedContext:
        """The messages for this turn (ending with the new one), refreshing the summary when due."""
        stored = list(thread.get("messages", []))
        summary = thread.get("summary") or {}
        covered = min(int(summary.get("covers", 0)), len(stored))
        text = str(summary.get("text", ""))
        prepared = PreparedContext(messages=[])
        if tokens(stored[covered:]) > self.budget.refresh_tokens:
            fold_until = self._fold_point(stored, covered)
            try:
                text = self._summarise(text, stored[covered:fold_until], callbacks)
                covered = fold_until
                prepared.summary = {"text": text, "covers": covered, "updated_at": utc_now()}
                prepared.notes.append(f"summary refreshed: now covers the first {covered} of {len(stored)} messages")
            except Exception as exc:  # noqa: BLE001 - a failed summary must never cost the turn
                log.warning("summarising thread %s failed (%s: %s); truncating instead", thread.get("thread_id"), type(exc).__name__, exc)
                prepared.notes.append(f"summary failed ({type(exc).__name__}); older messages truncated instead")
        tail = self._fit(stored[covered:])
        if len(tail) < len(stored) - covered:
            prepared.notes.append(f"{len(stored) - covered - len(tail)} older messages left out to fit the budget")
        prepared.messages = _to_messages(text, tail, new_message)
        return prepared

    def _fold_point(self, stored: list[Mapping[str, Any]], covered: int) -> int:
        """Index up to which messages are folded into the summary: all but the last `keep_tokens`, whole turns."""
        return _recent_start(stored, covered, self.budget.keep_tokens)

    def _fit(self, tail: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The most recent messages of the tail that fit the history budget, starting at a question."""
        return tail[_recent_start(tail, 0, self.budget.history_tokens) :]

    def _summarise(self, previous: str, messages: Sequence[Mapping[str, Any]], callbacks: list[Any] | None) -> str:
        transcript = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        prompt = SUMMARY_PROMPT.format(
            max_words=self.budget.summary_words, previous=previous or "(none yet)", messages=transcript
        )
        reply = self.model.invoke([HumanMessage(content=prompt)], config={"callbacks": callbacks or []})
        text = reply.text.strip()
        if not text:
            raise ValueError("the model returned an empty summary")
        return text


def _recent_start(messages: Sequence[Mapping[str, Any]], floor: int, budget: int) -> int:
    """Where the most recent messages within `budget` tokens begin (never before `floor`), at a user message."""
    index, used = len(messages), 0
    while index > floor:
        cost = tokens(messages[index - 1 : index])
        if used + cost > budget:
            break
        index, used = index - 1, used + cost
    # Never split a question from its answer: start the kept part at a user message.
    while index < len(messages) and messages[index].get("role") != "user":
        index += 1
    return index


def _to_messages(summary: str, tail: Sequence[Mapping[str, Any]], new_message: str) -> list[AnyMessage]:
    kinds = {"user": HumanMessage, "assistant": AIMessage}
    messages: list[AnyMessage] = [SystemMessage(content=SUMMARY_HEADER + summary)] if summary else []
    messages += [kinds[m["role"]](content=m["content"]) for m in tail if m.get("role") in kinds]
    messages.append(HumanMessage(content=new_message))
    return messages

"""The events a streamed turn sends to its client, derived from the agent's stream parts."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, AnyMessage, RemoveMessage, ToolMessage

MAX_TOOL_RESULT_CHARS = 2_000


def token_events(chunk: Any, metadata: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """`token` and `reasoning` events for one streamed chunk of the agent's own model calls."""
    # Only the agent's model node speaks to the user; tool messages and subagents' calls do not.
    if not isinstance(chunk, AIMessageChunk) or metadata.get("langgraph_node") != "model":
        return
    reasoning = chunk.additional_kwargs.get("reasoning_content")
    if reasoning:
        yield "reasoning", {"text": reasoning}
    if chunk.text:
        yield "token", {"text": chunk.text}


def new_messages(update: Mapping[str, Any] | None) -> Iterator[AnyMessage]:
    """The messages one `updates` stream part adds, across its nodes.

    Nodes that only keep state (skills, counters) carry no message list, and a list holding a
    RemoveMessage rewrites history (patching, summarising) rather than adding to it: both are skipped.
    """
    for node_update in (update or {}).values():
        messages = node_update.get("messages") if isinstance(node_update, Mapping) else None
        if isinstance(messages, list) and not any(isinstance(m, RemoveMessage) for m in messages):
            yield from messages


def update_events(update: Mapping[str, Any] | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """`tool_call` and `tool_result` events for one `updates` stream part."""
    for message in new_messages(update):
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                yield "tool_call", {"name": call["name"], "args": call["args"]}
        elif isinstance(message, ToolMessage):
            yield "tool_result", _tool_result(message)


def format_sse(event: str, data: Mapping[str, Any]) -> str:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _tool_result(message: ToolMessage) -> dict[str, Any]:
    content = message.content if isinstance(message.content, str) else json.dumps(message.content, ensure_ascii=False)
    truncated = len(content) > MAX_TOOL_RESULT_CHARS
    return {
        "name": message.name or "",
        "content": content[:MAX_TOOL_RESULT_CHARS],
        "truncated": truncated,
        "error": message.status == "error",
    }

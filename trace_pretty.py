"""Readable console trace of one agent turn, built from LangGraph ``stream_mode="updates"`` events."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, ToolMessage

_MAX_ARGS_CHARS = 200  # tool args are context, not content: keep them to about one line
_MAX_RESULT_LINES = 8  # 300 chars of short lines would otherwise fill the screen
_MIN_SECRET_LEN = 6  # shorter "secrets" would mask ordinary words and numbers all over the trace
_MASK = "***"
_IND, _SUB = "  ", "    "  # block items / children of a model step
# One lock for all printers: turns traced from several threads share one stderr.
_WRITE_LOCK = threading.Lock()

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


def _paint(text: str, style: str, color: bool) -> str:
    return f"\033[{_CODES[style]}m{text}\033[0m" if color else text


def _clip(text: str, limit: int, max_lines: int = 0) -> str:
    """Cut to `limit` chars (and `max_lines` lines) and say how much was dropped, so a cut is never
    mistaken for the whole."""
    keep = text if limit <= 0 else text[:limit]
    if max_lines > 0:  # split on "\n" only, so the cut-size arithmetic below stays exact
        keep = "\n".join(keep.split("\n")[:max_lines])
    if len(keep) >= len(text):
        return text
    return f"{keep.rstrip()} [... {len(text) - len(keep)} more chars cut]"


def _labelled(indent: str, label: str, text: str, pad: str | None = None) -> list[str]:
    """`label text`; continuation lines go under the text (or at `pad`) so multi-line values stay readable."""
    head = f"{indent}{label} "
    pad = " " * (len(indent) + _visible_len(label) + 1) if pad is None else pad
    lines = text.splitlines() or [""]
    return [head + lines[0]] + [pad + line for line in lines[1:]]


def _visible_len(text: str) -> int:
    # Labels may carry ANSI codes; alignment must count only what the terminal shows.
    out, skip = 0, False
    for ch in text:
        if ch == "\033":
            skip = True
        elif skip:
            skip = ch != "m"
        else:
            out += 1
    return out


def _block_text(content: Any, kinds: tuple[str, ...]) -> str:
    """Join the text of str / content-block-list message content (blocks of the given `kinds`)."""
    if isinstance(content, str):
        return content if "text" in kinds else ""
    parts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, str) and "text" in kinds:
            parts.append(block)
        elif isinstance(block, Mapping) and block.get("type") in kinds:
            # Reasoning blocks: langchain v1 uses "reasoning", Anthropic uses "thinking".
            value = block.get("text") or block.get("reasoning") or block.get("thinking") or ""
            parts.append(str(value))
    return "\n".join(p for p in parts if p)


def _args_json(args: Any) -> str:
    try:
        text = json.dumps(args, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        text = repr(args)
    return _clip(text, _MAX_ARGS_CHARS)


def _format_ai(msg: AIMessage, color: bool, limit: int) -> list[str]:
    usage = msg.usage_metadata or {}
    head = _IND + _paint("model", "bold", color)
    if usage:
        tokens = f"  ({usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens)"
        head += _paint(tokens, "dim", color)
    lines = [head]
    reasoning = msg.additional_kwargs.get("reasoning_content") or _block_text(msg.content, ("reasoning", "thinking"))
    if reasoning:
        lines += _labelled(_SUB, _paint("thinking:", "yellow", color), _clip(str(reasoning).strip(), 2 * limit))
    text = _block_text(msg.content, ("text",)).strip()
    calls = msg.tool_calls or []
    if text and calls:
        lines += _labelled(_SUB, _paint("says:", "dim", color), _clip(text, limit))
    for call in calls:
        lines.append(f"{_SUB}{_paint('call', 'cyan', color)} {call.get('name')} {_args_json(call.get('args'))}")
    for bad in msg.invalid_tool_calls or []:
        label = _paint("call (invalid)", "red", color)
        lines.append(f"{_SUB}{label} {bad.get('name')} {_clip(str(bad.get('args')), _MAX_ARGS_CHARS)}")
    if not calls:
        # The model's last word of the turn: shown whole, it is what the user receives.
        lines += _labelled(_SUB, _paint("reply:", "green", color), text or "(empty)")
    return lines


def _format_tool(msg: ToolMessage, color: bool, limit: int) -> list[str]:
    failed = msg.status == "error"
    label = f"{_paint('tool', 'bold', color)} {msg.name or '?'}"
    label += " " + (_paint("ERROR ->", "red", color) if failed else "->")
    text = _block_text(msg.content, ("text",))
    # Fixed continuation indent: aligning under long tool names would squeeze file contents to the right.
    return _labelled(_IND, label, _clip(text.strip(), limit, _MAX_RESULT_LINES) or "(empty)", pad=_IND * 3)


def _messages_of(value: Any) -> list[BaseMessage]:
    """Messages worth tracing in one node's update; anything else is state bookkeeping we skip."""
    if not isinstance(value, Mapping):
        return []
    msgs = value.get("messages")
    # Overwrite(...) and other wrappers, or lists carrying RemoveMessage(REMOVE_ALL_MESSAGES), are
    # history rewrites (patching dangling tool calls, summarisation): replaying them would be noise.
    if not isinstance(msgs, list) or any(isinstance(m, RemoveMessage) for m in msgs):
        return []
    return [m for m in msgs if isinstance(m, (AIMessage, ToolMessage))]


def format_header(thread_id: str, request_id: str, *, color: bool = False) -> str:
    return _paint(f"== thread {thread_id} | request {request_id[:8]} ==", "bold", color)


def format_update(update: Mapping[str, Any] | None, *, color: bool = False, max_result_chars: int = 300) -> list[str]:
    """Lines for one stream event, i.e. ``{node_name: node_update}`` for every node in it."""
    if not isinstance(update, Mapping):
        return []
    lines: list[str] = []
    for node, value in update.items():
        if node == "__interrupt__":
            lines.append(_IND + _paint("interrupted: waiting for human input", "yellow", color))
            continue
        for msg in _messages_of(value):
            if isinstance(msg, AIMessage):
                lines += _format_ai(msg, color, max_result_chars)
            else:
                lines += _format_tool(msg, color, max_result_chars)
    return lines


def format_footer(
    *, steps: int, tool_calls: int, usage: Mapping[str, int], elapsed_s: float, finish_reason: str, color: bool = False
) -> str:
    tokens = f"tokens {usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out"
    calls = f"{tool_calls} tool call{'' if tool_calls == 1 else 's'}"
    step_s = f"{steps} step{'' if steps == 1 else 's'}"
    text = f"== done | {step_s} | {calls} | {tokens} | {elapsed_s:.1f}s | finish={finish_reason} =="
    return _paint(text, "bold", color)


def format_error(code: str, message: str, *, color: bool = False) -> str:
    return "\n".join(_labelled(_IND, _paint(f"error {code}:", "red", color), message))


def mask_secrets(text: str, secrets: Iterable[str]) -> str:
    # Longest first, so a secret containing another is masked whole rather than leaving a tail.
    for secret in sorted({s for s in secrets if s and len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(secret, _MASK)
    return text


def _mask_deep(value: Any, secrets: list[str]) -> Any:
    """Mask secrets inside an update before formatting, so truncation cannot leave half a key showing."""
    if isinstance(value, str):
        return mask_secrets(value, secrets)
    if isinstance(value, BaseMessage):
        fields = ("content", "additional_kwargs", "tool_calls", "invalid_tool_calls")
        return value.model_copy(
            update={f: _mask_deep(getattr(value, f), secrets) for f in fields if hasattr(value, f)}
        )
    if isinstance(value, Mapping):
        return {k: _mask_deep(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_deep(v, secrets) for v in value]
    return value


class TracePrinter:
    """Prints one turn's trace; the only part of this module that writes.

    A turn's lines are kept until `finish` or `error` and then written as one block, so the traces of
    turns running at the same time never interleave. Use one printer per turn.
    """

    def __init__(self, stream: TextIO | None = None, *, secrets: Iterable[str] = (), color: bool | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._secrets = [s for s in secrets if s and len(s) >= _MIN_SECRET_LEN]
        self._color = _auto_color(self._stream) if color is None else color
        self._lines: list[str] = []

    def begin(self, thread_id: str, request_id: str) -> None:
        """Start the block of a turn."""
        self._lines = [format_header(thread_id, request_id, color=self._color)]

    def update(self, update: Mapping[str, Any] | None) -> None:
        """Add the lines of one `updates` stream part."""
        if self._secrets:
            update = _mask_deep(update, self._secrets)
        self._lines += format_update(update, color=self._color)

    def finish(
        self, *, steps: int, tool_calls: int, usage: Mapping[str, int], elapsed_s: float, finish_reason: str
    ) -> None:
        """Close the block with the turn's totals and print it."""
        footer = format_footer(steps=steps, tool_calls=tool_calls, usage=usage, elapsed_s=elapsed_s,
                               finish_reason=finish_reason, color=self._color)
        self._flush([footer])

    def error(self, code: str, message: str) -> None:
        """Close the block with the error that ended the turn and print it."""
        self._flush([format_error(code, message, color=self._color)])

    def note(self, text: str) -> None:
        """Add a one-line remark (e.g. a summary refresh)."""
        self._lines += _labelled(_IND, _paint("note:", "dim", self._color), text)

    def _flush(self, closing: list[str]) -> None:
        lines, self._lines = self._lines + closing, []
        # One write + flush per block, masked again as a whole in case a secret reached us another way
        # (header, note, error text).
        text = mask_secrets("\n".join(lines) + "\n", self._secrets)
        with _WRITE_LOCK:
            self._stream.write(text)
            self._stream.flush()


def _auto_color(stream: TextIO) -> bool:
    # https://no-color.org: a set, non-empty NO_COLOR disables colour; pipes and files never get ANSI codes.
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False

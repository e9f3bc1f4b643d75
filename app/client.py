"""Interactive terminal client for a running au server: `python run.py chat`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

import httpx
from dotenv import dotenv_values

from app.history import THREAD_ID

DEFAULT_URL = "http://127.0.0.1:5000"
DEFAULT_STATE = "~/.au_chat"
CONNECT_TIMEOUT_S = 5.0
# Short requests (health, new thread) get a read timeout; a chat turn gets none because it may run many
# model and tool calls, and the server's keep-alive comments show the connection is still alive.
SHORT_TIMEOUT = httpx.Timeout(15.0, connect=CONNECT_TIMEOUT_S)
STREAM_TIMEOUT = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S, write=30.0, pool=CONNECT_TIMEOUT_S)
MAX_SHOWN_CHARS = 200
DIM, RESET = "\x1b[2m", "\x1b[0m"
INLINE_EVENTS = {"token", "reasoning"}  # streamed piece by piece; every other event is a line of its own
HELP = "/new starts a new thread, /thread shows its id, /quit or Ctrl-D/Ctrl-C exits"


# --- pure parts -----------------------------------------------------------------------------------


def parse_sse(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(event, data) for each server-sent event in `lines` (without line endings); comments are skipped."""
    event, data = "message", []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        # The SSE spec drops exactly one space after the colon, so data may itself start with spaces.
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
    # A stream cut before its final blank line still delivers what it carried (e.g. a last `error`).
    if data:
        yield event, "\n".join(data)


def decode_data(data: str) -> dict[str, Any]:
    """An event's JSON payload; anything else is kept as its text."""
    try:
        value = json.loads(data)
    except ValueError:
        return {"text": data}
    return value if isinstance(value, dict) else {"text": data}


def render_event(event: str, data: Mapping[str, Any], *, color: bool) -> str:
    """What the terminal shows for one event: token text as is, everything else a line (tool activity dimmed)."""
    if event == "token":
        return str(data.get("text", ""))
    if event == "reasoning":
        return _dim(str(data.get("text", "")), color)
    if event == "tool_call":
        args = json.dumps(data.get("args", {}), ensure_ascii=False)
        return _dim(f"[tool call] {data.get('name', '?')} {_shorten(args)}", color) + "\n"
    if event == "tool_result":
        label = "tool error" if data.get("error") else "tool result"
        content = _shorten(str(data.get("content", "")), cut=bool(data.get("truncated")))
        return _dim(f"[{label}] {data.get('name', '?')}: {content}", color) + "\n"
    if event == "done":
        usage = data.get("usage") or {}
        calls = usage.get("model_calls", 0)
        line = (
            f"[{calls} model call{'' if calls == 1 else 's'}, {usage.get('total_tokens', 0)} tokens"
            f" ({usage.get('input_tokens', 0)} in, {usage.get('output_tokens', 0)} out)"
        )
        if data.get("finish_reason") not in (None, "stop"):
            line += f", finish: {data['finish_reason']}"
        return _dim(line + "]", color) + "\n"
    if event == "error":
        return f"error {data.get('code', 'error')}: {data.get('message', '')}\n"
    return ""  # an event a newer server may add: ignore it rather than fail


def _dim(text: str, color: bool) -> str:
    return f"{DIM}{text}{RESET}" if color and text else text


def _shorten(text: str, *, cut: bool = False) -> str:
    one_line = " ".join(text.split())
    if len(one_line) > MAX_SHOWN_CHARS:
        return one_line[:MAX_SHOWN_CHARS] + "..."
    return one_line + ("..." if cut else "")


# --- settings and state ---------------------------------------------------------------------------


def resolve_url(url: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """--url, else AU_URL, else the server's default address; without a trailing slash."""
    return (url or environ.get("AU_URL") or DEFAULT_URL).rstrip("/")


def resolve_token(
    token: str | None, environ: Mapping[str, str] = os.environ, dotenv_path: str | None = ".env"
) -> str | None:
    """--token, else AU_TOKEN, else the first of the server's AU_API_TOKENS (environment over .env)."""
    if token:
        return token
    has_dotenv = dotenv_path is not None and os.path.exists(dotenv_path)
    dotenv = {k: v for k, v in dotenv_values(dotenv_path).items() if v} if has_dotenv else {}
    env = {**dotenv, **environ}
    if env.get("AU_TOKEN"):
        return env["AU_TOKEN"]
    tokens = [t.strip() for t in env.get("AU_API_TOKENS", "").split(",") if t.strip()]
    return tokens[0] if tokens else None


def default_state_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the last thread per server is kept: AU_CHAT_STATE or ~/.au_chat."""
    return Path(environ.get("AU_CHAT_STATE") or DEFAULT_STATE).expanduser()


def use_color(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    """ANSI only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return not environ.get("NO_COLOR") and hasattr(stream, "isatty") and stream.isatty()


def load_thread(state_path: Path, url: str) -> str | None:
    """The thread last used with `url`, if the state file has one."""
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        thread_id = state[url]["thread_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no file yet, or one we cannot read: start afresh rather than fail
    return thread_id if isinstance(thread_id, str) and THREAD_ID.fullmatch(thread_id) else None


def save_thread(state_path: Path, url: str, thread_id: str) -> None:
    """Remember `thread_id` as the thread for `url`, keeping other servers' entries."""
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        state = state if isinstance(state, dict) else {}
    except (OSError, ValueError):
        state = {}
    state[url] = {"thread_id": thread_id}
    state_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_path.with_name(state_path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, state_path)  # never leave a half-written file behind


# --- the session ----------------------------------------------------------------------------------


class Unreachable(Exception):
    """The server does not answer at all."""


class ApiError(Exception):
    """An error answer of the API, as code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def _api_error(response: httpx.Response) -> ApiError:
    try:
        error = response.json()["error"]
        return ApiError(str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        text = response.text.strip()[:MAX_SHOWN_CHARS] or response.reason_phrase
        return ApiError(f"http_{response.status_code}", text)


class Session:
    """One server, one thread at a time, printing to `out`."""

    def __init__(self, client: httpx.Client, url: str, out: TextIO, color: bool) -> None:
        self.client, self.url, self.out, self.color = client, url, out, color

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()  # the user watches the reply arrive; never hold it in a buffer

    def request(self, method: str, path: str) -> httpx.Response:
        try:
            response = self.client.request(method, path, timeout=SHORT_TIMEOUT)
        except httpx.TransportError as exc:
            raise Unreachable() from exc
        if response.status_code >= 400:
            raise _api_error(response)
        return response

    def new_thread(self) -> str:
        try:
            return str(self.request("POST", "/threads").json()["thread_id"])
        except (ValueError, KeyError, TypeError):
            raise ApiError("unexpected_response", "POST /threads did not answer with a thread_id") from None

    def send(self, thread_id: str, message: str) -> None:
        """Run one turn and print its events as they arrive."""
        path = f"/threads/{quote(thread_id, safe='')}/chat"
        body = {"message": message, "stream": True}
        headers = {"Accept": "text/event-stream"}
        try:
            with self.client.stream("POST", path, json=body, headers=headers, timeout=STREAM_TIMEOUT) as response:
                if response.status_code >= 400:
                    response.read()
                    self.write(render_event("error", vars(_api_error(response)), color=self.color))
                    return
                self._show(parse_sse(response.iter_lines()))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise Unreachable() from exc
        except httpx.TransportError as exc:
            self.write(f"\nerror connection_lost: {exc or type(exc).__name__}\n")

    def _show(self, events: Iterable[tuple[str, str]]) -> None:
        mid_line, inline = False, None  # where the cursor is, and which inline stream it is in
        final = ""  # the text streamed since the last tool call: normally the reply itself
        for event, raw in events:
            data = decode_data(raw)
            text = render_event(event, data, color=self.color)
            if event in INLINE_EVENTS:
                if mid_line and inline != event and text:
                    text = "\n" + text
                inline = event
                final += str(data.get("text", "")) if event == "token" else ""
            else:
                reply = str(data.get("reply", "")) if event == "done" else ""
                if reply.strip() and reply.strip() != final.strip():
                    # e.g. a step-limit reply, written by the server rather than streamed by the model
                    text = reply.rstrip("\n") + "\n" + text
                if mid_line and text:
                    text = "\n" + text
                inline = None
                if event == "tool_call":
                    final = ""
            if text:
                self.write(text)
                mid_line = not text.endswith("\n")
            if event in ("done", "error"):
                return
        ended = "error incomplete_stream: the server ended the reply before it finished\n"
        self.write(("\n" if mid_line else "") + ended)


def run_chat(
    url: str,
    token: str | None,
    thread_id: str | None,
    *,
    input_fn: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
    state_path: Path | None = None,
    color: bool | None = None,
) -> int:
    """Chat with the au server at `url` until the user quits; 0 on a normal exit, 1 if it cannot go on."""
    url = url.rstrip("/")
    state_path = state_path or default_state_path()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    color = use_color(out) if color is None else color
    with httpx.Client(base_url=f"{url}/au/api", headers=headers, timeout=SHORT_TIMEOUT) as client:
        session = Session(client, url, out, color)
        try:
            return _loop(session, thread_id, input_fn, state_path)
        except Unreachable:
            session.write(f"error: cannot reach au at {url}. Is `python run.py` running there? (--url or AU_URL)\n")
            return 1
        except KeyboardInterrupt:
            session.write("\n")
            return 0


def _loop(session: Session, thread_id: str | None, input_fn: Callable[[str], str], state_path: Path) -> int:
    url = session.url
    if thread_id is not None and not THREAD_ID.fullmatch(thread_id):
        session.write(f"error invalid_thread_id: {thread_id!r}; a thread id is 1-128 letters, digits, '_' or '-'\n")
        return 1
    try:
        session.request("GET", "/health")  # fail fast, before the user types anything
        note = "continuing"
        if thread_id is None:
            thread_id = load_thread(state_path, url)
        if thread_id is None:
            thread_id, note = session.new_thread(), "new"
    except ApiError as error:
        hint = " (pass --token or set AU_TOKEN)" if error.code == "unauthorized" else ""
        session.write(f"error {error.code}: {error.message}{hint}\n")
        return 1
    _remember(session, state_path, thread_id)
    session.write(f"au at {url}, {note} thread {thread_id}\n{HELP}\n")
    while True:
        try:
            line = input_fn("you> ").strip()
        except EOFError:
            session.write("\n")
            return 0
        if line in ("/quit", "/exit"):
            return 0
        if line == "/thread":
            session.write(f"thread {thread_id}\n")
        elif line == "/new":
            try:
                thread_id = session.new_thread()
            except ApiError as error:
                session.write(render_event("error", vars(error), color=False))
                continue
            _remember(session, state_path, thread_id)
            session.write(f"new thread {thread_id}\n")
        elif line in ("/help", "/?"):
            session.write(HELP + "\n")
        elif line:
            session.send(thread_id, line)


def _remember(session: Session, state_path: Path, thread_id: str) -> None:
    try:
        save_thread(state_path, session.url, thread_id)
    except OSError as exc:
        # Losing the state only costs continuity next time; the chat itself still works.
        session.write(f"warning: cannot save the thread id to {state_path}: {exc.strerror or exc}\n")


def main(url: str | None, token: str | None, thread_id: str | None) -> int:
    """`python run.py chat`: fill in the defaults from the environment and .env, then chat."""
    try:
        import readline  # noqa: F401  # line editing and history for input(), where the platform has it
    except ImportError:
        pass
    return run_chat(resolve_url(url), resolve_token(token), thread_id)

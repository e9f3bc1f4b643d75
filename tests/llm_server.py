"""A scripted LLM server for the test-suite: a real HTTP peer on 127.0.0.1 speaking DeepSeek and Ollama.

The chat models under test (ChatDeepSeek via the openai SDK, ChatOllama via the ollama SDK) talk to it
over real sockets, so their request building, response parsing and error mapping are all exercised.
Responses come from a FIFO script shared by both protocols; every request is recorded.

    with ScriptedLLM() as llm:
        llm.reply("Hello there")
        llm.reply(tool_calls=[("read_file", {"path": "a.txt"})], reasoning="I should look")
        llm.fail(429, headers={"retry-after": "0"})
        model = ChatDeepSeek(model="deepseek-chat", api_key="k", api_base=llm.url, max_retries=0)

Stdlib only.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Recorded", "Response", "ScriptedLLM", "OPENAI_CHAT_PATHS", "OLLAMA_CHAT_PATH"]

OPENAI_CHAT_PATHS = ("/chat/completions", "/v1/chat/completions")
OLLAMA_CHAT_PATH = "/api/chat"
CHAT_PATHS = (*OPENAI_CHAT_PATHS, OLLAMA_CHAT_PATH)

DEFAULT_REPLY = "scripted default reply"

# DeepSeek's wording for the thinking-mode rule, so code matching on it sees the real text.
_REASONING_MISSING = (
    "Missing `reasoning_content` field in the assistant message at message index {index}. "
    "For more information, please refer to https://api-docs.deepseek.com/guides/thinking_mode#tool-calls"
)

# OpenAI/DeepSeek error `type` per status, for fail() without an explicit body.
_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_balance",
    403: "permission_denied",
    404: "not_found_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_overloaded",
}


@dataclass
class Recorded:
    """One HTTP request as the server received it (header names lower-cased)."""

    path: str
    method: str
    body: Any
    headers: dict[str, str]

    @property
    def is_chat(self) -> bool:
        """Whether this was a chat request of either protocol."""
        return self.method == "POST" and self.path in CHAT_PATHS


@dataclass
class Response:
    """One scripted answer: a model reply (status 200) or an HTTP error (status >= 400).

    `error` is the error body (dict → JSON, str → sent verbatim, None → the protocol's usual error shape
    carrying `message`).
    `hang` makes the server never answer until stop().
    """

    content: str = ""
    tool_calls: Sequence[tuple[str, dict]] = ()
    reasoning: str | None = None
    usage: tuple[int, int] = (10, 5)
    delay: float = 0.0
    chunk_delay: float = 0.0
    status: int = 200
    error: dict | str | None = None
    message: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False


Script = Response | Callable[[dict], Response]


def _pieces(text: str) -> list[str]:
    """Split text into word-sized pieces that concatenate back to the original."""
    return re.findall(r"\s*\S+\s*|\s+", text) if text else []


def _halves(text: str) -> list[str]:
    """Split text in two so clients have to re-assemble streamed tool-call arguments."""
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


def _ollama_base(name: str) -> str:
    """Ollama treats 'qwen3' and 'qwen3:latest' as the same model."""
    return name if ":" in name else f"{name}:latest"


class _Stopped(Exception):
    """Raised inside a handler when the server is stopping, to drop the connection."""


class _HTTPServer(ThreadingHTTPServer):
    """One thread per connection, so concurrent requests and hanging ones do not block each other."""

    daemon_threads = True
    # Handler threads may be parked in hang(); stop() must not wait for them.
    block_on_close = False
    owner: ScriptedLLM

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out or go away mid-answer are expected in these tests; stay quiet.
        pass


class _Handler(BaseHTTPRequestHandler):
    """Routes one connection's requests to the owning ScriptedLLM."""

    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = self.path.split("?", 1)[0]
        owner = self.server.owner
        owner._record(Recorded(path, self.command, body, {k.lower(): v for k, v in self.headers.items()}))
        try:
            owner._route(self, path, body if isinstance(body, dict) else {})
        except _Stopped:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        """Send a complete JSON (or verbatim string) body with a Content-Length."""
        is_text = isinstance(payload, str)
        data = payload.encode() if is_text else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if is_text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def send_stream(self, content_type: str, chunks: Iterator[bytes], headers: dict[str, str]) -> None:
        """Send chunks with HTTP/1.1 chunked encoding, flushing each so the client sees them as they come."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class ScriptedLLM:
    """A real HTTP peer on 127.0.0.1 that answers from a script and records every request."""

    def __init__(self, *, ollama_models: Iterable[str] = ("qwen3",), context_length: int = 32768) -> None:
        self.ollama_models: list[str] = list(ollama_models)
        self.context_length = context_length
        self.requests: list[Recorded] = []
        self.url = ""
        self._script: deque[Script] = deque()
        self._default: Script = Response(content=DEFAULT_REPLY)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._ids = itertools.count(1)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> ScriptedLLM:
        """Bind to a free port on 127.0.0.1 and serve from a daemon thread."""
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self.url = f"http://127.0.0.1:{httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: release hanging/delayed handlers and drop open (keep-alive) connections."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            # Without this a keep-alive connection would keep answering after stop().
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting ---------------------------------------------------------------------------------

    def reply(
        self,
        content: str = "",
        *,
        tool_calls: Sequence[tuple[str, dict]] | None = None,
        reasoning: str | None = None,
        usage: tuple[int, int] = (10, 5),
        delay: float = 0.0,
        chunk_delay: float = 0.0,
    ) -> None:
        """Enqueue one model response (content, tool calls as (name, args), reasoning, (prompt, completion) usage)."""
        self._enqueue(
            Response(
                content=content,
                tool_calls=tuple(tool_calls or ()),
                reasoning=reasoning,
                usage=usage,
                delay=delay,
                chunk_delay=chunk_delay,
            )
        )

    def fail(
        self,
        status: int,
        body: dict | str | None = None,
        *,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
    ) -> None:
        """Enqueue one HTTP error response; body None gives the protocol's usual error shape."""
        self._enqueue(Response(status=status, error=body, headers=dict(headers or {}), delay=delay))

    def respond_with(self, fn: Callable[[dict], Response]) -> None:
        """Enqueue a callable that builds the response from the request body."""
        self._enqueue(fn)

    def default(self, fn_or_response: Response | Callable[[dict], Response]) -> None:
        """Set what to answer when the script is empty."""
        self._default = fn_or_response

    def hang(self) -> None:
        """Enqueue a response that never comes: the request stays open until the client gives up or stop()."""
        self._enqueue(Response(hang=True))

    def pending(self) -> int:
        """How many scripted entries are still queued."""
        with self._lock:
            return len(self._script)

    def chat_requests(self) -> list[dict]:
        """Bodies of chat requests only (both protocols), in order."""
        with self._lock:
            return [r.body for r in self.requests if r.is_chat and isinstance(r.body, dict)]

    # -- internals ---------------------------------------------------------------------------------

    def _enqueue(self, entry: Script) -> None:
        with self._lock:
            self._script.append(entry)

    def _next(self, body: dict) -> Response:
        with self._lock:
            entry = self._script.popleft() if self._script else self._default
        if isinstance(entry, Response):
            return entry
        try:
            made = entry(body)
        except Exception as exc:  # noqa: BLE001 - surfaced to the test as a 500 it can read
            return Response(status=500, message=f"scripted callable raised {type(exc).__name__}: {exc}")
        return Response(content=made) if isinstance(made, str) else made

    def _record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _pause(self, seconds: float) -> None:
        """Sleep, but wake (and abandon the answer) as soon as stop() is called."""
        if seconds > 0 and self._stopping.wait(seconds):
            raise _Stopped

    def _new_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def _knows_ollama_model(self, name: str) -> bool:
        return _ollama_base(name) in {_ollama_base(m) for m in self.ollama_models}

    def _route(self, handler: _Handler, path: str, body: dict) -> None:
        method = handler.command
        if method == "POST" and path in OPENAI_CHAT_PATHS:
            self._openai_chat(handler, body)
        elif method == "POST" and path == OLLAMA_CHAT_PATH:
            self._ollama_chat(handler, body)
        elif method == "GET" and path == "/api/tags":
            handler.send_json(200, {"models": [self._ollama_tag(m) for m in self.ollama_models]})
        elif method == "POST" and path == "/api/show":
            self._ollama_show(handler, body)
        elif method == "GET" and path == "/api/version":
            handler.send_json(200, {"version": "0.12.0"})
        else:
            handler.send_json(404, {"error": f"no route for {method} {path}"})

    def _wait_for(self, response: Response) -> None:
        if response.hang:
            self._stopping.wait()
            raise _Stopped
        self._pause(response.delay)

    # -- DeepSeek / OpenAI chat completions ----------------------------------------------------------

    def _openai_chat(self, handler: _Handler, body: dict) -> None:
        if (index := self._missing_reasoning_index(body)) is not None:
            # Checked before popping the script: DeepSeek rejects the request before generating.
            message = _REASONING_MISSING.format(index=index)
            kind = "invalid_request_error"
            error = {"message": message, "type": kind, "param": None, "code": kind}
            handler.send_json(400, {"error": error})
            return
        response = self._next(body)
        self._wait_for(response)
        if response.status >= 400:
            handler.send_json(response.status, self._openai_error(response), response.headers)
            return
        model = str(body.get("model", "deepseek-chat"))
        completion_id = f"chatcmpl-{self._new_id()}"
        tool_calls = [(f"call_{self._new_id()}", name, json.dumps(args)) for name, args in response.tool_calls]
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = self._openai_chunks(response, completion_id, model, tool_calls, include_usage=include_usage)
            handler.send_stream("text/event-stream; charset=utf-8", chunks, response.headers)
            return
        message: dict[str, Any] = {"role": "assistant", "content": response.content}
        if response.reasoning is not None:
            message["reasoning_content"] = response.reasoning
        if tool_calls:
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                for call_id, name, arguments in tool_calls
            ]
        payload = {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                }
            ],
            "usage": self._openai_usage(response),
            "system_fingerprint": "fp_scripted",
        }
        handler.send_json(200, payload, response.headers)

    @staticmethod
    def _missing_reasoning_index(body: dict) -> int | None:
        """Index of the first assistant tool-call message without reasoning, when thinking mode is on."""
        thinking = body.get("model") == "deepseek-reasoner" or (body.get("thinking") or {}).get("type") == "enabled"
        if not thinking:
            return None
        for index, message in enumerate(body.get("messages") or []):
            if (
                isinstance(message, dict)
                and message.get("role") == "assistant"
                and message.get("tool_calls")
                and not message.get("reasoning_content")
            ):
                return index
        return None

    @staticmethod
    def _openai_usage(response: Response) -> dict[str, int]:
        prompt, completion = response.usage
        # DeepSeek reports its context cache as top-level fields; ChatDeepSeek maps hits to cache_read.
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_cache_hit_tokens": 0,
            "prompt_cache_miss_tokens": prompt,
        }

    @staticmethod
    def _openai_error(response: Response) -> dict | str:
        if response.error is not None:
            return response.error
        kind = _OPENAI_ERROR_TYPES.get(response.status, "api_error")
        message = response.message or f"scripted error (HTTP {response.status})"
        return {"error": {"message": message, "type": kind, "param": None, "code": kind}}

    def _openai_chunks(
        self,
        response: Response,
        completion_id: str,
        model: str,
        tool_calls: list[tuple[str, str, str]],
        *,
        include_usage: bool,
    ) -> Iterator[bytes]:
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            data: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_scripted",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            }
            if include_usage:
                data["usage"] = None
            return f"data: {json.dumps(data)}\n\n".encode()

        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        deltas += [{"content": None, "reasoning_content": piece} for piece in _pieces(response.reasoning or "")]
        deltas += [{"content": piece} for piece in _pieces(response.content)]
        for index, (call_id, name, arguments) in enumerate(tool_calls):
            head = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            deltas.append({"tool_calls": [head]})
            deltas += [
                {"tool_calls": [{"index": index, "function": {"arguments": part}}]} for part in _halves(arguments)
            ]

        for position, delta in enumerate(deltas):
            if position:
                self._pause(response.chunk_delay)
            yield chunk(delta)
        self._pause(response.chunk_delay)
        yield chunk({"content": ""}, "tool_calls" if tool_calls else "stop")
        if include_usage:
            final = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_scripted",
                "choices": [],
                "usage": self._openai_usage(response),
            }
            yield f"data: {json.dumps(final)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    # -- Ollama ------------------------------------------------------------------------------------

    def _ollama_chat(self, handler: _Handler, body: dict) -> None:
        model = str(body.get("model", ""))
        if not self._knows_ollama_model(model):
            handler.send_json(404, {"error": f'model "{model}" not found, try pulling it first'})
            return
        response = self._next(body)
        self._wait_for(response)
        if response.status >= 400:
            error = response.error
            if error is None:
                error = {"error": response.message or f"scripted error (HTTP {response.status})"}
            handler.send_json(response.status, error, response.headers)
            return
        # Ollama only separates thinking when asked (or by model default); an explicit false turns it off.
        reasoning = response.reasoning if body.get("think") is not False else None
        tool_calls = [{"function": {"name": name, "arguments": dict(args)}} for name, args in response.tool_calls]
        if body.get("stream", True):
            lines = self._ollama_lines(response, model, reasoning, tool_calls)
            handler.send_stream("application/x-ndjson", lines, response.headers)
            return
        message: dict[str, Any] = {"role": "assistant", "content": response.content}
        if reasoning is not None:
            message["thinking"] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        handler.send_json(200, {**self._ollama_done(response, model), "message": message}, response.headers)

    @staticmethod
    def _ollama_done(response: Response, model: str) -> dict[str, Any]:
        prompt, completion = response.usage
        return {
            "model": model,
            "created_at": _now_iso(),
            "done": True,
            "done_reason": "stop",
            "total_duration": 120_000_000,
            "load_duration": 10_000_000,
            "prompt_eval_count": prompt,
            "prompt_eval_duration": 30_000_000,
            "eval_count": completion,
            "eval_duration": 80_000_000,
        }

    def _ollama_lines(
        self, response: Response, model: str, reasoning: str | None, tool_calls: list[dict[str, Any]]
    ) -> Iterator[bytes]:
        def line(message: dict[str, Any]) -> bytes:
            part = {
                "model": model,
                "created_at": _now_iso(),
                "message": {"role": "assistant", **message},
                "done": False,
            }
            return json.dumps(part).encode() + b"\n"

        messages: list[dict[str, Any]] = [{"content": "", "thinking": piece} for piece in _pieces(reasoning or "")]
        messages += [{"content": piece} for piece in _pieces(response.content)]
        if tool_calls:
            # Ollama sends all of a turn's tool calls whole, in one line.
            messages.append({"content": "", "tool_calls": tool_calls})
        for position, message in enumerate(messages):
            if position:
                self._pause(response.chunk_delay)
            yield line(message)
        self._pause(response.chunk_delay)
        final = {**self._ollama_done(response, model), "message": {"role": "assistant", "content": ""}}
        yield json.dumps(final).encode() + b"\n"

    def _ollama_show(self, handler: _Handler, body: dict) -> None:
        model = str(body.get("model") or body.get("name") or "")
        if not self._knows_ollama_model(model):
            handler.send_json(404, {"error": f"model '{model}' not found"})
            return
        family = _family(model)
        handler.send_json(
            200,
            {
                "license": "scripted",
                "modelfile": f"FROM {model}\n",
                "parameters": "temperature 0.6",
                "template": "{{ .Prompt }}",
                "details": _details(model),
                "model_info": {
                    "general.architecture": family,
                    "general.parameter_count": 8_190_735_360,
                    f"{family}.context_length": self.context_length,
                    f"{family}.embedding_length": 4096,
                },
                "capabilities": ["completion", "tools", "thinking"],
                "modified_at": "2025-01-01T00:00:00Z",
            },
        )

    @staticmethod
    def _ollama_tag(model: str) -> dict[str, Any]:
        name = _ollama_base(model)
        return {
            "name": name,
            "model": name,
            "modified_at": "2025-01-01T00:00:00Z",
            "size": 5_225_388_164,
            "digest": "0" * 64,
            "details": _details(model),
        }


def _family(model: str) -> str:
    """The architecture name /api/show reports, which prefixes the model_info keys."""
    return model.split(":", 1)[0].split("/")[-1]


def _details(model: str) -> dict[str, Any]:
    """Ollama's `details` block for a model."""
    family = _family(model)
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": "8.2B",
        "quantization_level": "Q4_K_M",
    }


def _now_iso() -> str:
    """Ollama's created_at timestamp format."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())

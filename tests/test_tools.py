"""Tests for app/tools.py against a local stdlib HTTP server (no internet)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.tools import build_tools, html_to_text, make_http_request_tool

BIG_SIZE = 50_000
HTML_PAGE = b"""<!DOCTYPE html><html><head><title>Test Page</title>
<style>body { color: red; }</style>
<script>var secret = "do-not-show"; alert(1);</script></head>
<body><h1>Hello   World</h1>
<p>First &amp; foremost,
   a paragraph.</p><ul><li>one</li><li>two</li></ul>
<noscript>enable js</noscript></body></html>"""


class _Handler(BaseHTTPRequestHandler):
    # http.server speaks HTTP/1.0 by default, which is what the status lines below show.
    # Set by the fixture so the slow endpoint can be released at teardown.
    release: threading.Event

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, content_type: str,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/json":
            self._send(200, json.dumps({"answer": 42, "items": ["a", "b"]}).encode(), "application/json")
        elif self.path == "/html":
            self._send(200, HTML_PAGE, "text/html; charset=utf-8")
        elif self.path == "/big":
            self._send(200, b"x" * BIG_SIZE, "text/plain")
        elif self.path == "/slow":
            # Hold the response until the client gives up (or teardown releases us).
            self.release.wait(5)
            self._send(200, b"late", "text/plain")
        elif self.path == "/redirect":
            self._send(302, b"", "text/plain", {"Location": "/json"})
        elif self.path == "/loop":
            self._send(302, b"", "text/plain", {"Location": "/loop"})
        elif self.path == "/latin1":
            self._send(200, "café".encode("latin-1"), "text/plain; charset=iso-8859-1")
        else:
            self._send(404, b"no such page", "text/plain")

    do_HEAD = do_GET

    def _echo(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        payload = {
            "method": self.command,
            "path": self.path,
            "body": self.rfile.read(length).decode(),
            "x_test": self.headers.get("X-Test"),
            "content_type": self.headers.get("Content-Type"),
        }
        self._send(201, json.dumps(payload).encode(), "application/json", {"Location": "/created/1"})

    do_POST = do_PUT = do_PATCH = do_DELETE = _echo


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx honours proxy env vars; a proxy must not intercept requests to 127.0.0.1.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[str]:
    release = threading.Event()
    handler = type("Handler", (_Handler,), {"release": release})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def http_request():
    return make_http_request_tool(timeout_s=2.0, max_response_bytes=10_000)


def test_get_json(server: str, http_request) -> None:
    out = http_request.invoke({"url": f"{server}/json"})
    assert out.splitlines()[0] == "HTTP/1.0 200 OK"
    assert "content-type: application/json" in out
    body = out.split("\n\n", 1)[1]
    assert json.loads(body) == {"answer": 42, "items": ["a", "b"]}


def test_post_sends_body_and_headers(server: str, http_request) -> None:
    out = http_request.invoke({
        "url": f"{server}/submit",
        "method": "post",
        "headers": {"X-Test": "yes"},
        "body": '{"name": "au"}',
    })
    assert out.startswith("HTTP/1.0 201 Created")
    assert "location: /created/1" in out
    echoed = json.loads(out.split("\n\n", 1)[1])
    assert echoed == {
        "method": "POST",
        "path": "/submit",
        "body": '{"name": "au"}',
        "x_test": "yes",
        "content_type": "application/json",  # guessed because the body is JSON
    }


def test_html_reduced_to_text(server: str, http_request) -> None:
    out = http_request.invoke({"url": f"{server}/html"})
    body = out.split("\n\n", 1)[1]
    assert "Test Page" in body
    assert "Hello World" in body
    assert "First & foremost, a paragraph." in body
    assert "- one\n- two" in body
    for leaked in ("do-not-show", "alert", "color: red", "enable js", "<", ">"):
        assert leaked not in body


def test_html_to_text_helper() -> None:
    assert html_to_text("<p>a\n\n  b</p><script>x()</script><div>c</div>") == "a b\nc"


def test_response_over_cap_is_truncated(server: str) -> None:
    tool = make_http_request_tool(timeout_s=2.0, max_response_bytes=1000)
    out = tool.invoke({"url": f"{server}/big"})
    assert "truncated at 1000 bytes" in out
    body = out.split("\n\n", 1)[1]
    assert body.startswith("x" * 1000)
    assert "x" * 1001 not in body


def test_under_cap_not_truncated(server: str, http_request) -> None:
    out = http_request.invoke({"url": f"{server}/json"})
    assert "truncated" not in out


def test_timeout_on_slow_endpoint(server: str) -> None:
    tool = make_http_request_tool(timeout_s=0.3)
    started = time.monotonic()
    out = tool.invoke({"url": f"{server}/slow"})
    assert out.startswith("Error:")
    assert "timed out" in out
    assert time.monotonic() - started < 0.9


def test_connection_refused(http_request) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # The socket is closed and never listened on, so nothing accepts connections there.
    out = http_request.invoke({"url": f"http://127.0.0.1:{port}/"})
    assert out.startswith("Error:")
    assert "refused" in out


def test_non_http_scheme_refused(http_request) -> None:
    out = http_request.invoke({"url": "file:///etc/passwd"})
    assert out.startswith("Error:")
    assert "http://" in out and "read_file" in out
    assert "root:" not in out


def test_url_without_scheme_refused(http_request) -> None:
    out = http_request.invoke({"url": "example.com/page"})
    assert out.startswith("Error:")
    assert "https://" in out


def test_invalid_method_refused(server: str, http_request) -> None:
    out = http_request.invoke({"url": f"{server}/json", "method": "TRACE"})
    assert out.startswith("Error:")
    assert "GET" in out and "TRACE" in out


def test_redirect_followed(server: str, http_request) -> None:
    out = http_request.invoke({"url": f"{server}/redirect"})
    assert out.startswith("HTTP/1.0 200 OK")
    assert f"final-url: {server}/json (after 1 redirect)" in out
    assert '"answer": 42' in out


def test_redirect_loop_is_error(server: str, http_request) -> None:
    out = http_request.invoke({"url": f"{server}/loop"})
    assert out.startswith("Error:")
    assert "redirect" in out


def test_404_reported_with_status(server: str, http_request) -> None:
    out = http_request.invoke({"url": f"{server}/missing"})
    assert not out.startswith("Error:")
    assert out.startswith("HTTP/1.0 404 Not Found")
    assert "no such page" in out


def test_head_has_no_body(server: str, http_request) -> None:
    out = http_request.invoke({"url": f"{server}/json", "method": "HEAD"})
    assert out.startswith("HTTP/1.0 200 OK")
    assert "(no body: HEAD request)" in out
    assert "answer" not in out


def test_charset_from_response(server: str, http_request) -> None:
    out = http_request.invoke({"url": f"{server}/latin1"})
    assert out.endswith("café")


def test_schema_and_build_tools() -> None:
    tools = build_tools(http_timeout_s=5, http_max_bytes=1234)
    assert [t.name for t in tools] == ["http_request"]
    tool = tools[0]
    assert set(tool.args) == {"url", "method", "headers", "body"}
    assert all(tool.args[name].get("description") for name in tool.args)
    assert "read_file" in tool.description and "execute" in tool.description
    assert "1234 bytes" in tool.description and "5s" in tool.description


def test_bad_config_rejected() -> None:
    with pytest.raises(ValueError):
        make_http_request_tool(timeout_s=0)
    with pytest.raises(ValueError):
        make_http_request_tool(max_response_bytes=0)

"""Python tools that au gives the agent, on top of deepagents' filesystem and shell tools."""

from __future__ import annotations

import codecs
import json
import re
import time
from html.parser import HTMLParser

import httpx
from langchain_core.tools import BaseTool, StructuredTool

ALLOWED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")
MAX_REDIRECTS = 5
# Some sites reject httpx's default User-Agent outright; name ourselves instead.
USER_AGENT = "au-assistant/0.1 (+https://www.python-httpx.org)"
# Per-step timeouts alone let a server that drips one byte at a time hold the
# agent forever, so the whole request also gets a wall-clock budget.
_TOTAL_BUDGET_FACTOR = 3.0
_SHOWN_HEADERS = ("content-type", "content-length", "location")
_BINARY_TYPES = ("image/", "audio/", "video/", "font/", "application/pdf", "application/zip",
                 "application/gzip", "application/octet-stream")
_TEXT_HINTS = ("text/", "json", "xml", "javascript", "x-www-form-urlencoded", "yaml", "csv")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


class _HTMLToText(HTMLParser):
    """Reduce HTML to readable text: drop non-content elements, break lines at blocks."""

    # Not "head": pages often omit </head>, and its only text worth keeping is <title>.
    _SKIP = frozenset({"script", "style", "noscript", "template", "svg"})
    _BLOCK = frozenset({
        "address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt", "fieldset",
        "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
        "hr", "li", "main", "nav", "ol", "p", "pre", "section", "table", "title", "tr", "ul",
    })

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skip_depth += 1
        elif tag in self._BLOCK:
            self._parts.append("\n- " if tag == "li" else "\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in self._BLOCK:
            self._parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._skip_depth == 0:
            # Source line breaks are layout noise; block tags decide where lines end.
            self._parts.append(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        lines = (line.strip() for line in "".join(self._parts).split("\n"))
        return "\n".join(line for line in lines if line and line != "-")


def html_to_text(html: str) -> str:
    """Return the readable text of an HTML document (no scripts/styles/tags, whitespace collapsed)."""
    parser = _HTMLToText()
    try:
        parser.feed(html)
        parser.close()
    except Exception:  # html.parser is lenient; never let odd markup lose the whole page
        pass
    return parser.text()


def _pick_charset(response: httpx.Response, raw: bytes, is_html: bool) -> str:
    charset = response.charset_encoding
    if not charset and is_html:
        match = _META_CHARSET.search(raw[:4096])
        charset = match.group(1).decode("ascii", "ignore") if match else None
    try:
        return codecs.lookup(charset).name if charset else "utf-8"
    except LookupError:
        return "utf-8"


def _is_binary(content_type: str, raw: bytes) -> bool:
    if any(hint in content_type for hint in _TEXT_HINTS):
        return False
    if content_type.startswith(_BINARY_TYPES):
        return True
    return b"\x00" in raw[:1024]


def _connect_error_text(exc: httpx.ConnectError, url: httpx.URL) -> str:
    detail = str(exc) or type(exc).__name__
    low = detail.lower()
    port = url.port or (443 if url.scheme == "https" else 80)
    if any(m in low for m in ("name or service not known", "nodename nor servname", "getaddrinfo",
                              "name resolution", "no address associated", "errno -2", "errno -3",
                              "errno -5", "errno 8]")):
        return (f"Error: could not resolve host '{url.host}' (DNS lookup failed: {detail}). "
                "Check the spelling of the domain; if it is right, this machine may have no "
                "internet access.")
    if "refused" in low:
        return (f"Error: connection refused by {url.host}:{port} - nothing is listening there. "
                "Check the host and port (and http vs https), or whether the service is running.")
    if "certificate" in low or "ssl" in low:
        return (f"Error: TLS/SSL failure talking to {url.host}: {detail}. The site's certificate "
                "may be invalid or the port may not speak HTTPS; try http:// only if the "
                "service is known to be plain HTTP.")
    if "unreachable" in low:
        return (f"Error: network unreachable while connecting to {url.host} ({detail}). "
                "This machine may be offline; tell the user rather than retrying.")
    return (f"Error: could not connect to {url.host}:{port} ({detail}). Check the URL; the host "
            "may be down or this machine may be offline.")


def make_http_request_tool(*, timeout_s: float = 20.0, max_response_bytes: int = 200_000) -> BaseTool:
    """Build the `http_request` tool with the given per-step timeout and body size cap."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if max_response_bytes <= 0:
        raise ValueError(f"max_response_bytes must be positive, got {max_response_bytes}")

    def http_request(
        url: str,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        body: str | None = None,
    ) -> str:
        """Make an HTTP(S) request: fetch a web page or call a JSON/REST API.

        Use it to read a web page, download a small text/JSON document, or call an HTTP API on
        the internet or the local network (GET to read; POST/PUT/PATCH/DELETE to change things).
        Not for local files (use read_file) and not for running commands (use execute).

        It returns text: the status line (e.g. "HTTP/1.1 200 OK"), the content-type,
        content-length and location headers, then the body decoded as text. HTML pages are
        reduced to their readable text (scripts, styles and tags removed, so no links or markup).
        Binary bodies (images, PDFs, archives) are not shown, only their size. HTTP error statuses
        such as 404 or 500 are normal results with their status line. Redirects are followed.
        A body larger than the size cap is cut off and the result says so. If the request cannot
        be made at all (bad URL, DNS failure, connection refused, timeout, too many redirects) the
        result starts with "Error:" and says what to try: fix the call or tell the user; never
        invent the content.

        Args:
            url: Full URL starting with http:// or https://, including any query string,
                e.g. "https://api.example.com/items?limit=5".
            method: HTTP method, one of GET, POST, PUT, PATCH, DELETE, HEAD. Defaults to GET.
            headers: Optional request headers,
                e.g. {"Accept": "application/json", "Authorization": "Bearer ..."}.
            body: Optional request body as a string, e.g. a JSON document for POST/PUT/PATCH.
                If it is JSON and no Content-Type header is given, application/json is sent.
        """
        url = (url or "").strip()
        verb = (method or "GET").strip().upper()
        if verb not in ALLOWED_METHODS:
            return (f"Error: unsupported HTTP method {method!r}. Use one of: "
                    f"{', '.join(ALLOWED_METHODS)}.")
        if "://" not in url:
            return (f"Error: {url!r} is not a full URL. Use a URL starting with http:// or "
                    "https://, e.g. https://example.com/page. For local files use read_file.")
        try:
            target = httpx.URL(url)
        except Exception as exc:  # httpx.InvalidURL, or ValueError/TypeError on odd input
            return f"Error: invalid URL {url!r} ({exc}). Give a full URL like https://example.com/page."
        if target.scheme not in ("http", "https"):
            return (f"Error: only http:// and https:// URLs are supported, not '{target.scheme}://'. "
                    "To read a local file use read_file; for anything else use execute if it "
                    "is available.")
        if not target.host:
            return f"Error: URL {url!r} has no host name. Give a full URL like https://example.com/page."

        send_headers = {"User-Agent": USER_AGENT}
        send_headers.update({str(k): str(v) for k, v in (headers or {}).items()})
        if body is not None and not any(k.lower() == "content-type" for k in send_headers):
            send_headers["Content-Type"] = _guess_body_type(body)

        deadline = time.monotonic() + timeout_s * _TOTAL_BUDGET_FACTOR
        try:
            # A client per call: nothing shared between concurrent tool calls, and the
            # connection is always closed when we stop reading at the cap.
            with httpx.Client(follow_redirects=True, max_redirects=MAX_REDIRECTS,
                              timeout=httpx.Timeout(timeout_s)) as client:
                with client.stream(verb, target, headers=send_headers,
                                   content=body.encode("utf-8") if body is not None else None) as resp:
                    raw, truncated, out_of_time = _read_capped(resp, max_response_bytes, deadline)
                    return _format_response(resp, raw, verb, truncated, out_of_time,
                                            max_response_bytes, timeout_s)
        except httpx.ConnectTimeout:
            return (f"Error: connecting to {target.host} timed out after {timeout_s:g}s. The host may "
                    "be down, firewalled or unreachable from here; check the URL or try later.")
        except httpx.TimeoutException:
            return (f"Error: request to {url} timed out after {timeout_s:g}s waiting for the "
                    "server. It is slow or overloaded; try again later or a lighter endpoint.")
        except httpx.TooManyRedirects:
            return (f"Error: too many redirects (more than {MAX_REDIRECTS}) starting from {url}; the "
                    "site may be in a redirect loop. Try the final URL directly or another page.")
        except httpx.ConnectError as exc:
            return _connect_error_text(exc, target)
        except httpx.UnsupportedProtocol as exc:
            return (f"Error: the request was redirected to a URL that is not http/https ({exc}). "
                    "Only http:// and https:// can be fetched.")
        except httpx.RemoteProtocolError as exc:
            return (f"Error: the server at {target.host} closed the connection or sent an invalid "
                    f"response ({exc}). Check the port/scheme (http vs https) or try again.")
        except httpx.HTTPError as exc:
            return (f"Error: HTTP request to {url} failed ({type(exc).__name__}: {exc}). "
                    "Check the URL and try again.")
        except Exception as exc:  # e.g. non-ASCII header values; the model should see it, not crash
            return (f"Error: could not send the request ({type(exc).__name__}: {exc}). Check the "
                    "method, headers (plain ASCII strings) and body.")

    tool = StructuredTool.from_function(http_request, name="http_request", parse_docstring=True)
    # The docstring is static and wrapped for the source; give the model one clean paragraph
    # that also states the limits actually configured here.
    tool.description = (" ".join(tool.description.split())
                        + f" Limits: {timeout_s:g}s timeout per network step, body capped at "
                        f"{max_response_bytes} bytes, at most {MAX_REDIRECTS} redirects.")
    return tool


def _guess_body_type(body: str) -> str:
    stripped = body.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            json.loads(body)
            return "application/json"
        except ValueError:
            pass
    return "text/plain; charset=utf-8"


def _read_capped(resp: httpx.Response, cap: int, deadline: float) -> tuple[bytes, bool, bool]:
    """Read at most `cap` body bytes; return (bytes, truncated, stopped_for_time)."""
    chunks: list[bytes] = []
    total = 0
    for chunk in resp.iter_bytes():
        room = cap - total
        if len(chunk) > room:
            # Stop reading here: leaving the stream context drops the rest unread.
            chunks.append(chunk[:room])
            return b"".join(chunks), True, False
        chunks.append(chunk)
        total += len(chunk)
        if time.monotonic() > deadline:
            return b"".join(chunks), False, True
    return b"".join(chunks), False, False


def _format_response(resp: httpx.Response, raw: bytes, verb: str, truncated: bool,
                     out_of_time: bool, cap: int, timeout_s: float) -> str:
    lines = [f"{resp.http_version} {resp.status_code} {resp.reason_phrase}".strip()]
    if resp.history:
        hops = len(resp.history)
        lines.append(f"final-url: {resp.url} (after {hops} redirect{'s' if hops > 1 else ''})")
    lines += [f"{name}: {resp.headers[name]}" for name in _SHOWN_HEADERS if name in resp.headers]
    if truncated:
        lines.append(f"note: body truncated at {cap} bytes (size cap); only the beginning is shown.")
    if out_of_time:
        budget = timeout_s * _TOTAL_BUDGET_FACTOR
        lines.append(f"note: body incomplete - stopped reading after {budget:g}s "
                     f"({len(raw)} bytes received).")
    if resp.status_code >= 400:
        lines.append("note: the server answered with an error status; the body may say why.")

    content_type = resp.headers.get("content-type", "").lower()
    # Servers that omit content-type still often send HTML; sniff the start in that case.
    sniffed = raw.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html"))
    is_html = "html" in content_type or (not content_type and sniffed)
    if verb == "HEAD":
        text = "(no body: HEAD request)"
    elif not raw:
        text = "(empty body)"
    elif _is_binary(content_type, raw):
        text = f"(binary body of {len(raw)}{'+' if truncated else ''} bytes not shown)"
    else:
        text = raw.decode(_pick_charset(resp, raw, is_html), errors="replace")
        if is_html:
            text = html_to_text(text) or "(HTML page with no readable text)"
            lines.append("note: HTML converted to plain text.")
        if truncated:
            text += f"\n[... truncated at {cap} bytes]"
    return "\n".join(lines) + "\n\n" + text


def build_tools(*, http_timeout_s: float = 20.0, http_max_bytes: int = 200_000) -> list[BaseTool]:
    """Return every Python tool au gives the agent (filesystem/shell tools come from deepagents)."""
    return [make_http_request_tool(timeout_s=http_timeout_s, max_response_bytes=http_max_bytes)]

"""Benchmarks of au against the scripted LLM server: `python bench/run.py` prints a table (not run in CI)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from langchain_core.messages import HumanMessage  # noqa: E402
from langchain_core.messages.utils import count_tokens_approximately  # noqa: E402

from tests.llm_server import Response, ScriptedLLM  # noqa: E402
from tests.live import start_server  # noqa: E402

TOKEN = "bench-token-0123456789"
KEY = "sk-bench-0123456789"
USER_TEXT = "Here is another thing I want you to keep in mind for later, with a few details about it. " * 2
REPLY_TEXT = "Understood. I have noted that, together with the details you gave, and will keep it in mind. " * 3
SUMMARY_MARK = "You keep the memory"


def prompt_tokens(body: dict[str, Any]) -> int:
    """Approximate tokens of one chat request: messages plus tool schemas."""
    messages = [(m["role"], json.dumps(m.get("content"))) for m in body["messages"]]
    return count_tokens_approximately(messages) + len(json.dumps(body.get("tools", []))) // 4


class Server:
    """`python run.py` in a temporary folder, pointed at the scripted LLM."""

    def __init__(self, llm: ScriptedLLM, folder: Path) -> None:
        started = time.monotonic()
        self.live = start_server(folder, llm.url, env={"DEEPSEEK_API_KEY": KEY, "AU_API_TOKENS": TOKEN})
        self.startup_s = time.monotonic() - started
        self.url = self.live.url
        self.process = self.live.process

    def chat(self, thread_id: str, message: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/au/api/threads/{thread_id}/chat",
            data=json.dumps({"message": message}).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)

    def peak_rss_mib(self) -> float:
        """Peak resident memory of the server's processes (gunicorn master and workers), summed."""
        pids = [self.process.pid] + _children(self.process.pid)
        total_kib = 0
        for pid in pids:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total_kib += int(line.split()[1])
        return total_kib / 1024

    def stop(self) -> None:
        self.live.stop()


def _children(pid: int) -> list[int]:
    found = []
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = path.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(path.parent.name))
    return found


def median_time(fn: Callable[[], Any], runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bare_agent_latency(llm: ScriptedLLM, runs: int) -> float:
    """A bare create_deep_agent invoke on the same model, tools and message, in-process."""
    from deepagents import create_deep_agent

    from app.config import DEFAULT_SYSTEM_PROMPT
    from app.llm import ChatDeepSeekWithReasoning
    from app.tools import build_tools

    model = ChatDeepSeekWithReasoning(model="deepseek-chat", api_key=KEY, api_base=llm.url, max_retries=0)
    agent = create_deep_agent(model=model, tools=build_tools(), system_prompt=DEFAULT_SYSTEM_PROMPT)
    return median_time(lambda: agent.invoke({"messages": [HumanMessage(content=USER_TEXT)]}), runs)


def long_thread(server: Server, llm: ScriptedLLM, turns: int, marks: list[int]) -> tuple[dict[int, int], float]:
    """Prompt tokens at the marked turns and model calls per turn over one long thread."""
    sizes: dict[int, int] = {}
    calls_before = len(llm.chat_requests())
    for turn in range(1, turns + 1):
        server.chat("long", f"turn {turn}: {USER_TEXT}")
        if turn in marks:
            agent_calls = [b for b in llm.chat_requests() if SUMMARY_MARK not in json.dumps(b["messages"][-1])]
            sizes[turn] = prompt_tokens(agent_calls[-1])
    calls = len(llm.chat_requests()) - calls_before
    return sizes, calls / turns


def concurrent_turns(server: Server, llm: ScriptedLLM, count: int) -> float:
    """Seconds for `count` turns on different threads, each model call taking 1 s."""
    llm.default(Response(content="slow answer", delay=1.0))
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            server.chat(f"parallel-{index}", "hello")
        except BaseException as exc:  # noqa: BLE001 - collected and reported below
            errors.append(exc)

    workers = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    if errors:
        raise RuntimeError(f"{len(errors)} concurrent turns failed: {errors[0]!r}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=200, help="length of the long thread")
    parser.add_argument("--runs", type=int, default=30, help="timed runs for the latency medians")
    args = parser.parse_args()
    marks = [mark for mark in (10, 20, 50, 100, 200) if mark <= args.turns]

    with ScriptedLLM() as llm, tempfile.TemporaryDirectory() as tmp:
        def respond(body: dict[str, Any]) -> Response:
            if SUMMARY_MARK in json.dumps(body["messages"][-1]):
                return Response(content="- The user shares things to remember; each was acknowledged.")
            return Response(content=REPLY_TEXT)

        llm.default(respond)
        server = Server(llm, Path(tmp))
        try:
            http_s = median_time(lambda: server.chat("latency", USER_TEXT), args.runs)
            bare_s = bare_agent_latency(llm, args.runs)
            sizes, calls_per_turn = long_thread(server, llm, args.turns, marks)
            parallel_s = concurrent_turns(server, llm, 32)
            peak_mib = server.peak_rss_mib()
        finally:
            server.stop()

    rows = [
        ("start-up to healthy server", f"{server.startup_s:.2f} s", ""),
        ("median turn over HTTP", f"{http_s * 1000:.1f} ms", ""),
        ("median bare create_deep_agent invoke", f"{bare_s * 1000:.1f} ms", ""),
        ("turn overhead (HTTP / bare)", f"{http_s / bare_s:.2f}x", "target <= 1.5x"),
        *((f"prompt tokens at turn {t}", str(sizes[t]), "") for t in marks),
    ]
    if 20 in sizes and args.turns in sizes:
        rows.append((f"prompt growth (turn {args.turns} / turn 20)", f"{sizes[args.turns] / sizes[20]:.2f}x", "target <= 1.5x"))
    rows += [
        (f"model calls per turn over {args.turns} turns", f"{calls_per_turn:.3f}", "target <= 1.1"),
        ("32 concurrent 1-second turns", f"{parallel_s:.2f} s", "target < 3 s"),
        ("peak memory (server processes)", f"{peak_mib:.0f} MiB", ""),
    ]
    width = max(len(name) for name, _, _ in rows)
    print(f"{'measure'.ljust(width)}  {'value':>10}  note")
    for name, value, note in rows:
        print(f"{name.ljust(width)}  {value:>10}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

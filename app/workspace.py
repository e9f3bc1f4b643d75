"""The agent's file and shell backends: workspace, skills, and per-thread offloaded history and tool results."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from deepagents.backends import CompositeBackend, FilesystemBackend, LocalShellBackend
from deepagents.backends.protocol import BackendProtocol, ExecuteResponse
from langgraph.config import get_config

from app.config import ShellSettings

SKILLS_ROUTE = "/skills/"
HISTORY_ROUTE = "/conversation_history/"
LARGE_RESULTS_ROUTE = "/large_tool_results/"
# Enough for the usual tools (coreutils, python3, curl) and nothing that depends on the server's own PATH.
SHELL_PATH = "/usr/local/bin:/usr/bin:/bin"
TIMEOUT_EXIT_CODE = 124


def shell_environment(workspace: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The minimal environment shell commands run with: no secrets, a sane PATH, the server's locale and TZ."""
    source = os.environ if environ is None else environ
    env = {"PATH": SHELL_PATH, "HOME": str(workspace), "LANG": source.get("LANG", "C.UTF-8")}
    if source.get("TZ"):
        env["TZ"] = source["TZ"]
    return env


class ConfinedShellBackend(LocalShellBackend):
    """LocalShellBackend whose commands run in their own process group, killed whole on timeout.

    LocalShellBackend's timeout kills only the shell, so background children survive, and the
    command's own exit status can still read as success. Here the group is killed and the model
    gets an error result it can act on.
    """

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1, truncated=False)
        limit = timeout if timeout is not None and timeout > 0 else self._default_timeout
        process = subprocess.Popen(  # noqa: S602 - running the model's shell command is this backend's job
            command,
            shell=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=str(self.cwd),
            env=self._env,
            start_new_session=True,
        )
        output = _CappedReader(process, self._max_output_bytes)
        # The pipe closes when the command and every child still holding it are done.
        if not output.wait(limit):
            _kill_group(process)
            output.wait(5)
            message = f"Error: command timed out after {limit} s and was killed with all its child processes."
            return ExecuteResponse(output=message, exit_code=TIMEOUT_EXIT_CODE, truncated=False)
        return self._response(output.data, output.overflowed, process.wait())

    def _response(self, raw: bytes, truncated: bool, exit_code: int) -> ExecuteResponse:
        output = raw.decode("utf-8", errors="replace") or "<no output>"
        if truncated:
            output += f"\n\n... output truncated at {self._max_output_bytes} bytes."
        if exit_code != 0:
            output = f"{output.rstrip()}\n\nExit code: {exit_code}"
        return ExecuteResponse(output=output, exit_code=exit_code, truncated=truncated)


class _CappedReader:
    """Drains a process's output in a thread, keeping at most `cap` bytes.

    `communicate()` would hold everything a command prints in memory; `yes` for 30 s is gigabytes.
    """

    def __init__(self, process: subprocess.Popen[bytes], cap: int) -> None:
        self.data = b""
        self.overflowed = False
        self._cap = cap
        self._stream = process.stdout
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> bool:
        """Whether the output ended (the pipe closed) within `timeout` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _drain(self) -> None:
        kept = bytearray()
        assert self._stream is not None
        with self._stream:
            while chunk := self._stream.read1(65536):
                room = self._cap - len(kept)
                if len(chunk) > room:
                    self.overflowed = True
                kept += chunk[: max(room, 0)]
        self.data = bytes(kept)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


class ThreadFolderBackend(FilesystemBackend):
    """A FilesystemBackend rooted, on each call, at the folder of the thread the running agent serves.

    The thread id comes from the LangGraph run config (`configurable.thread_id`), so one backend
    built at start-up keeps every conversation's evicted history apart.
    """

    def __init__(self, folder_for: Callable[[str], Path]) -> None:
        self._folder_for = folder_for
        super().__init__(root_dir=None, virtual_mode=True)

    @property
    def cwd(self) -> Path:
        thread_id = get_config().get("configurable", {}).get("thread_id", "")
        return self._folder_for(thread_id).resolve()

    @cwd.setter
    def cwd(self, _value: Path) -> None:
        # FilesystemBackend.__init__ assigns a fixed root; the root here is per call.
        pass


def build_backend(shell: ShellSettings, *, skills_dir: Path, history_folder: Callable[[str], Path]) -> BackendProtocol:
    """The composite backend: workspace by default, skills and evicted history on their own routes."""
    shell.workspace.mkdir(parents=True, exist_ok=True)
    workspace: BackendProtocol
    if shell.enabled:
        workspace = ConfinedShellBackend(
            root_dir=shell.workspace,
            virtual_mode=True,
            timeout=shell.timeout_s,
            max_output_bytes=shell.max_output_bytes,
            env=shell_environment(shell.workspace),
            inherit_env=False,
        )
    else:
        # Without a sandbox-capable default backend deepagents offers no `execute` tool at all.
        workspace = FilesystemBackend(root_dir=shell.workspace, virtual_mode=True)
    return CompositeBackend(
        default=workspace,
        routes={
            SKILLS_ROUTE: FilesystemBackend(root_dir=skills_dir, virtual_mode=True),
            HISTORY_ROUTE: ThreadFolderBackend(history_folder),
            # Tool results too large for the prompt are offloaded here; they belong to one conversation.
            LARGE_RESULTS_ROUTE: ThreadFolderBackend(lambda thread_id: history_folder(thread_id) / "large_tool_results"),
        },
    )

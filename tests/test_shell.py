"""The confined shell (app/workspace.py): timeouts kill the whole process group, output cap, cwd, env, stdin."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.config import ShellSettings
from app.workspace import SHELL_PATH, TIMEOUT_EXIT_CODE, ConfinedShellBackend, build_backend
from tests.conftest import Api
from tests.llm_server import ScriptedLLM

SECRET_KEY = "sk-shell-secret-0123456789"
SECRET_TOKENS = "shell-token-a,shell-token-b"


def tool_results(request: dict) -> list[str]:
    """Contents of the tool messages the model was sent in one request."""
    return [str(m["content"]) for m in request["messages"] if m["role"] == "tool"]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


@pytest.fixture
def make_shell(workspace: Path, tmp_path: Path) -> Callable[..., ConfinedShellBackend]:
    """The workspace backend exactly as the app builds it (build_backend), from shell settings."""

    def build(timeout_s: int = 10, max_output_bytes: int = 50_000) -> ConfinedShellBackend:
        settings = ShellSettings(workspace=workspace, timeout_s=timeout_s, max_output_bytes=max_output_bytes)
        skills = tmp_path / "skills"
        skills.mkdir(exist_ok=True)
        composite = build_backend(settings, skills_dir=skills, history_folder=lambda _thread_id: tmp_path / "history")
        shell = composite.default
        assert isinstance(shell, ConfinedShellBackend)
        return shell

    return build


@pytest.fixture
def shell(make_shell: Callable[..., ConfinedShellBackend]) -> ConfinedShellBackend:
    return make_shell()


def is_gone(pid: int) -> bool:
    """Whether the process no longer runs: no such pid, or a zombie nobody has reaped yet.

    An orphaned child is re-parented to PID 1, which in a container may never reap it, so a
    killed child can linger as a zombie; it runs nothing any more.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except FileNotFoundError:
        return True
    state = stat.rsplit(")", 1)[1].split()[0]
    return state in {"Z", "X"}


def wait_until_gone(pid: int, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if is_gone(pid):
            return True
        time.sleep(0.05)
    return is_gone(pid)


# --- timeouts ---------------------------------------------------------------------------------------


def test_timeout_kills_background_children_too(shell: ConfinedShellBackend, workspace: Path) -> None:
    started = time.monotonic()

    result = shell.execute("sleep 30 & echo $! > bg.pid; echo started; wait", timeout=1)

    elapsed = time.monotonic() - started
    pid = int((workspace / "bg.pid").read_text(encoding="ascii"))
    try:
        assert result.exit_code == TIMEOUT_EXIT_CODE
        assert "timed out" in result.output
        # The background sleep holds the output pipe: without the group kill this would take 30 s.
        assert elapsed < 10, f"execute returned after {elapsed:.1f} s although the command sleeps 30"
        assert wait_until_gone(pid), f"background child {pid} survived the timeout"
    finally:
        if not is_gone(pid):
            os.kill(pid, 9)


def test_plain_timeout_reports_exit_code_124_and_says_timed_out(shell: ConfinedShellBackend) -> None:
    started = time.monotonic()

    result = shell.execute("sleep 5", timeout=1)

    assert result.exit_code == TIMEOUT_EXIT_CODE == 124
    assert "timed out" in result.output
    assert time.monotonic() - started < 4.5, "the command was not stopped at its timeout"


def test_default_timeout_comes_from_the_settings(make_shell: Callable[..., ConfinedShellBackend]) -> None:
    shell = make_shell(timeout_s=1)

    result = shell.execute("sleep 5")

    assert result.exit_code == TIMEOUT_EXIT_CODE
    assert "timed out after 1 s" in result.output


# --- results ----------------------------------------------------------------------------------------


def test_output_over_the_limit_is_cut_and_says_so(make_shell: Callable[..., ConfinedShellBackend]) -> None:
    shell = make_shell(max_output_bytes=1000)

    result = shell.execute("head -c 5000 /dev/zero | tr '\\0' x")

    assert result.truncated is True
    assert result.exit_code == 0
    assert result.output.count("x") == 1000
    assert "truncated at 1000 bytes" in result.output


def test_output_under_the_limit_is_whole_and_not_flagged(make_shell: Callable[..., ConfinedShellBackend]) -> None:
    shell = make_shell(max_output_bytes=1000)

    result = shell.execute("head -c 999 /dev/zero | tr '\\0' x")

    assert result.truncated is False
    assert result.output == "x" * 999


def test_non_zero_exit_code_is_reported(shell: ConfinedShellBackend) -> None:
    result = shell.execute("echo oops; exit 3")

    assert result.exit_code == 3
    assert "oops" in result.output
    assert result.output.rstrip().endswith("Exit code: 3")


def test_stdout_and_stderr_both_reach_the_model(shell: ConfinedShellBackend) -> None:
    result = shell.execute("echo to-out; echo to-err >&2")

    assert "to-out" in result.output and "to-err" in result.output


# --- working directory, environment, stdin ----------------------------------------------------------


def test_commands_run_in_the_workspace(shell: ConfinedShellBackend, workspace: Path) -> None:
    result = shell.execute("pwd")

    assert result.exit_code == 0
    assert Path(result.output.strip()).resolve() == workspace.resolve()


def test_cd_in_one_command_does_not_move_the_next(shell: ConfinedShellBackend, workspace: Path) -> None:
    moved = shell.execute("cd /tmp; pwd")
    after = shell.execute("pwd")

    assert moved.output.strip() == "/tmp"
    assert Path(after.output.strip()).resolve() == workspace.resolve()


def environment(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def test_environment_is_minimal_and_holds_no_secrets(
    make_shell: Callable[..., ConfinedShellBackend], workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", SECRET_KEY)
    monkeypatch.setenv("AU_API_TOKENS", SECRET_TOKENS)
    monkeypatch.setenv("PATH", "/opt/server-only/bin:" + os.environ.get("PATH", ""))
    monkeypatch.delenv("TZ", raising=False)
    shell = make_shell()

    result = shell.execute("env")

    env = environment(result.output)
    assert env["PATH"] == SHELL_PATH == "/usr/local/bin:/usr/bin:/bin"
    assert env["HOME"] == str(workspace)
    assert "TZ" not in env
    assert "DEEPSEEK_API_KEY" not in env and "AU_API_TOKENS" not in env
    assert SECRET_KEY not in result.output
    assert "shell-token-a" not in result.output
    # Only what shell_environment sets, plus what the shell itself adds.
    assert set(env) <= {"PATH", "HOME", "LANG", "PWD", "OLDPWD", "SHLVL", "_"}


def test_tz_is_passed_through_when_set(
    make_shell: Callable[..., ConfinedShellBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Europe/Berlin")
    shell = make_shell()

    result = shell.execute("env")

    assert environment(result.output)["TZ"] == "Europe/Berlin"


@pytest.fixture
def stdin_never_closes() -> Iterator[None]:
    """Make this process's fd 0 a pipe nobody writes to or closes, so an inherited stdin would block `cat`."""
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        yield
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)


@pytest.mark.usefixtures("stdin_never_closes")
def test_stdin_is_closed_so_cat_returns_at_once(shell: ConfinedShellBackend) -> None:
    result = shell.execute("cat", timeout=3)

    assert result.exit_code == 0, result.output
    assert "timed out" not in result.output


# --- through the agent ------------------------------------------------------------------------------


def test_timed_out_command_goes_back_to_the_model_and_the_turn_succeeds(make_api, llm: ScriptedLLM) -> None:
    api: Api = make_api(config={"shell": {"timeout_s": 1}})
    llm.reply("", tool_calls=[("execute", {"command": "sleep 5"})])
    llm.reply("That command took too long.")

    response = api.chat("t1", "run sleep 5")

    assert response.status_code == 200, response.get_json()
    assert response.get_json()["reply"] == "That command took too long."
    results = tool_results(llm.chat_requests()[1])
    assert len(results) == 1
    assert "timed out" in results[0]
    assert "124" in results[0]
    assert [m["role"] for m in api.store.load("t1")["messages"]] == ["user", "assistant"]


def test_huge_output_is_not_held_in_memory(make_shell: Callable[..., ConfinedShellBackend]) -> None:
    import resource

    shell = make_shell(max_output_bytes=1000)
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = shell.execute("head -c 300000000 /dev/zero")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib) / 1024
    assert result.exit_code == 0 and result.truncated
    assert grown_mib < 100, f"the server grew by {grown_mib:.0f} MiB reading 300 MB of output"

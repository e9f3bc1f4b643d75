"""Tests for app/config.py: load_settings from config.yaml, .env and the environment (design.md, Configuration)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import ENV_OVERRIDES, Settings, load_settings
from app.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
SHIPPED_CONFIG = REPO / "config.yaml"


def write_config(folder: Path, sections: dict[str, Any] | None = None, name: str = "config.yaml") -> Path:
    """A config file holding `sections` (YAML), in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(sections or {}), encoding="utf-8")
    return path


def load(path: Path, env: dict[str, str] | None = None, dotenv: Path | None = None) -> Settings:
    """load_settings isolated from the developer's environment and .env."""
    return load_settings(path, environ=env or {}, dotenv_path=dotenv)


# --- the shipped config.yaml --------------------------------------------------------------------------


def test_shipped_config_loads_with_the_design_defaults_in_an_empty_environment(tmp_path: Path) -> None:
    settings = load(SHIPPED_CONFIG, dotenv=tmp_path / "no.env")

    assert settings.server.host == "127.0.0.1"
    assert settings.server.port == 5000
    assert settings.llm.provider == "deepseek"
    assert settings.llm.model == "deepseek-chat"
    assert settings.llm.base_url.startswith("https://")
    assert settings.llm.temperature == 0.3
    assert settings.llm.timeout_s == 60
    assert settings.llm.max_retries == 2
    assert settings.llm.api_key is None
    assert settings.api_tokens == ()
    assert settings.secrets == []
    assert settings.agent.system_prompt.strip()
    assert settings.agent.max_steps >= 1
    assert settings.agent.skills_dir == REPO / "skills"
    assert settings.history.data_dir == REPO / "data"
    assert settings.shell.workspace == REPO / "workspace"


def test_relative_paths_resolve_against_the_config_files_folder_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "etc" / "au"
    folder.mkdir(parents=True)
    shutil.copy(SHIPPED_CONFIG, folder / "config.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    settings = load(folder / "config.yaml")

    assert settings.agent.skills_dir == folder / "skills"
    assert settings.history.data_dir == folder / "data"
    assert settings.shell.workspace == folder / "workspace"
    for path in (settings.agent.skills_dir, settings.history.data_dir, settings.shell.workspace):
        assert path.is_absolute()


def test_empty_config_file_gives_the_built_in_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("", encoding="utf-8")

    settings = load(path)

    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 5000)
    assert (settings.llm.provider, settings.llm.model) == ("deepseek", "deepseek-chat")
    assert settings.history.data_dir == tmp_path / "data"


# --- environment overrides ----------------------------------------------------------------------------

# One valid value per ENV_OVERRIDES entry (raw string, expected parsed value); each differs from config.yaml.
ENV_VALUES: dict[str, tuple[str, Any]] = {
    "AU_HOST": ("localhost", "localhost"),
    "AU_PORT": ("8123", 8123),
    "AU_WORKERS": ("3", 3),
    "AU_THREADS": ("16", 16),
    "AU_MAX_BODY_BYTES": ("4096", 4096),
    "AU_MAX_MESSAGE_CHARS": ("500", 500),
    "AU_LLM_PROVIDER": ("ollama", "ollama"),
    "AU_LLM_MODEL": ("deepseek-reasoner", "deepseek-reasoner"),
    "AU_LLM_TEMPERATURE": ("1.5", 1.5),
    "AU_LLM_TIMEOUT_S": ("12.5", 12.5),
    "AU_LLM_MAX_RETRIES": ("5", 5),
    "AU_LLM_CONTEXT_WINDOW": ("16384", 16384),
    "AU_SYSTEM_PROMPT": ("Answer in one word.", "Answer in one word."),
    "AU_SKILLS_DIR": ("/srv/au/skills", Path("/srv/au/skills")),
    "AU_MAX_STEPS": ("7", 7),
    "AU_SUMMARY_TRIGGER_TOKENS": ("5000", 5000),
    "AU_SUMMARY_KEEP_MESSAGES": ("4", 4),
    "AU_SUMMARY_TRIM_TOKENS": ("800", 800),
    "AU_DATA_DIR": ("/srv/au/data", Path("/srv/au/data")),
    "AU_HISTORY_SUMMARY_TRIGGER_TOKENS": ("9000", 9000),
    "AU_HISTORY_KEEP_RECENT_TOKENS": ("2500", 2500),
    "AU_SHELL_ENABLED": ("false", False),
    "AU_WORKSPACE": ("/srv/au/workspace", Path("/srv/au/workspace")),
    "AU_SHELL_TIMEOUT_S": ("90", 90),
}


def test_every_env_override_has_a_test_value() -> None:
    assert set(ENV_VALUES) == set(ENV_OVERRIDES)


@pytest.mark.parametrize("name", sorted(ENV_OVERRIDES))
def test_env_variable_overrides_its_config_key(name: str) -> None:
    section, key = ENV_OVERRIDES[name]
    raw, expected = ENV_VALUES[name]
    baseline = getattr(getattr(load(SHIPPED_CONFIG), section), key)
    assert baseline != expected, "the test value must differ from config.yaml"

    settings = load(SHIPPED_CONFIG, {name: raw})

    assert getattr(getattr(settings, section), key) == expected


def test_invalid_env_value_names_the_key_and_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load(SHIPPED_CONFIG, {"AU_PORT": "abc"})
    assert "server.port" in str(info.value)
    assert "AU_PORT" in str(info.value)


def test_deepseek_api_base_sets_base_url_for_deepseek(tmp_path: Path) -> None:
    settings = load(SHIPPED_CONFIG, {"DEEPSEEK_API_BASE": "http://proxy.local:8080/v1/"})
    assert settings.llm.base_url == "http://proxy.local:8080/v1"


def test_deepseek_api_base_is_ignored_for_ollama(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"llm": {"provider": "ollama"}})
    settings = load(path, {"DEEPSEEK_API_BASE": "http://proxy.local:8080/v1"})
    assert settings.llm.base_url == "http://127.0.0.1:11434"


def test_ollama_host_sets_base_url_for_ollama(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"llm": {"provider": "ollama"}})
    settings = load(path, {"OLLAMA_HOST": "https://gpu.local:11434"})
    assert settings.llm.base_url == "https://gpu.local:11434"


def test_ollama_host_without_scheme_gets_http(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"llm": {"provider": "ollama"}})
    settings = load(path, {"OLLAMA_HOST": "gpu.local:11434"})
    assert settings.llm.base_url == "http://gpu.local:11434"


def test_ollama_host_applies_when_the_provider_comes_from_the_environment() -> None:
    settings = load(SHIPPED_CONFIG, {"AU_LLM_PROVIDER": "ollama", "OLLAMA_HOST": "10.0.0.5:11434"})
    assert settings.llm.provider == "ollama"
    assert settings.llm.base_url == "http://10.0.0.5:11434"


def test_ollama_host_is_ignored_for_deepseek() -> None:
    default = load(SHIPPED_CONFIG).llm.base_url
    settings = load(SHIPPED_CONFIG, {"OLLAMA_HOST": "gpu.local:11434"})
    assert settings.llm.base_url == default
    assert "gpu.local" not in settings.llm.base_url


def test_provider_ollama_defaults_model_and_base_url(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"llm": {"provider": "ollama"}})
    settings = load(path)
    assert settings.llm.model == "qwen3"
    assert settings.llm.base_url == "http://127.0.0.1:11434"


def test_explicit_model_and_base_url_win_over_provider_defaults(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"llm": {"provider": "ollama", "model": "llama3.2", "base_url": "http://box:1/"}})
    settings = load(path)
    assert settings.llm.model == "llama3.2"
    assert settings.llm.base_url == "http://box:1"


# --- .env -------------------------------------------------------------------------------------------


def test_dotenv_values_are_read(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("AU_PORT=6001\nDEEPSEEK_API_KEY=sk-from-dotenv\nAU_API_TOKENS=tok-dotenv\n", encoding="utf-8")

    settings = load(SHIPPED_CONFIG, {}, dotenv)

    assert settings.server.port == 6001
    assert settings.llm.api_key is not None
    assert settings.llm.api_key.get_secret_value() == "sk-from-dotenv"
    assert [t.get_secret_value() for t in settings.api_tokens] == ["tok-dotenv"]


def test_real_environment_wins_over_dotenv(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("AU_PORT=6001\nDEEPSEEK_API_KEY=sk-from-dotenv\n", encoding="utf-8")

    settings = load(SHIPPED_CONFIG, {"AU_PORT": "7002", "DEEPSEEK_API_KEY": "sk-from-env"}, dotenv)

    assert settings.server.port == 7002
    assert settings.llm.api_key is not None
    assert settings.llm.api_key.get_secret_value() == "sk-from-env"


def test_missing_dotenv_file_is_not_an_error(tmp_path: Path) -> None:
    settings = load(SHIPPED_CONFIG, {}, tmp_path / "absent.env")
    assert settings.server.port == 5000


# --- secrets ----------------------------------------------------------------------------------------


def test_api_tokens_are_split_on_commas_with_blanks_dropped() -> None:
    settings = load(SHIPPED_CONFIG, {"AU_API_TOKENS": " tok-a , ,tok-b,,tok-c ,"})
    assert [t.get_secret_value() for t in settings.api_tokens] == ["tok-a", "tok-b", "tok-c"]


def test_deepseek_api_key_lands_in_llm_api_key() -> None:
    settings = load(SHIPPED_CONFIG, {"DEEPSEEK_API_KEY": "sk-secret-123"})
    assert settings.llm.api_key is not None
    assert settings.llm.api_key.get_secret_value() == "sk-secret-123"


def test_settings_secrets_lists_tokens_and_api_key() -> None:
    settings = load(SHIPPED_CONFIG, {"AU_API_TOKENS": "tok-a,tok-b", "DEEPSEEK_API_KEY": "sk-secret-123"})
    assert sorted(settings.secrets) == ["sk-secret-123", "tok-a", "tok-b"]


def test_secrets_do_not_appear_in_the_settings_repr() -> None:
    settings = load(SHIPPED_CONFIG, {"AU_API_TOKENS": "tok-a-visible", "DEEPSEEK_API_KEY": "sk-secret-123"})
    text = repr(settings) + str(settings)
    assert "tok-a-visible" not in text
    assert "sk-secret-123" not in text


def test_api_key_in_the_config_file_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"llm": {"provider": "deepseek", "api_key": "sk-in-the-file"}})
    with pytest.raises(ConfigError) as info:
        load(path, {"DEEPSEEK_API_KEY": "sk-from-env"})
    message = str(info.value)
    assert "llm.api_key" in message
    assert "DEEPSEEK_API_KEY" in message
    assert "sk-in-the-file" not in message


# --- bad values -------------------------------------------------------------------------------------

BAD_CONFIGS = [
    pytest.param("server:\n  port: 0\n", "server.port", id="port-0"),
    pytest.param("server:\n  port: abc\n", "server.port", id="port-abc"),
    pytest.param("server:\n  port: 70000\n", "server.port", id="port-70000"),
    pytest.param("llm:\n  provider: openai\n", "llm.provider", id="provider-openai"),
    pytest.param("llm:\n  temperature: 5\n", "llm.temperature", id="temperature-5"),
    pytest.param("llm:\n  timeout_s: 0\n", "llm.timeout_s", id="llm-timeout-0"),
    pytest.param("shell:\n  timeout_s: 0\n", "shell.timeout_s", id="shell-timeout-0"),
    pytest.param("agent:\n  max_steps: 0\n", "agent.max_steps", id="max-steps-0"),
    pytest.param("llm:\n  modle: deepseek-chat\n", "llm.modle", id="unknown-key"),
    pytest.param("servre:\n  port: 5000\n", "servre", id="unknown-section"),
    pytest.param("llm:\n  base_url: ftp://x\n", "llm.base_url", id="base-url-ftp"),
    pytest.param("server:\n  - port\n  - 5000\n", "server", id="section-is-a-list"),
]


@pytest.mark.parametrize(("text", "key"), BAD_CONFIGS)
def test_bad_value_raises_config_error_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert key in str(info.value)


def test_invalid_yaml_raises_config_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("server:\n  port: [5000\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert "broken.yaml" in str(info.value)
    assert "YAML" in str(info.value)


def test_top_level_that_is_not_a_mapping_raises_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("- server\n- llm\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        load(path)


def test_missing_config_file_raises_config_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError) as info:
        load(path)
    assert "nowhere.yaml" in str(info.value)


# --- listening off loopback -------------------------------------------------------------------------


def test_non_loopback_host_without_tokens_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"server": {"host": "0.0.0.0"}})
    with pytest.raises(ConfigError) as info:
        load(path)
    assert "AU_API_TOKENS" in str(info.value)
    assert "server.host" in str(info.value)


def test_non_loopback_host_from_env_without_tokens_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load(SHIPPED_CONFIG, {"AU_HOST": "192.168.1.10"})
    assert "AU_API_TOKENS" in str(info.value)


def test_non_loopback_host_with_tokens_loads(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"server": {"host": "0.0.0.0"}})
    settings = load(path, {"AU_API_TOKENS": "tok-a"})
    assert settings.server.host == "0.0.0.0"


def test_blank_tokens_do_not_count_as_tokens(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"server": {"host": "0.0.0.0"}})
    with pytest.raises(ConfigError, match="AU_API_TOKENS"):
        load(path, {"AU_API_TOKENS": " , ,"})


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_host_needs_no_tokens(tmp_path: Path, host: str) -> None:
    path = write_config(tmp_path, {"server": {"host": host}})
    settings = load(path)
    assert settings.server.host == host
    assert settings.api_tokens == ()


# --- run.py -----------------------------------------------------------------------------------------


def test_run_py_with_bad_config_exits_2_with_one_line_naming_the_key(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"llm": {"modle": "deepseek-chat"}})
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("AU_") and name not in {"DEEPSEEK_API_KEY", "DEEPSEEK_API_BASE", "OLLAMA_HOST"}
    }

    result = subprocess.run(
        [sys.executable, "run.py", "--config", str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("au: ")
    assert "llm.modle" in lines[0]
    assert "Traceback" not in result.stderr

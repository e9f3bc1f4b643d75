"""One validated settings object from config.yaml, .env and the environment, built at start-up."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from dotenv import dotenv_values
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from app.errors import ConfigError

DEFAULT_CONFIG_PATH = "config.yaml"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5000
DEFAULT_MODELS = {"deepseek": "deepseek-chat", "ollama": "qwen3"}
DEFAULT_BASE_URLS = {"deepseek": "https://api.deepseek.com/v1", "ollama": "http://127.0.0.1:11434"}
DEFAULT_SYSTEM_PROMPT = (
    "You are au, a concise and helpful personal assistant. "
    "Use your skills and tools to find facts (such as the current time) instead of guessing, "
    "and say plainly when you cannot do something."
)
# The trigger counts the tool schemas too (~3,500 tokens on their own): a trigger near that
# would summarise on nearly every turn. 24k leaves ~20k tokens of real conversation and tool
# output before an extra model call is spent, and still fits every supported model's window.
DEFAULT_TRIGGER_TOKENS = 24_000
DEFAULT_KEEP_MESSAGES = 20
DEFAULT_TRIM_TOKENS = 4_000
# Across turns (app/memory.py): the unsummarised tail of a thread is folded into its stored summary
# once it passes 4,000 tokens, keeping the last 1,500 verbatim; a prompt then stays within roughly
# schemas + summary + 4,000 tokens however long the thread grows, at one extra call per ~20 turns.
DEFAULT_SUMMARY_TRIGGER_TOKENS = 4_000
DEFAULT_KEEP_RECENT_TOKENS = 1_500

# Environment variables that override a config key (README lists them all).
ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "AU_HOST": ("server", "host"),
    "AU_PORT": ("server", "port"),
    "AU_WORKERS": ("server", "workers"),
    "AU_THREADS": ("server", "threads"),
    "AU_MAX_BODY_BYTES": ("server", "max_body_bytes"),
    "AU_MAX_MESSAGE_CHARS": ("server", "max_message_chars"),
    "AU_LLM_PROVIDER": ("llm", "provider"),
    "AU_LLM_MODEL": ("llm", "model"),
    "AU_LLM_TEMPERATURE": ("llm", "temperature"),
    "AU_LLM_TIMEOUT_S": ("llm", "timeout_s"),
    "AU_LLM_MAX_RETRIES": ("llm", "max_retries"),
    "AU_LLM_CONTEXT_WINDOW": ("llm", "context_window"),
    "AU_SYSTEM_PROMPT": ("agent", "system_prompt"),
    "AU_SKILLS_DIR": ("agent", "skills_dir"),
    "AU_MAX_STEPS": ("agent", "max_steps"),
    "AU_SUMMARY_TRIGGER_TOKENS": ("summarization", "trigger_tokens"),
    "AU_SUMMARY_KEEP_MESSAGES": ("summarization", "keep_messages"),
    "AU_SUMMARY_TRIM_TOKENS": ("summarization", "trim_tokens"),
    "AU_DATA_DIR": ("history", "data_dir"),
    "AU_HISTORY_SUMMARY_TRIGGER_TOKENS": ("history", "summary_trigger_tokens"),
    "AU_HISTORY_KEEP_RECENT_TOKENS": ("history", "keep_recent_tokens"),
    "AU_SHELL_ENABLED": ("shell", "enabled"),
    "AU_WORKSPACE": ("shell", "workspace"),
    "AU_SHELL_TIMEOUT_S": ("shell", "timeout_s"),
}
# The provider libraries' own variables for their base URL keep working.
BASE_URL_ENV = {"deepseek": "DEEPSEEK_API_BASE", "ollama": "OLLAMA_HOST"}


class _Section(BaseModel):
    # A misspelt key is an error, not a silently ignored default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_PORT, ge=1, le=65535)
    workers: int = Field(1, ge=1, le=64)
    threads: int = Field(32, ge=1, le=256)
    max_body_bytes: int = Field(256 * 1024, ge=1024)
    max_message_chars: int = Field(32_000, ge=1)


class LlmSettings(_Section):
    provider: Literal["deepseek", "ollama"] = "deepseek"
    model: str = ""
    base_url: str = ""
    temperature: float = Field(0.3, ge=0, le=2)
    timeout_s: float = Field(60, gt=0)
    max_retries: int = Field(2, ge=0, le=10)
    context_window: int = Field(0, ge=0)  # 0: DeepSeek's documented window, or what Ollama reports
    api_key: SecretStr | None = None

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


class AgentSettings(_Section):
    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, min_length=1)
    skills_dir: Path = Path("skills")
    max_steps: int = Field(25, ge=1, le=500)


class SummarizationSettings(_Section):
    trigger_tokens: int = Field(DEFAULT_TRIGGER_TOKENS, ge=1000)
    keep_messages: int = Field(DEFAULT_KEEP_MESSAGES, ge=1)
    trim_tokens: int = Field(DEFAULT_TRIM_TOKENS, ge=100)


class HistorySettings(_Section):
    data_dir: Path = Path("data")
    summary_trigger_tokens: int = Field(DEFAULT_SUMMARY_TRIGGER_TOKENS, ge=500)
    keep_recent_tokens: int = Field(DEFAULT_KEEP_RECENT_TOKENS, ge=100)


class ShellSettings(_Section):
    enabled: bool = True
    workspace: Path = Path("workspace")
    timeout_s: int = Field(30, ge=1, le=3600)
    max_output_bytes: int = Field(50_000, ge=1000)


class Settings(_Section):
    """Everything au reads from its configuration, validated."""

    server: ServerSettings = ServerSettings()
    llm: LlmSettings = LlmSettings()
    agent: AgentSettings = AgentSettings()
    summarization: SummarizationSettings = SummarizationSettings()
    history: HistorySettings = HistorySettings()
    shell: ShellSettings = ShellSettings()
    api_tokens: tuple[SecretStr, ...] = ()

    @model_validator(mode="after")
    def _tokens_off_loopback(self) -> Settings:
        if not self.api_tokens and not is_loopback(self.server.host):
            raise ValueError(
                f"server.host is {self.server.host!r}, reachable from other machines, and AU_API_TOKENS is empty; "
                "set AU_API_TOKENS or listen on 127.0.0.1"
            )
        return self

    @property
    def secrets(self) -> list[str]:
        """Every secret value, so the trace and logs can mask them."""
        values = [token.get_secret_value() for token in self.api_tokens]
        if self.llm.api_key:
            values.append(self.llm.api_key.get_secret_value())
        return values


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_settings(
    config_path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike[str] | None = ".env",
) -> Settings:
    """Read config.yaml (or AU_CONFIG), then .env, then the environment; raise ConfigError naming a bad key."""
    env = {**_read_dotenv(dotenv_path), **(os.environ if environ is None else environ)}
    path = Path(config_path or env.get("AU_CONFIG") or DEFAULT_CONFIG_PATH)
    raw = _read_yaml(path)
    _apply_env(raw, env)
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    return _resolve(settings, base=path.parent)


def _read_dotenv(path: str | os.PathLike[str] | None) -> dict[str, str]:
    if path is None or not Path(path).is_file():
        return {}
    return {key: value for key, value in dotenv_values(path).items() if value is not None}


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} not found (set AU_CONFIG or pass --config)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (server, llm, ...)")
    for section, value in data.items():
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{path}: '{section}' must be a mapping of keys")
    return {section: dict(value or {}) for section, value in data.items()}


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    for name, (section, key) in ENV_OVERRIDES.items():
        if env.get(name):
            raw.setdefault(section, {})[key] = env[name]
    llm = raw.setdefault("llm", {})
    provider = str(llm.get("provider") or "deepseek")
    base_env = BASE_URL_ENV.get(provider)
    if base_env and env.get(base_env):
        url = env[base_env]
        # OLLAMA_HOST is often given without a scheme, as the ollama CLI accepts it.
        llm["base_url"] = url if "://" in url else f"http://{url}"
    if "api_key" in llm:
        raise ConfigError("llm.api_key must not be in the config file; set DEEPSEEK_API_KEY in the environment or .env")
    if env.get("DEEPSEEK_API_KEY"):
        llm["api_key"] = env["DEEPSEEK_API_KEY"]
    tokens = [token.strip() for token in env.get("AU_API_TOKENS", "").split(",") if token.strip()]
    raw["api_tokens"] = tokens


def _describe(exc: ValidationError, path: Path) -> str:
    first = exc.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "server.host"
    env_names = [name for name, target in ENV_OVERRIDES.items() if ".".join(target) == key]
    origin = f" (or {env_names[0]})" if env_names else ""
    return f"invalid config key '{key}' in {path}{origin}: {first['msg'].removeprefix('Value error, ')}"


def _resolve(settings: Settings, *, base: Path) -> Settings:
    """Fill provider defaults and make relative paths relative to the config file's folder."""
    provider = settings.llm.provider

    def absolute(path: Path) -> Path:
        return path if path.is_absolute() else (base / path).resolve()

    return settings.model_copy(
        update={
            "llm": settings.llm.model_copy(
                update={
                    "model": settings.llm.model or DEFAULT_MODELS[provider],
                    "base_url": settings.llm.base_url or DEFAULT_BASE_URLS[provider],
                }
            ),
            "agent": settings.agent.model_copy(update={"skills_dir": absolute(settings.agent.skills_dir)}),
            "history": settings.history.model_copy(update={"data_dir": absolute(settings.history.data_dir)}),
            "shell": settings.shell.model_copy(update={"workspace": absolute(settings.shell.workspace)}),
        }
    )

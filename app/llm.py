"""Chat model factory (deepseek | ollama) and the translation of provider failures into au's errors."""

from __future__ import annotations

from typing import Any

import httpx
import ollama
import openai
from langchain_core.exceptions import (
    ContextOverflowError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelError,
    ModelNotFoundError,
    ModelPermissionDeniedError,
    ModelRateLimitError,
    ModelTimeoutError,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage
from langchain_deepseek import ChatDeepSeek
from langchain_ollama import ChatOllama

from app.config import LlmSettings
from app.errors import AuError, LlmError, LlmNotConfigured, LlmTimeout, LlmUnavailable


class ChatDeepSeekWithReasoning(ChatDeepSeek):
    """ChatDeepSeek that sends each assistant message's `reasoning_content` back to the API.

    In thinking mode (deepseek-reasoner) DeepSeek answers HTTP 400 when an assistant message with
    tool calls comes back without its reasoning; langchain-deepseek drops that field when it builds
    the request, which breaks every tool loop.
    """

    def _get_request_payload(self, input_: LanguageModelInput, *, stop: list[str] | None = None, **kwargs: Any) -> dict:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        sent = [message for message in self._convert_input(input_).to_messages() if isinstance(message, AIMessage)]
        assistant_dicts = [message for message in payload["messages"] if message.get("role") == "assistant"]
        # Both lists follow the conversation order, one assistant dict per AIMessage.
        for message, as_dict in zip(sent, assistant_dicts, strict=False):
            reasoning = message.additional_kwargs.get("reasoning_content")
            if reasoning and "reasoning_content" not in as_dict:
                as_dict["reasoning_content"] = reasoning
        return payload


def is_configured(settings: LlmSettings) -> bool:
    """Whether the provider has what it needs to be called (Ollama needs no key)."""
    return settings.provider == "ollama" or settings.api_key is not None


def not_configured_error(settings: LlmSettings) -> LlmNotConfigured:
    """The error a chat gets when the provider lacks its key."""
    msg = "DeepSeek is not configured: set DEEPSEEK_API_KEY in the environment or .env and restart au."
    return LlmNotConfigured(msg)


def make_chat_model(settings: LlmSettings) -> BaseChatModel:
    """Build the chat model named by `llm.provider`; raise LlmNotConfigured when a key is missing."""
    if not is_configured(settings):
        raise not_configured_error(settings)
    if settings.provider == "ollama":
        return ChatOllama(
            model=settings.model,
            base_url=settings.base_url,
            temperature=settings.temperature,
            # ChatOllama has no timeout of its own: without one a stuck server hangs the turn forever.
            # Connection retries go in the transport; the model calls themselves are not retried
            # because a half-finished generation on a local server is rarely worth repeating.
            sync_client_kwargs={
                "timeout": settings.timeout_s,
                "transport": httpx.HTTPTransport(retries=settings.max_retries),
            },
            async_client_kwargs={
                "timeout": settings.timeout_s,
                "transport": httpx.AsyncHTTPTransport(retries=settings.max_retries),
            },
        )
    return ChatDeepSeekWithReasoning(
        model=settings.model,
        api_key=settings.api_key,
        api_base=settings.base_url,
        temperature=settings.temperature,
        timeout=settings.timeout_s,
        max_retries=settings.max_retries,
        # Streamed calls (SSE clients) report no token usage unless asked to.
        stream_usage=True,
    )


def translate_llm_error(exc: BaseException, settings: LlmSettings) -> AuError | None:
    """Map a provider failure onto au's errors, with a message that names the fix; None if it is not one."""
    name, where = _provider_name(settings), settings.base_url
    timeout = f"{name} did not answer within llm.timeout_s={settings.timeout_s:g}s; raise it or try again."
    if isinstance(exc, (ModelTimeoutError, openai.APITimeoutError, httpx.TimeoutException, TimeoutError)):
        return LlmTimeout(timeout)
    if isinstance(exc, (ModelConnectionError, openai.APIConnectionError, httpx.TransportError, ConnectionError)):
        return LlmUnavailable(_unreachable(settings))
    if isinstance(exc, ollama.ResponseError):
        return _ollama_error(exc, settings)
    if isinstance(exc, (ModelAuthenticationError, ModelPermissionDeniedError, openai.AuthenticationError)):
        return LlmError(f"{name} rejected the API key: check DEEPSEEK_API_KEY and restart au.")
    if isinstance(exc, (ModelNotFoundError, openai.NotFoundError)):
        return LlmError(f"{name} at {where} does not know the model '{settings.model}': check llm.model.")
    if isinstance(exc, (ModelRateLimitError, openai.RateLimitError)):
        retry_after = _retry_after(exc)
        msg = f"{name} is rate limiting requests (still after {settings.max_retries} retries); try again later."
        return LlmError(msg, headers={"Retry-After": retry_after} if retry_after else None)
    if isinstance(exc, ContextOverflowError):
        return LlmError(f"The conversation no longer fits {settings.model}'s context window; start a new thread.")
    if isinstance(exc, (ModelError, openai.APIError)):
        return LlmError(f"{name} rejected the request: {_short(exc)}")
    return None


def _provider_name(settings: LlmSettings) -> str:
    return "Ollama" if settings.provider == "ollama" else "DeepSeek"


def _unreachable(settings: LlmSettings) -> str:
    if settings.provider == "ollama":
        return (
            f"Ollama is not reachable at {settings.base_url}: start it with `ollama serve` "
            "(or set OLLAMA_HOST / llm.base_url to where it runs)."
        )
    return f"DeepSeek is not reachable at {settings.base_url}: check the network or DEEPSEEK_API_BASE."


def _ollama_error(exc: ollama.ResponseError, settings: LlmSettings) -> AuError:
    if exc.status_code == 404:
        msg = f"Ollama has no model '{settings.model}': run `ollama pull {settings.model}` or change llm.model."
        return LlmError(msg)
    return LlmError(f"Ollama rejected the request (HTTP {exc.status_code}): {_short(exc)}")


def _retry_after(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    return headers.get("retry-after") if headers is not None else None


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"

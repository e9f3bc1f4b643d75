"""Chat model factory (deepseek | ollama) and the translation of provider failures into au's errors."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import httpx2
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


# DeepSeek documents a 128K-token window for deepseek-chat and deepseek-reasoner.
DEEPSEEK_CONTEXT_WINDOW = 128_000
# A model's full window (often 128K) can need far more memory than a home machine has; past this,
# llm.context_window must say so explicitly.
OLLAMA_MAX_AUTO_CONTEXT = 32_768
# When Ollama cannot be asked at start-up: small enough for any model, larger than Ollama's default.
OLLAMA_FALLBACK_CONTEXT = 8_192

log = logging.getLogger(__name__)


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


def context_window(settings: LlmSettings) -> int:
    """The model's context window in tokens: configured, documented (DeepSeek) or reported (Ollama's /api/show)."""
    if settings.context_window:
        return settings.context_window
    if settings.provider == "deepseek":
        return DEEPSEEK_CONTEXT_WINDOW
    try:
        info = ollama.Client(host=settings.base_url, timeout=5).show(settings.model).modelinfo or {}
    except (ollama.ResponseError, httpx.HTTPError, ConnectionError) as exc:
        log.warning(
            "could not ask Ollama at %s for %s's context window (%s); using %d tokens (set llm.context_window)",
            settings.base_url, settings.model, type(exc).__name__, OLLAMA_FALLBACK_CONTEXT,
        )
        return OLLAMA_FALLBACK_CONTEXT
    reported = next((value for key, value in info.items() if key.endswith(".context_length")), None)
    return min(int(reported), OLLAMA_MAX_AUTO_CONTEXT) if reported else OLLAMA_FALLBACK_CONTEXT


def make_chat_model(settings: LlmSettings, *, num_ctx: int | None = None) -> BaseChatModel:
    """Build the chat model named by `llm.provider`; raise LlmNotConfigured when a key is missing.

    `num_ctx` is passed to Ollama, which otherwise silently cuts prompts at its small default window.
    """
    if not is_configured(settings):
        raise not_configured_error(settings)
    if settings.provider == "ollama":
        return ChatOllama(
            model=settings.model,
            base_url=settings.base_url,
            temperature=settings.temperature,
            num_ctx=num_ctx,
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


# httpx2 is the HTTP client under the openai SDK, httpx the one under ollama; either may surface raw.
_TIMEOUTS = (ModelTimeoutError, openai.APITimeoutError, httpx.TimeoutException, httpx2.TimeoutException, TimeoutError)
_UNREACHABLE = (
    ModelConnectionError, openai.APIConnectionError, httpx.TransportError, httpx2.TransportError, ConnectionError
)
# The remaining failures of the SDKs and their HTTP clients (e.g. a 400/422 rejection, an undecodable body).
_OTHER_PROVIDER_ERRORS = (ModelError, openai.OpenAIError, ollama.RequestError, httpx.HTTPError, httpx2.HTTPError)


def translate_llm_error(exc: BaseException, settings: LlmSettings) -> AuError | None:
    """Map a provider failure onto au's errors, with a message that names the fix; None if it is not one."""
    name, where = _provider_name(settings), settings.base_url
    timeout = f"{name} did not answer within llm.timeout_s={settings.timeout_s:g}s; raise it or try again."
    if isinstance(exc, _TIMEOUTS):
        return LlmTimeout(timeout)
    if isinstance(exc, _UNREACHABLE):
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
    status = exc.status_code if isinstance(exc, openai.APIStatusError) else None
    if status == 402:
        return LlmError(f"{name} refused the call for lack of balance (HTTP 402): top up the account, then try again.")
    if status is not None and status >= 500:
        msg = f"{name} failed with HTTP {status} (still after llm.max_retries={settings.max_retries} retries)"
        return LlmError(f"{msg}; try again later. {name} said: {_short(exc, settings)}")
    if isinstance(exc, json.JSONDecodeError):
        # langchain-deepseek raises this when a 200 answer is no JSON (and ollama on a garbled stream line):
        # usually llm.base_url points at a web page or proxy rather than the API.
        return LlmError(f"{name} at {where} answered with something that is not JSON: check llm.base_url.")
    if isinstance(exc, _OTHER_PROVIDER_ERRORS):
        return LlmError(f"{name} rejected the request: {_short(exc, settings)}")
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
    return LlmError(f"Ollama rejected the request (HTTP {exc.status_code}): {_short(exc, settings)}")


def _retry_after(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    return headers.get("retry-after") if headers is not None else None


def _short(exc: BaseException, settings: LlmSettings, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    if settings.api_key is not None:
        # A provider (or a proxy before it) may echo the request back in its error text; the key must not
        # travel on to au's clients.
        text = text.replace(settings.api_key.get_secret_value(), "***")
    return text if len(text) <= limit else text[: limit - 1] + "…"

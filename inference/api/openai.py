"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions and /v1/models.

Streams end with `data: [DONE]`; with `stream_options.include_usage` a last chunk with empty
`choices` carries the usage, as OpenAI sends it. Chat prompts go through the chat template.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import ClassVar

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET, require_POST
from pydantic import BaseModel, ValidationError

from inference.api.endpoint import api_endpoint
from inference.api.engine_access import json_body, model_name, overflows_context, ready_engine
from inference.api.errors import ApiError, from_exception, openai_error
from inference.api.openai_responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ModelCard,
    ModelList,
    OpenAIError,
    TextChoice,
    TextChunkChoice,
    TextCompletion,
    TextCompletionChunk,
    Usage,
)
from inference.api.openai_schema import ChatCompletionRequest, CompletionRequest, SamplingFields
from inference.api.sse import sse_data, sse_response
from inference.engine import EngineEvent, FinishReason
from inference.provisioning.prompting import chat_prompt_ids

FINISH = {
    FinishReason.EOS_TOKEN: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
}


def usage_of(final: EngineEvent) -> Usage:
    usage = final.usage
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
    )


@dataclass
class Exchange(ABC):
    """What differs between chat and plain completions: ids and the models of their bodies."""

    request: SamplingFields
    prompt_ids: list[int]
    prefix: str = ""
    id_prefix: ClassVar[str]

    def __post_init__(self) -> None:
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model_name()

    def envelope(self) -> dict:
        return {"id": self.id, "created": self.created, "model": self.model}

    @abstractmethod
    def completion(self, text: str, finish: str, usage: Usage) -> BaseModel:
        """The whole answer."""

    @abstractmethod
    def chunk(self, text: str, first: bool, finish: str | None) -> BaseModel:
        """One stream chunk with one choice."""

    @abstractmethod
    def usage_chunk(self, usage: Usage) -> BaseModel:
        """The last chunk when usage was asked for: no choices, only usage."""


class ChatExchange(Exchange):
    id_prefix = "chatcmpl"

    def completion(self, text: str, finish: str, usage: Usage) -> ChatCompletion:
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish)
        return ChatCompletion(**self.envelope(), choices=[choice], usage=usage)

    def chunk(self, text: str, first: bool, finish: str | None) -> ChatCompletionChunk:
        delta = ChatDelta(role="assistant" if first else None, content=text)
        choice = ChatChunkChoice(delta=delta, finish_reason=finish)
        return ChatCompletionChunk(**self.envelope(), choices=[choice])

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(**self.envelope(), choices=[], usage=usage)


class TextExchange(Exchange):
    id_prefix = "cmpl"

    def completion(self, text: str, finish: str, usage: Usage) -> TextCompletion:
        choice = TextChoice(text=text, finish_reason=finish)
        return TextCompletion(**self.envelope(), choices=[choice], usage=usage)

    def chunk(self, text: str, first: bool, finish: str | None) -> TextCompletionChunk:
        choice = TextChunkChoice(text=text, finish_reason=finish)
        return TextCompletionChunk(**self.envelope(), choices=[choice])

    def usage_chunk(self, usage: Usage) -> TextCompletionChunk:
        return TextCompletionChunk(**self.envelope(), choices=[], usage=usage)


def submit(exchange: Exchange):
    engine = ready_engine()
    asked = exchange.request.max_new_tokens
    prompt_tokens = len(exchange.prompt_ids)
    if overflows_context(engine, prompt_tokens, asked):
        field = exchange.request.max_new_tokens_field
        raise ApiError(
            400,
            "validation",
            f"This model's maximum context length is {engine.max_seq_len} tokens. However, you "
            f"requested {prompt_tokens + asked} tokens ({prompt_tokens} in the prompt, {asked} "
            f"in the completion). Please reduce the length of the prompt or {field}.",
            rejected=True,
        )
    max_new = asked or settings.TANDEM_DEFAULT_MAX_NEW_TOKENS
    try:
        return engine.stream(exchange.prompt_ids, exchange.request.sampling_params(max_new))
    except Exception as exc:  # submission errors are HTTP errors before the stream starts
        raise from_exception(exc) from exc


async def complete(exchange: Exchange) -> JsonResponse:
    final: EngineEvent | None = None
    async with submit(exchange) as stream:
        async for event in stream:
            if event.is_finished:
                final = event
    if final is None or final.finish_reason not in FINISH:
        reason = final.error if final is not None and final.error else "generation did not finish"
        raise ApiError(500, "generation", reason)
    text = exchange.prefix + final.full_text
    body = exchange.completion(text, FINISH[final.finish_reason], usage_of(final))
    return JsonResponse(body.model_dump())


async def stream_chunks(exchange: Exchange, stream) -> AsyncIterator[bytes]:
    include_usage = exchange.request.include_usage
    omit = None if include_usage else {"usage"}

    def chunk(text: str, first: bool, finish: str | None = None) -> bytes:
        return sse_data(exchange.chunk(text, first, finish).model_dump(exclude=omit))

    async with stream:
        yield chunk(exchange.prefix, True)
        async for event in stream:
            if event.finish_reason is FinishReason.ERROR:
                message = event.error or "generation failed"
                yield sse_data(OpenAIError.of(message, "server_error").model_dump())
                return
            if event.finish_reason is FinishReason.CANCELLED:
                return
            if event.text:
                yield chunk(event.text, False)
            if event.is_finished:
                yield chunk("", False, FINISH[event.finish_reason])
                if include_usage:
                    yield sse_data(exchange.usage_chunk(usage_of(event)).model_dump())
    yield sse_data("[DONE]")


async def respond(exchange: Exchange) -> HttpResponse:
    if exchange.request.stream:
        return sse_response(stream_chunks(exchange, submit(exchange)))
    return await complete(exchange)


def parse(schema: type[BaseModel], request: HttpRequest):
    try:
        return schema.model_validate(json_body(request))
    except ValidationError as exc:
        raise from_exception(exc) from None


def openai_auth_error(message: str) -> dict:
    return OpenAIError.of(message, "authentication_error").model_dump()


openai_endpoint = api_endpoint(openai_error, openai_auth_error)


@openai_endpoint
@require_POST
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """POST /v1/chat/completions."""
    body = parse(ChatCompletionRequest, request)
    engine = ready_engine()
    messages = [{"role": m.role, "content": m.text} for m in body.messages]
    return await respond(
        ChatExchange(
            request=body,
            prompt_ids=chat_prompt_ids(engine.tokenizer, messages),
        )
    )


@openai_endpoint
@require_POST
async def completions(request: HttpRequest) -> HttpResponse:
    """POST /v1/completions."""
    body = parse(CompletionRequest, request)
    engine = ready_engine()
    return await respond(
        TextExchange(
            request=body,
            prompt_ids=engine.encode(body.prompt_text, add_special_tokens=True),
            prefix=body.prompt_text if body.echo else "",
        )
    )


@openai_endpoint
@require_GET
async def models(request: HttpRequest) -> HttpResponse:
    """GET /v1/models: the one model this process serves."""
    ready_engine()
    return JsonResponse(ModelList(data=[ModelCard(id=model_name())]).model_dump())

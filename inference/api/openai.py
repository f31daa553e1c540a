"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions and /v1/models.

Streams end with `data: [DONE]`; with `stream_options.include_usage` a last chunk with empty
`choices` carries the usage, as OpenAI sends it. Chat prompts go through the chat template.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET, require_POST
from pydantic import BaseModel, ValidationError

from inference.api.endpoint import api_endpoint
from inference.api.engine_access import json_body, model_name, ready_engine
from inference.api.errors import ApiError, from_exception, openai_error, openai_error_body
from inference.api.openai_schema import ChatCompletionRequest, CompletionRequest, SamplingFields
from inference.api.sse import sse_data, sse_response
from inference.engine import EngineEvent, FinishReason
from inference.provisioning.prompting import chat_prompt_ids

FINISH = {
    FinishReason.EOS_TOKEN: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
}


def usage_json(final: EngineEvent) -> dict:
    usage = final.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


@dataclass
class Exchange:
    """What differs between chat and plain completions: ids, object names, choice shapes."""

    request: SamplingFields
    prompt_ids: list[int]
    id_prefix: str
    object_name: str
    chunk_object: str
    choice: Callable[[str], dict]
    delta: Callable[[str, bool], dict]
    prefix: str = ""

    def __post_init__(self) -> None:
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model_name()

    def envelope(self, object_name: str, choices: list[dict], **extra) -> dict:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


def submit(exchange: Exchange):
    engine = ready_engine()
    max_new = exchange.request.max_new_tokens or settings.TANDEM_DEFAULT_MAX_NEW_TOKENS
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
    choice = exchange.choice(exchange.prefix + final.full_text)
    choice.update({"index": 0, "finish_reason": FINISH[final.finish_reason], "logprobs": None})
    body = exchange.envelope(exchange.object_name, [choice], usage=usage_json(final))
    return JsonResponse(body)


async def stream_chunks(exchange: Exchange, stream) -> AsyncIterator[bytes]:
    include_usage = exchange.request.include_usage
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict, finish: str | None) -> bytes:
        choice = {**delta, "index": 0, "finish_reason": finish, "logprobs": None}
        return sse_data(exchange.envelope(exchange.chunk_object, [choice], **extra))

    async with stream:
        yield chunk(exchange.delta(exchange.prefix, True), None)
        async for event in stream:
            if event.finish_reason is FinishReason.ERROR:
                message = event.error or "generation failed"
                yield sse_data(openai_error_body(message, "server_error"))
                return
            if event.finish_reason is FinishReason.CANCELLED:
                return
            if event.text:
                yield chunk(exchange.delta(event.text, False), None)
            if event.is_finished:
                yield chunk(exchange.delta("", False), FINISH[event.finish_reason])
                if include_usage:
                    final = exchange.envelope(exchange.chunk_object, [], usage=usage_json(event))
                    yield sse_data(final)
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
    return openai_error_body(message, "authentication_error")


openai_endpoint = api_endpoint(openai_error, openai_auth_error)


@openai_endpoint
@require_POST
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """POST /v1/chat/completions."""
    body = parse(ChatCompletionRequest, request)
    engine = ready_engine()
    messages = [{"role": m.role, "content": m.text} for m in body.messages]
    return await respond(
        Exchange(
            request=body,
            prompt_ids=chat_prompt_ids(engine.tokenizer, messages),
            id_prefix="chatcmpl",
            object_name="chat.completion",
            chunk_object="chat.completion.chunk",
            choice=lambda text: {"message": {"role": "assistant", "content": text}},
            delta=lambda text, first: {
                "delta": {"role": "assistant", "content": text} if first else {"content": text}
            },
        )
    )


@openai_endpoint
@require_POST
async def completions(request: HttpRequest) -> HttpResponse:
    """POST /v1/completions."""
    body = parse(CompletionRequest, request)
    engine = ready_engine()
    return await respond(
        Exchange(
            request=body,
            prompt_ids=engine.encode(body.prompt_text, add_special_tokens=True),
            id_prefix="cmpl",
            object_name="text_completion",
            chunk_object="text_completion",
            choice=lambda text: {"text": text},
            delta=lambda text, first: {"text": text},
            prefix=body.prompt_text if body.echo else "",
        )
    )


@openai_endpoint
@require_GET
async def models(request: HttpRequest) -> HttpResponse:
    """GET /v1/models: the one model this process serves."""
    ready_engine()
    entry = {"id": model_name(), "object": "model", "created": 0, "owned_by": "tandem"}
    return JsonResponse({"object": "list", "data": [entry]})

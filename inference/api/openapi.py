"""GET /openapi.json: an OpenAPI 3.1 document of the public generation API.

Request bodies come from the pydantic schemas the views validate with, and response bodies from
the pydantic models the views build them with, so the document cannot drift from what is
accepted or answered. tests/badinput fuzzes a real server against it.
"""

from __future__ import annotations

from functools import cache

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET
from pydantic.json_schema import models_json_schema

from inference.api.openai_responses import (
    ChatCompletion,
    ChatCompletionChunk,
    ModelList,
    OpenAIError,
    TextCompletion,
    TextCompletionChunk,
)
from inference.api.openai_schema import ChatCompletionRequest, CompletionRequest
from inference.api.tgi_responses import TgiBatchAnswer, TgiError, TgiGenerated, TgiStreamEvent
from inference.api.tgi_schema import BatchPrompt, BatchRequest, TgiRequest

REF = "#/components/schemas/{model}"
REQUESTS = [TgiRequest, BatchRequest, ChatCompletionRequest, CompletionRequest]
# The stream payload models are listed so the document names the events' JSON, too.
RESPONSES = [
    TgiError,
    TgiGenerated,
    TgiBatchAnswer,
    TgiStreamEvent,
    OpenAIError,
    ChatCompletion,
    TextCompletion,
    ChatCompletionChunk,
    TextCompletionChunk,
    ModelList,
]


def ref(name: str) -> dict:
    return {"$ref": REF.format(model=name)}


def obj(required: list[str], **properties: dict) -> dict:
    return {"type": "object", "required": required, "properties": properties}


STRING = {"type": "string"}

# Schemathesis checks each parsed event ({"data", "event"}) against an event stream's schema.
SSE_EVENT = obj(["data"], data=STRING, event=STRING, id=STRING)
SSE = {"text/event-stream": {"schema": SSE_EVENT}}


def json_content(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def errors(schema: str, statuses: dict[str, str]) -> dict:
    return {
        status: {"description": why, "content": json_content(ref(schema))}
        for status, why in statuses.items()
    }


AUTH = {"401": "TANDEM_API_KEYS is set and no valid bearer key was sent"}
BUSY = {
    "429": "the engine's waiting queue is full (Retry-After says when to retry)",
    "503": "the model is loading, failed to load, or is not served by this process",
}
TGI_ERRORS = errors(
    "TgiError",
    {
        **AUTH,
        "422": "invalid JSON, an invalid or unsupported parameter, or a prompt too long",
        "424": "the generation failed or was cancelled",
        **BUSY,
    },
)
OPENAI_ERRORS = errors(
    "OpenAIError",
    {"400": "invalid JSON, an invalid parameter or a prompt too long", **AUTH, **BUSY},
)


def body(schema: dict) -> dict:
    return {"required": True, "content": json_content(schema)}


def operation(op_id: str, summary: str, request: dict | None, responses: dict) -> dict:
    entry = {"operationId": op_id, "summary": summary, "responses": responses}
    if request is not None:
        entry["requestBody"] = request
    return entry


def tgi_single(op_id: str, summary: str, ok: dict) -> dict:
    return operation(op_id, summary, body(ref("TgiRequest")), {"200": ok, **TGI_ERRORS})


def openai_post(op_id: str, summary: str, request: str, response: str) -> dict:
    ok = {
        "description": f"the completion, or {response}Chunk events when stream is true",
        "content": {**json_content(ref(response)), **SSE},
    }
    return operation(op_id, summary, body(ref(request)), {"200": ok, **OPENAI_ERRORS})


@cache
def document() -> dict:
    """The whole document; every body schema is generated from the pydantic models."""
    models = [(m, "validation") for m in REQUESTS] + [(m, "serialization") for m in RESPONSES]
    _, generated = models_json_schema(models, ref_template=REF)
    schemas = generated["$defs"]
    generate_body = {
        "anyOf": [
            ref("TgiRequest"),
            ref("BatchRequest"),
            {"type": "array", "minItems": 1, "items": ref(BatchPrompt.__name__)},
        ]
    }
    generated_or_batch = {
        "oneOf": [ref("TgiGenerated"), {"type": "array", "items": ref("TgiBatchAnswer")}]
    }
    stream_ok = {"description": "one TgiStreamEvent per token", "content": SSE}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Tandem generation API",
            "version": "1.0",
            "description": "TGI-compatible and OpenAI-compatible text generation. "
            "Send `Authorization: Bearer <key>` when the server sets TANDEM_API_KEYS.",
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
        "paths": {
            "/": {
                "post": tgi_single(
                    "tgiRoot",
                    "TGI's root route: a one-element list, or SSE when stream is true",
                    {
                        "description": "the generation",
                        "content": {
                            **json_content({"type": "array", "items": ref("TgiGenerated")}),
                            **SSE,
                        },
                    },
                )
            },
            "/generate": {
                "post": operation(
                    "tgiGenerate",
                    "One prompt, or a batch of prompts answered by request id",
                    body(generate_body),
                    {
                        "200": {
                            "description": "the generation",
                            "content": json_content(generated_or_batch),
                        },
                        **TGI_ERRORS,
                    },
                )
            },
            "/generate_stream": {
                "post": tgi_single("tgiGenerateStream", "Server-sent events", stream_ok)
            },
            "/v1/chat/completions": {
                "post": openai_post(
                    "chatCompletions", "OpenAI chat", "ChatCompletionRequest", "ChatCompletion"
                )
            },
            "/v1/completions": {
                "post": openai_post(
                    "completions", "OpenAI completions", "CompletionRequest", "TextCompletion"
                )
            },
            "/v1/models": {
                "get": operation(
                    "listModels",
                    "The one model this process serves",
                    None,
                    {
                        "200": {
                            "description": "the model",
                            "content": json_content(ref("ModelList")),
                        },
                        **errors("OpenAIError", {**AUTH, "503": BUSY["503"]}),
                    },
                )
            },
        },
    }


@require_GET
def openapi_json(request: HttpRequest) -> JsonResponse:
    """The document itself, public like TGI's /openapi.json (it holds no secrets)."""
    return JsonResponse(document())

"""OpenAI's response bodies and stream chunks, as the views build them.

One model per JSON object the OpenAI routes send, so the views and /openapi.json share them.
Field order is the wire order. `usage` on a chunk is absent unless the client asked for it
with `stream_options.include_usage`, then `null` on every chunk but the last, choice-less one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema


class OpenAIErrorDetail(BaseModel):
    """OpenAI's error object; Tandem names no `param`."""

    message: str
    type: str
    param: None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """`{"error": {...}}`: every refusal, and the error event of a stream."""

    error: OpenAIErrorDetail

    @classmethod
    def of(
        cls, message: str, error_type: str = "invalid_request_error", code: str | None = None
    ) -> OpenAIError:
        return cls(error=OpenAIErrorDetail(message=message, type=error_type, code=code))


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    message: AssistantMessage
    index: int = 0
    finish_reason: str
    logprobs: None = None


class TextChoice(BaseModel):
    text: str
    index: int = 0
    finish_reason: str
    logprobs: None = None


class ChatDelta(BaseModel):
    """A chunk's new text; only the first chunk names the role."""

    role: Literal["assistant"] | SkipJsonSchema[None] = Field(
        None, exclude_if=lambda value: value is None
    )
    content: str


class ChatChunkChoice(BaseModel):
    delta: ChatDelta
    index: int = 0
    finish_reason: str | None = None
    logprobs: None = None


class TextChunkChoice(BaseModel):
    text: str
    index: int = 0
    finish_reason: str | None = None
    logprobs: None = None


class Envelope(BaseModel):
    """What every completion and chunk starts with."""

    id: str
    object: str
    created: int
    model: str


class ChatCompletion(Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice] = Field(min_length=1, max_length=1)
    usage: Usage


class TextCompletion(Envelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice] = Field(min_length=1, max_length=1)
    usage: Usage


class ChatCompletionChunk(Envelope):
    """A chunk; `usage` is left out of the JSON unless the client asked for it."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice] = Field(max_length=1)
    usage: Usage | None = None


class TextCompletionChunk(Envelope):
    """A chunk; `usage` is left out of the JSON unless the client asked for it."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChunkChoice] = Field(max_length=1)
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "tandem"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]

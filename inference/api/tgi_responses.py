"""Hugging Face TGI's response bodies and stream events, as the views build them.

One model per JSON object the TGI routes send, so the views and /openapi.json share them.
Field order is the wire order. A field that TGI leaves out (rather than sending `null`) is
marked `omitted_when_none`, so `model_dump()` gives exactly the JSON TGI clients expect.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema


def omitted_when_none(description: str) -> Any:
    """A field that is absent from the JSON, not `null`, when it has no value."""
    return Field(None, description=description, exclude_if=lambda value: value is None)


class TgiError(BaseModel):
    """`{"error", "error_type"}`: every refusal, and the error event of a stream."""

    error: str
    error_type: str


class TgiToken(BaseModel):
    """One generated token; `text` is the piece to show, so pieces add up to the answer."""

    id: int
    text: str
    logprob: float
    special: bool


class TgiStreamDetails(BaseModel):
    """`details` of a stream's last event (TGI sends no prefill or tokens there)."""

    finish_reason: str
    generated_tokens: int
    seed: int | None


class TgiDetails(TgiStreamDetails):
    """`details` of /generate: the stream's, plus every token (Tandem reports no prefill)."""

    prefill: list[TgiToken]
    tokens: list[TgiToken]
    top_tokens: None = None


class TgiGenerated(BaseModel):
    """The body of /generate (and each element of the root route's list)."""

    generated_text: str
    details: TgiDetails | SkipJsonSchema[None] = omitted_when_none("when parameters.details")


class TgiStreamEvent(BaseModel):
    """One server-sent event per token; the last carries generated_text (and details)."""

    index: int
    token: TgiToken
    top_tokens: None = None
    generated_text: str | None = None
    details: TgiStreamDetails | None = None


class TgiBatchAnswer(BaseModel):
    """One answer of the lecture's batch form, routed back by its request id."""

    request_id: str
    generated_text: str
    finish_reason: str
    error: str | SkipJsonSchema[None] = omitted_when_none("why this prompt failed")

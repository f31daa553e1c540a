"""OpenAI's request schema for /v1/chat/completions and /v1/completions (the parts we serve).

Strict, as OpenAI's is: `"top_k": true` or `"max_tokens": "5"` is a 400, not a coercion; a
JSON integer is still a valid float (`"temperature": 1`).
"""

from __future__ import annotations

import secrets
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inference.api.tgi_schema import MAX_INPUT_CHARS, MAX_STOP_SEQUENCES
from inference.engine import SamplingParams

MAX_MESSAGES = 200


class TextPart(BaseModel):
    """A content part; only text is understood by a text model."""

    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str = Field(max_length=MAX_INPUT_CHARS)


class ChatMessage(BaseModel):
    """One message; `content` may be a string or a list of text parts."""

    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = Field(None)

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False


class SamplingFields(BaseModel):
    """The sampling knobs both endpoints share. OpenAI's defaults: temperature 1, top_p 1."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str = Field(min_length=1, max_length=200)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=1, description="only n=1 is served")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=0, le=0, description="unsupported; only 0")
    frequency_penalty: float | None = Field(None, ge=0, le=0, description="unsupported; only 0")
    user: str | None = Field(None, max_length=256)
    # Extensions beyond OpenAI's schema, as vLLM and TGI accept them.
    top_k: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool = Field(False, description="generate max_tokens even past EOS (benchmarks)")

    @model_validator(mode="after")
    def check_stop(self) -> SamplingFields:
        stops = self.stop_list
        if len(stops) > MAX_STOP_SEQUENCES or any(not stop for stop in stops):
            raise ValueError(f"stop takes up to {MAX_STOP_SEQUENCES} non-empty strings")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_new_tokens: int) -> SamplingParams:
        temperature = 1.0 if self.temperature is None else self.temperature
        sampled = temperature > 0
        seed = self.seed if self.seed is not None or not sampled else secrets.randbits(63)
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            do_sample=sampled,
            temperature=temperature,
            top_k=self.top_k or 0,
            top_p=1.0 if self.top_p is None else self.top_p,
            repetition_penalty=self.repetition_penalty or 1.0,
            seed=seed,
            stop=tuple(self.stop_list),
            ignore_eos=self.ignore_eos,
        )


class ChatCompletionRequest(SamplingFields):
    # The documented example: what a client (and the API fuzzer's example phase) sends first.
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "smollm2-135m-instruct",
                    "messages": [{"role": "user", "content": "Say hi."}],
                    "max_tokens": 2,
                }
            ]
        }
    )

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def max_new_tokens_field(self) -> str:
        """The field the limit came from, to name it in a refusal."""
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"


class CompletionRequest(SamplingFields):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"model": "smollm2-135m-instruct", "prompt": "Hello", "max_tokens": 2}]
        }
    )

    prompt: str | list[str] = Field(max_length=MAX_INPUT_CHARS)
    max_tokens: int | None = Field(None, ge=1)
    echo: bool = False

    @model_validator(mode="after")
    def one_prompt(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt must be a string or a list of exactly one string")
        if not self.prompt_text:
            raise ValueError("prompt must not be empty")
        return self

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def max_new_tokens_field(self) -> str:
        """The field the limit came from, to name it in a refusal."""
        return "max_tokens"

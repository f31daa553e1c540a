"""Hugging Face TGI's request schema for /generate, /generate_stream and the root route.

Strict, as TGI's own (serde) parsing is: `true` is not a number and `"5"` is not an integer;
a JSON integer is still a valid float.
"""

from __future__ import annotations

import secrets

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inference.engine import SamplingParams

MAX_INPUT_CHARS = 100_000
MAX_STOP_SEQUENCES = 8
MAX_BATCH_PROMPTS = 64


class TgiParameters(BaseModel):
    """TGI's `parameters`. Features Tandem does not implement are refused, not ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    max_new_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    do_sample: bool = False
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP_SEQUENCES)
    details: bool = False
    return_full_text: bool | None = False
    truncate: int | None = Field(None, ge=1)
    decoder_input_details: bool = False
    best_of: int | None = Field(None, ge=1)
    typical_p: float | None = None
    watermark: bool = False
    top_n_tokens: int | None = None
    grammar: dict | None = None

    @model_validator(mode="after")
    def refuse_unsupported(self) -> TgiParameters:
        unsupported = {
            "best_of > 1": self.best_of not in (None, 1),
            "typical_p": self.typical_p is not None,
            "watermark": self.watermark,
            "top_n_tokens": self.top_n_tokens not in (None, 0),
            "grammar": self.grammar is not None,
        }
        named = [name for name, used in unsupported.items() if used]
        if named:
            raise ValueError(f"not supported by Tandem: {', '.join(named)}")
        if any(not stop for stop in self.stop):
            raise ValueError("stop sequences must not be empty strings")
        return self

    @property
    def sampling(self) -> bool:
        """TGI's rule: any sampling knob turns sampling on; temperature 0 means greedy."""
        if self.temperature == 0:
            return False
        knobs = (self.top_k not in (None, 0), self.top_p not in (None, 1.0))
        return self.do_sample or any(knobs) or self.temperature not in (None, 1.0)

    def to_sampling_params(self, default_max_new_tokens: int) -> SamplingParams:
        """The engine's parameters; a sampled request without a seed gets one we can report."""
        seed = self.seed
        if self.sampling and seed is None:
            seed = secrets.randbits(63)
        return SamplingParams(
            max_new_tokens=self.max_new_tokens or default_max_new_tokens,
            do_sample=self.sampling,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=self.top_k or 0,
            top_p=1.0 if self.top_p is None else self.top_p,
            repetition_penalty=self.repetition_penalty or 1.0,
            seed=seed,
            stop=tuple(self.stop),
            truncate_prompt_tokens=self.truncate,
        )


class TgiRequest(BaseModel):
    """`{"inputs", "parameters", "stream"}`."""

    model_config = ConfigDict(extra="ignore", strict=True)

    inputs: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    parameters: TgiParameters = Field(default_factory=TgiParameters)
    stream: bool = False


class BatchPrompt(BaseModel):
    """One prompt of the lecture's batch form, with the id that routes its answer back."""

    model_config = ConfigDict(populate_by_name=True, strict=True)

    request_id: str = Field(alias="id", min_length=1, max_length=200)
    prompt: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)


class BatchRequest(BaseModel):
    """`{"prompts": [{"request_id"|"id", "prompt"}, ...], "parameters": {...}}` or a bare list."""

    model_config = ConfigDict(strict=True)

    prompts: list[BatchPrompt] = Field(min_length=1, max_length=MAX_BATCH_PROMPTS)
    parameters: TgiParameters = Field(default_factory=TgiParameters)

    @model_validator(mode="after")
    def unique_ids(self) -> BatchRequest:
        ids = [prompt.request_id for prompt in self.prompts]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique within a batch")
        return self

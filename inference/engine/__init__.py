"""Tandem's inference engine: continuous batching over a slot KV cache, no Django here."""

from inference.engine.bridge import EventStream
from inference.engine.config import EngineConfig, eos_token_ids
from inference.engine.engine import Engine
from inference.engine.errors import (
    EngineError,
    EngineStopped,
    InvalidRequest,
    Overloaded,
    PromptTooLong,
    UnsupportedModel,
)
from inference.engine.events import EngineEvent, FinishReason, GenerationResult, Timings, Usage
from inference.engine.model_runner import SUPPORTED_ARCHITECTURES, LlamaRunner, ModelRunner
from inference.engine.observer import EngineObserver
from inference.engine.sampling import SamplingParams
from inference.engine.stats import EngineStats

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineEvent",
    "EngineObserver",
    "EngineStats",
    "EngineStopped",
    "EventStream",
    "FinishReason",
    "GenerationResult",
    "InvalidRequest",
    "LlamaRunner",
    "ModelRunner",
    "Overloaded",
    "PromptTooLong",
    "SamplingParams",
    "Timings",
    "UnsupportedModel",
    "Usage",
    "eos_token_ids",
]

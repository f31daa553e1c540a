"""The API views' access to the engine: ready or a clear 503, and parsed JSON bodies."""

from __future__ import annotations

import json

from django.http import HttpRequest

from inference.api.errors import ApiError
from inference.engine import Engine
from inference.provisioning.runtime import model_runtime


def ready_engine() -> Engine:
    """The running engine, or a 503 saying why there is none."""
    engine = model_runtime.engine
    if engine is not None:
        return engine
    state = model_runtime.state
    if state == "error":
        raise ApiError(503, "unavailable", f"The model failed to load: {model_runtime.error}")
    if state == "disabled":
        raise ApiError(503, "unavailable", "This process serves no model (TANDEM_LOAD_MODEL=0).")
    raise ApiError(503, "unavailable", "The model is loading; retry shortly.", retry_after=5)


def json_body(request: HttpRequest) -> object:
    """The request's JSON, or a 422 that says what is wrong with it."""
    try:
        return json.loads(request.body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(422, "validation", f"The body is not valid JSON: {exc}") from None


def overflows_context(engine: Engine, prompt_tokens: int, max_new_tokens: int | None) -> bool:
    """True when an asked-for max_new_tokens cannot fit beside the prompt, as TGI and vLLM
    refuse it. Without one, the engine caps the default by the room left; a prompt that
    alone is too long is left to the engine's own refusal."""
    if max_new_tokens is None or prompt_tokens >= engine.max_seq_len:
        return False
    return prompt_tokens + max_new_tokens > engine.max_seq_len


def model_name() -> str:
    """The served model's id, as /v1/models and responses report it."""
    loaded = model_runtime.loaded
    return loaded.name if loaded is not None else "unloaded"

"""Errors the engine raises to callers; each maps to one HTTP status in the web layer."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises to a caller."""


class InvalidRequest(EngineError, ValueError):
    """The request cannot be served as given (HTTP 422); the message says why."""


class PromptTooLong(InvalidRequest):
    """The prompt does not fit the context window and truncation was not asked for."""

    def __init__(self, prompt_tokens: int, max_prompt_tokens: int) -> None:
        super().__init__(
            f"The prompt has {prompt_tokens} tokens but at most {max_prompt_tokens} fit the "
            "context window (leaving room for one new token). Shorten it or ask to truncate."
        )
        self.prompt_tokens = prompt_tokens
        self.max_prompt_tokens = max_prompt_tokens


class Overloaded(EngineError):
    """The waiting queue is full (HTTP 429); retry_after is a hint in seconds."""

    def __init__(self, waiting: int, retry_after: float) -> None:
        super().__init__(
            f"The engine is busy ({waiting} requests waiting); retry in about {retry_after:.0f} s."
        )
        self.waiting = waiting
        self.retry_after = retry_after


class EngineStopped(EngineError):
    """The engine has been shut down and accepts no more requests (HTTP 503)."""


class UnsupportedModel(EngineError):
    """The model's architecture has no runner here; the message names those that do."""


class StepInterrupted(Exception):
    """The step in flight must start over: a newcomer's prompt ran inside it and moved the
    cache's rows (the engine's own signal, never a caller's). Nothing it computed is kept."""

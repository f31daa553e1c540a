"""How engine and validation failures become HTTP answers, in TGI's and OpenAI's shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.http import JsonResponse
from pydantic import ValidationError

from inference.api.openai_responses import OpenAIError
from inference.api.tgi_responses import TgiError
from inference.engine import EngineStopped, InvalidRequest, Overloaded


@dataclass(frozen=True)
class ApiError(Exception):
    """A refusal before any response byte was sent.

    `rejected` marks a request refused before admission (overloaded, invalid): the endpoint
    that renders the error counts it in tandem_engine_requests_rejected by `error_type`.
    """

    status: int
    error_type: str
    message: str
    retry_after: float | None = None
    rejected: bool = False


def from_exception(exc: Exception) -> ApiError:
    """Map what submitting a request can raise to an HTTP status and error type."""
    if isinstance(exc, Overloaded):
        return ApiError(429, "overloaded", str(exc), retry_after=exc.retry_after, rejected=True)
    if isinstance(exc, InvalidRequest):
        return ApiError(422, "validation", str(exc), rejected=True)
    if isinstance(exc, EngineStopped):
        return ApiError(503, "unavailable", str(exc), retry_after=5)
    if isinstance(exc, ValidationError):
        return ApiError(422, "validation", describe_validation(exc), rejected=True)
    raise exc


def describe_validation(exc: ValidationError) -> str:
    """One readable line per invalid field, e.g. `parameters.top_p: must be <= 1`."""
    lines = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "body"
        lines.append(f"{where}: {error['msg']}")
    return "; ".join(lines)


def with_retry_after(response: JsonResponse, error: ApiError) -> JsonResponse:
    """Add Retry-After (whole seconds, at least 1) when the error suggests one."""
    if error.retry_after is not None:
        response["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    return response


def tgi_error(error: ApiError) -> JsonResponse:
    """TGI's error body: {"error", "error_type"}."""
    body = TgiError(error=error.message, error_type=error.error_type).model_dump()
    return with_retry_after(JsonResponse(body, status=error.status), error)


OPENAI_TYPES = {
    "validation": ("invalid_request_error", 400),
    "overloaded": ("rate_limit_exceeded", 429),
    "rate_limited": ("rate_limit_exceeded", 429),
    "unavailable": ("service_unavailable", 503),
    "not_found": ("invalid_request_error", 404),
}


def openai_error(error: ApiError) -> JsonResponse:
    """An ApiError in OpenAI's shape (validation is 400 there, not 422)."""
    error_type, status = OPENAI_TYPES.get(error.error_type, ("server_error", error.status))
    body = OpenAIError.of(error.message, error_type, code=error.error_type).model_dump()
    return with_retry_after(JsonResponse(body, status=status), error)

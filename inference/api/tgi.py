"""TGI-compatible endpoints: POST /generate, POST /generate_stream and POST / (TGI's root).

Hugging Face's `text-generation` client posts `{"inputs", "parameters", "stream"}` to its
base URL and expects a one-element list (or an SSE stream) back, as TGI's root route gives;
/generate and /generate_stream answer exactly as TGI's routes of the same names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_POST
from pydantic import ValidationError

from inference.api.endpoint import api_endpoint
from inference.api.engine_access import json_body, overflows_context, ready_engine
from inference.api.errors import ApiError, from_exception, tgi_error
from inference.api.sse import sse_data, sse_response
from inference.api.tgi_responses import (
    TgiBatchAnswer,
    TgiDetails,
    TgiError,
    TgiGenerated,
    TgiStreamDetails,
    TgiStreamEvent,
    TgiToken,
)
from inference.api.tgi_schema import BatchRequest, TgiParameters, TgiRequest
from inference.engine import Engine, EngineEvent, FinishReason, SamplingParams

BATCH_TIMEOUT = 600


def tgi_auth_error(message: str) -> dict:
    return TgiError(error=message, error_type="authentication").model_dump()


def token_of(event: EngineEvent) -> TgiToken:
    """TGI's token object. `text` is the piece to show, so pieces add up to the answer."""
    logprob = event.logprob if event.logprob is not None else 0.0
    return TgiToken(id=event.token_id, text=event.text, logprob=logprob, special=event.special)


def stream_details(final: EngineEvent, params: SamplingParams) -> TgiStreamDetails:
    """The stream's final `details`; the seed only when the request sampled."""
    return TgiStreamDetails(
        finish_reason=final.finish_reason.value,
        generated_tokens=final.usage.completion_tokens,
        seed=params.seed if params.do_sample else None,
    )


def details_of(final: EngineEvent, params: SamplingParams, tokens: list[TgiToken]) -> TgiDetails:
    """/generate's `details`: the stream's, with every token."""
    summary = stream_details(final, params)
    return TgiDetails(**dict(summary), prefill=[], tokens=tokens)


def check_context(engine: Engine, prompt_tokens: int, parameters: TgiParameters) -> None:
    """TGI's 422 for `max_new_tokens` that cannot fit beside the (truncated) prompt."""
    if parameters.truncate is not None:
        prompt_tokens = min(prompt_tokens, parameters.truncate)
    if overflows_context(engine, prompt_tokens, parameters.max_new_tokens):
        raise ApiError(
            422,
            "validation",
            f"`inputs` tokens + `max_new_tokens` must be <= {engine.max_seq_len}. Given: "
            f"{prompt_tokens} `inputs` tokens and {parameters.max_new_tokens} `max_new_tokens`",
            rejected=True,
        )


class Submission:
    """A parsed TGI request, tokenised and ready to submit."""

    def __init__(self, request: TgiRequest, engine: Engine) -> None:
        self.request = request
        self.engine = engine
        self.params = request.parameters.to_sampling_params(settings.TANDEM_DEFAULT_MAX_NEW_TOKENS)
        self.prompt_ids = engine.encode(request.inputs, add_special_tokens=True)
        check_context(engine, len(self.prompt_ids), request.parameters)

    def full_text(self, text: str) -> str:
        return self.request.inputs + text if self.request.parameters.return_full_text else text

    def open(self):
        try:
            return self.engine.stream(self.prompt_ids, self.params)
        except Exception as exc:  # submission errors become 422/429/503 before any byte is sent
            raise from_exception(exc) from exc


def parse_single(body: object) -> Submission:
    try:
        request = TgiRequest.model_validate(body)
    except ValidationError as exc:
        raise from_exception(exc) from None
    return Submission(request, ready_engine())


async def run_to_completion(submission: Submission) -> dict:
    """Collect a whole generation; TGI's /generate body."""
    tokens: list[TgiToken] = []
    final: EngineEvent | None = None
    async with submission.open() as stream:
        async for event in stream:
            if event.token_id is not None:
                tokens.append(token_of(event))
            if event.is_finished:
                final = event
    if final is None or final.finish_reason is FinishReason.ERROR:
        message = final.error if final is not None else "the generation ended without a result"
        raise ApiError(424, "generation", message)
    if final.finish_reason is FinishReason.CANCELLED:
        raise ApiError(424, "generation", "the generation was cancelled")
    details = None
    if submission.request.parameters.details:
        details = details_of(final, submission.params, tokens)
    text = submission.full_text(final.full_text)
    return TgiGenerated(generated_text=text, details=details).model_dump()


async def stream_events(submission: Submission, stream) -> AsyncIterator[bytes]:
    """TGI's SSE: one event per token; the last carries generated_text (and details)."""
    async with stream:
        async for event in stream:
            if event.finish_reason is FinishReason.ERROR:
                yield sse_data(TgiError(error=event.error, error_type="generation").model_dump())
                return
            if event.token_id is None:
                return  # cancelled: nothing more to say
            final = event.is_finished
            details = None
            if final and submission.request.parameters.details:
                details = stream_details(event, submission.params)
            payload = TgiStreamEvent(
                index=event.index + 1,
                token=token_of(event),
                generated_text=submission.full_text(event.full_text) if final else None,
                details=details,
            )
            yield sse_data(payload.model_dump())


def open_stream(submission: Submission) -> HttpResponse:
    """Submit now, so refusals are plain HTTP errors, then stream."""
    return sse_response(stream_events(submission, submission.open()))


async def generate_batch(body: object) -> JsonResponse:
    """The lecture's batch form: many prompts, one engine batch, answers keyed by request id."""
    try:
        batch = BatchRequest.model_validate({"prompts": body} if isinstance(body, list) else body)
    except ValidationError as exc:
        raise from_exception(exc) from None
    engine = ready_engine()
    params = batch.parameters.to_sampling_params(settings.TANDEM_DEFAULT_MAX_NEW_TOKENS)
    requests = [
        (None, engine.encode(item.prompt, add_special_tokens=True), params)
        for item in batch.prompts
    ]
    for _, prompt_ids, _ in requests:
        check_context(engine, len(prompt_ids), batch.parameters)
    try:
        results = await asyncio.to_thread(engine.generate_batch, requests, BATCH_TIMEOUT)
    except TimeoutError as exc:
        raise ApiError(424, "generation", str(exc)) from None
    except Exception as exc:
        raise from_exception(exc) from exc
    answers = [
        TgiBatchAnswer(
            request_id=item.request_id,
            generated_text=result.text,
            finish_reason=result.finish_reason.value,
            error=result.error or None,
        ).model_dump()
        for item, result in zip(batch.prompts, results, strict=True)
    ]
    return JsonResponse(answers, safe=False)


def tgi_endpoint(view):
    """POST only, and errors in TGI's {"error", "error_type"} shape."""
    return require_POST(api_endpoint(tgi_error, tgi_auth_error)(view))


@tgi_endpoint
async def generate(request: HttpRequest) -> HttpResponse:
    """POST /generate: one prompt → `{"generated_text", "details"?}`; a list → batch answers."""
    body = json_body(request)
    if isinstance(body, list) or (isinstance(body, dict) and "prompts" in body):
        return await generate_batch(body)
    return JsonResponse(await run_to_completion(parse_single(body)))


@tgi_endpoint
async def generate_stream(request: HttpRequest) -> HttpResponse:
    """POST /generate_stream: server-sent events, one per token."""
    return open_stream(parse_single(json_body(request)))


@tgi_endpoint
async def compat_generate(request: HttpRequest) -> HttpResponse:
    """POST / as TGI answers it: `stream` picks SSE, else a one-element list."""
    submission = parse_single(json_body(request))
    if submission.request.stream:
        return open_stream(submission)
    return JsonResponse([await run_to_completion(submission)], safe=False)

"""The one decorator every generation-API view wears, whatever its wire format."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from chat import caps
from inference.api.auth import caller_of, unauthorized
from inference.api.errors import ApiError
from inference.provisioning.metrics import REJECTED

caller_of_async = sync_to_async(caller_of)
request_start = sync_to_async(caps.api_request_start)
request_finish = sync_to_async(caps.api_request_finish)


async def finish(record_id: int, status: int) -> None:
    """Mark the request done; shielded, since it runs while a client's disconnect cancels the
    response, and a row left unfinished would hold the owner's cap until the process dies."""
    await asyncio.shield(request_finish(record_id, status))


def finished_when_sent(response: HttpResponse, record_id: int) -> HttpResponse:
    """A stream counts until its last byte is sent or its client leaves; any other response is
    complete already."""
    chunks: AsyncIterator[bytes] = response.streaming_content

    async def tracked() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await finish(record_id, response.status_code)

    response.streaming_content = tracked()
    return response


def api_endpoint(
    render_error: Callable[[ApiError], HttpResponse], auth_body: Callable[[str], dict]
):
    """No CSRF (bearer keys instead), the key check, the key owner's cap, and ApiError → the
    format's error.

    Rendering the error is where a refusal before admission is counted, once per response.
    A request made with a user's key is recorded (`inference.api.keys.ApiRequest`) from its
    admission until its response is sent, which is what makes it count against the cap.
    """

    def decorate(view):
        async def answer(request: HttpRequest) -> HttpResponse:
            try:
                return await view(request)
            except ApiError as error:
                if error.rejected:
                    REJECTED.labels(reason=error.error_type).inc()
                return render_error(error)

        @functools.wraps(view)
        async def wrapped(request: HttpRequest) -> HttpResponse:
            caller = await caller_of_async(request)
            if caller is None:
                return unauthorized(auth_body)
            if caller.key is None:
                return await answer(request)
            try:
                record = await request_start(caller.key, request.path)
            except caps.OverCap as refused:
                return render_error(
                    ApiError(429, "rate_limited", refused.message, retry_after=refused.retry_after)
                )
            try:
                response = await answer(request)
            except BaseException:
                await finish(record.pk, 500)
                raise
            if response.streaming:
                return finished_when_sent(response, record.pk)
            await finish(record.pk, response.status_code)
            return response

        return csrf_exempt(wrapped)

    return decorate

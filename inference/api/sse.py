"""Server-sent events framing for the streaming endpoints."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from django.http import StreamingHttpResponse


def sse_data(payload: object) -> bytes:
    """One `data:` event; JSON without spaces, as TGI and OpenAI send it."""
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data:{text}\n\n".encode()


def sse_response(events: AsyncIterator[bytes]) -> StreamingHttpResponse:
    """A text/event-stream response that proxies must not buffer or cache."""
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response

"""The load client for HTTP peers: N parallel OpenAI streaming chats, stamped as chunks arrive.

Every server that speaks OpenAI's `/v1/chat/completions` gets the same requests from the same
client, so each pays the same path (JSON in, SSE out, one connection per stream): Tandem's own
Daphne and llama.cpp's `llama-server` alike. Each request is greedy (temperature 0) with the same
`max_tokens`; the per-server `extra` fields ask it to ignore EOS so every stream generates exactly
`max_tokens` tokens.

Tokens are counted from the `usage` the server sends at the end of the stream
(`stream_options.include_usage`), not from chunks: a server may hold a piece back (an incomplete
UTF-8 character, a partial stop string) and send two tokens in one chunk. Each content chunk's
arrival is stamped: TTFT is the first non-empty chunk, ITL the gaps between chunks.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx2

from bench.stats import PeerRun, Trace

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Server:
    """An OpenAI-compatible endpoint and the body fields it needs beyond OpenAI's."""

    base_url: str
    model: str
    api_key: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


class StreamFailed(RuntimeError):
    """The server refused a request or sent an error event instead of tokens."""


@dataclass
class StreamResult:
    """One request's trace, its text, the server's token counts and how many chunks came."""

    trace: Trace
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0


def body(server: Server, messages: Messages, max_tokens: int) -> dict[str, object]:
    """The request: streaming, greedy, usage at the end, plus the server's extras."""
    return {
        "model": server.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **server.extra,
    }


async def stream_one(
    client: httpx2.AsyncClient, server: Server, messages: Messages, max_tokens: int
) -> StreamResult:
    """Send one streaming request and stamp each content chunk as it arrives."""
    result = StreamResult(Trace(arrival=time.perf_counter()))
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    url = f"{server.base_url.rstrip('/')}/chat/completions"
    pieces: list[str] = []
    async with client.stream(
        "POST", url, json=body(server, messages, max_tokens), headers=headers
    ) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")[:500]
            raise StreamFailed(f"{url}: HTTP {response.status_code}: {detail}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise StreamFailed(f"{url}: error event: {event['error']}")
            content = event["choices"][0]["delta"].get("content") if event.get("choices") else None
            if content:
                result.trace.stamps.append(time.perf_counter())
                result.chunks += 1
                pieces.append(content)
            if event.get("usage"):
                result.prompt_tokens = event["usage"]["prompt_tokens"]
                result.completion_tokens = event["usage"]["completion_tokens"]
    result.text = "".join(pieces)
    if result.completion_tokens is None:
        raise StreamFailed(f"{url}: the stream ended without usage")
    result.trace.tokens = result.completion_tokens
    return result


async def run_async(server: Server, conversations: list[Messages], max_tokens: int) -> PeerRun:
    """Every conversation at once, one connection each; the run spans first send to last token."""
    limits = httpx2.Limits(max_connections=len(conversations), max_keepalive_connections=0)
    timeout = httpx2.Timeout(600.0, connect=30.0)
    async with httpx2.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(stream_one(client, server, m, max_tokens) for m in conversations)
        )
        ended = time.perf_counter()
    fed = sum(r.prompt_tokens + r.completion_tokens for r in results)
    return PeerRun(
        traces=[r.trace for r in results],
        tokens_fed=fed,
        started=started,
        ended=ended,
        texts=[r.text for r in results],
        chunks=sum(r.chunks for r in results),
    )


def run(server: Server, conversations: list[Messages], max_tokens: int) -> PeerRun:
    """`run_async` from synchronous code (the bench's main thread has no event loop)."""
    return asyncio.run(run_async(server, conversations, max_tokens))

"""The chat's text from engines in other processes: OpenAI-compatible streaming clients.

With TANDEM_ENGINE set to base URLs (Tandem's own engine role, vLLM, SGLang, TGI, llama.cpp's
server), the web process loads no model: each text part streams from
`POST {url}/v1/chat/completions` (stream, usage included) and comes out as the local engine's
`EngineEvent`s, so the chat's writer (chat/text_stream.py) numbers, tails, saves and finishes
it exactly as it does a local one.

One asyncio loop on a daemon thread runs every stream, each a task on it whose response is read
by an asyncio protocol (`sse_stream.py`: httptools and the SSE lines in the socket's callback,
no task woken per token). These reads were the web process's largest cost a token; with
httptools in place of h11 the web process used about a quarter less CPU a token (docs/deploy.md,
"Live replies per web process"). A kept `httpx2.AsyncClient` asks the replicas for their
models. Stop cancels the task, which closes the upstream connection: the engine drops a
request whose client went away. A Stop that reaches another web process (any process serves
any page) is published on Redis; the process streaming the part hears it and cancels there.

Several URLs are replicas: a conversation always starts at the same one (its id picks it, so
the engine can reuse the prompt's cached prefix), and goes on to the next when one refuses
(429/503, 5xx) or cannot be reached. Once a stream has started it stays where it is: a drop or
a stall past TANDEM_ENGINE_STALL_TIMEOUT ends the part `interrupted`, its text kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx2
import redis
import redis.asyncio
from django.conf import settings

from config.redis_client import redis_client
from inference.engine.events import EngineEvent, FinishReason, Usage
from inference.engine.sampling import SamplingParams
from inference.provisioning import sse_stream

log = logging.getLogger(__name__)

BUSY = "the engine is busy right now; try again in a few seconds"
REFUSED_BUSY = {429, 503}
FINISH = {
    "stop": FinishReason.EOS_TOKEN,
    "eos": FinishReason.EOS_TOKEN,
    "eos_token": FinishReason.EOS_TOKEN,
    "stop_sequence": FinishReason.STOP_SEQUENCE,
    "length": FinishReason.LENGTH,
}

OnEvent = Callable[[EngineEvent], None]


@dataclass
class Replica:
    """One engine URL and what the last request or probe learnt about it."""

    url: str
    state: str = "unknown"  # ok | busy | down | unknown (nothing sent yet)
    last_error: str = ""
    latency_ms: float | None = None  # time to the response's headers (or the probe's answer)
    checked_at: float | None = None  # time.time() of that last contact
    model: str = ""  # the served model's id, from /v1/models

    def mark(self, state: str, error: str = "", latency: float | None = None) -> None:
        self.state = state
        if error:
            self.last_error = error
        if latency is not None:
            self.latency_ms = round(latency * 1000, 1)
        self.checked_at = time.time()

    def snapshot(self) -> dict[str, object]:
        return {
            "url": self.url,
            "state": self.state,
            "reachable": self.state in ("ok", "busy"),
            "last_error": self.last_error,
            "latency_ms": self.latency_ms,
            "checked_at": self.checked_at,
        }


@dataclass
class Progress:
    """What one stream has produced so far; it makes the events the writer receives."""

    request_id: str
    index: int = 0
    pieces: list[str] = field(default_factory=list)
    usage: Usage | None = None

    def piece(self, text: str) -> EngineEvent:
        event = EngineEvent(self.request_id, self.index, None, text)
        self.index += 1
        self.pieces.append(text)
        return event

    def final(self, reason: FinishReason, error: str | None = None) -> EngineEvent:
        return EngineEvent(
            self.request_id,
            self.index,
            None,
            "",
            is_finished=True,
            finish_reason=reason,
            usage=self.usage,
            full_text="".join(self.pieces),
            error=error,
        )


@dataclass
class Outcome:
    """How a stream's body ended: the last finish reason seen, or an error chunk's message."""

    finish: str | None = None
    error: str | None = None


class Refused(Exception):
    """A replica did not take the request; `busy` when it said it is full."""

    def __init__(self, reason: str, busy: bool = False) -> None:
        super().__init__(reason)
        self.busy = busy


def base_url(url: str) -> str:
    """An engine's base URL without a trailing slash or `/v1`: servers are documented both
    ways (llama-server's `http://host:8080/v1`), and every path here is appended with its
    `/v1`, so `http://host:8080/v1` would ask for `/v1/v1/models`."""
    url = url.strip().rstrip("/")
    return url.removesuffix("/v1").rstrip("/") if url.endswith("/v1") else url


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def request_body(messages: list[dict], params: SamplingParams) -> dict:
    """The chat completion asked of the engine: the turns, the conversation's sampling."""
    body: dict = {
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": params.temperature if params.do_sample else 0.0,
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
    }
    if settings.TANDEM_ENGINE_SEND_REPETITION_PENALTY and params.repetition_penalty != 1.0:
        body["repetition_penalty"] = params.repetition_penalty  # Tandem, vLLM and TGI take it
    if params.ignore_eos:
        body["ignore_eos"] = True  # benchmarks only (bench/remote_engine.py), as vLLM takes it
    return body


class RemoteEngine:
    """Streams chat completions from replicas on a loop of its own; thread-safe to call."""

    def __init__(self, urls: list[str]) -> None:
        self.replicas = [Replica(base_url(url)) for url in urls]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx2.AsyncClient | None = None  # the models' probes
        self._headers: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task] = {}  # touched on the loop only
        self._owned: set[str] = set()  # request ids streaming in this process
        self._lock = threading.Lock()
        self._background: set[asyncio.Task] = set()

    @property
    def cancel_channel(self) -> str:
        """Stops for parts another process streams: one channel per Redis database."""
        database = redis_client().connection_pool.connection_kwargs.get("db", 0)
        return f"tandem:engine-cancel:{database}"

    def start(self) -> RemoteEngine:
        """Start the loop thread, its kept client and the listener for Stops from elsewhere."""
        with self._lock:
            if self._loop is not None:
                return self
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="remote-engine", daemon=True).start()
            asyncio.run_coroutine_threadsafe(self._open(), loop).result(10)
            self._loop = loop
        return self

    async def _open(self) -> None:
        timeout = httpx2.Timeout(
            settings.TANDEM_ENGINE_STALL_TIMEOUT, connect=settings.TANDEM_ENGINE_CONNECT_TIMEOUT
        )
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=64)
        headers = {"Accept": "text/event-stream"}
        if settings.TANDEM_ENGINE_API_KEY:
            headers["Authorization"] = f"Bearer {settings.TANDEM_ENGINE_API_KEY}"
        self._headers = headers
        self._client = httpx2.AsyncClient(
            timeout=timeout, limits=limits, headers=headers, trust_env=False
        )
        listener = asyncio.get_running_loop().create_task(self._listen())
        self._background.add(listener)

    def close(self) -> None:
        """End every stream and the listener, close the client, stop the loop (a test's or a
        benchmark's engine; a web process keeps its own until it exits)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)

    async def _close(self) -> None:
        tasks = [*self._background, *self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()

    def order(self, affinity: int) -> list[Replica]:
        """Replicas to try for a conversation: its own first, then the next ones around."""
        start = affinity % len(self.replicas)
        return self.replicas[start:] + self.replicas[:start]

    def submit(
        self,
        messages: list[dict],
        params: SamplingParams,
        on_event: OnEvent,
        request_id: str,
        affinity: int = 0,
    ) -> None:
        """Start streaming; every outcome, refusals included, reaches `on_event` as events."""
        loop = self.start()._loop
        self._owned.add(request_id)
        body = request_body(messages, params)
        loop.call_soon_threadsafe(self._spawn, request_id, body, on_event, affinity)

    def cancel(self, request_id: str) -> bool:
        """Stop a stream: here when this process streams it, else through Redis to whichever
        process does. True when someone could act on it."""
        if request_id in self._owned and self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel_here, request_id)
            return True
        try:
            return redis_client().publish(self.cancel_channel, request_id) > 0
        except redis.RedisError as exc:
            log.warning("cannot publish the stop of %s: %s", request_id, exc)
            return False

    def probe(self, timeout: float) -> list[dict[str, object]]:
        """Ask every replica for its models now (concurrently); their states for /health."""
        loop = self.start()._loop
        future = asyncio.run_coroutine_threadsafe(self._probe_all(timeout), loop)
        try:
            future.result(timeout + 1)
        except TimeoutError:
            future.cancel()
        return self.snapshot()

    def snapshot(self) -> list[dict[str, object]]:
        return [replica.snapshot() for replica in self.replicas]

    def streaming(self) -> int:
        """Streams this process has open now."""
        return len(self._owned)

    def _spawn(self, request_id: str, body: dict, on_event: OnEvent, affinity: int) -> None:
        task = asyncio.get_running_loop().create_task(
            self._run(request_id, body, on_event, affinity)
        )
        self._tasks[request_id] = task

    def _cancel_here(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def _run(self, request_id: str, body: dict, on_event: OnEvent, affinity: int) -> None:
        progress = Progress(request_id)
        try:
            on_event(await self._stream(body, progress, on_event, affinity))
        except asyncio.CancelledError:
            on_event(progress.final(FinishReason.CANCELLED))
        except Exception as exc:  # a bug here must still end the part, never leave it streaming
            log.exception("remote stream %s failed", request_id)
            on_event(progress.final(FinishReason.ERROR, describe(exc)))
        finally:
            self._tasks.pop(request_id, None)
            self._owned.discard(request_id)

    async def _stream(
        self, body: dict, progress: Progress, on_event: OnEvent, affinity: int
    ) -> EngineEvent:
        """Try the replicas in order until one streams; the part's last event."""
        reasons: list[str] = []
        busy = 0
        for replica in self.order(affinity):
            try:
                return await self._stream_from(replica, body, progress, on_event)
            except Refused as refused:
                busy += refused.busy
                reasons.append(f"{replica.url}: {refused}")
            except (httpx2.TransportError, sse_stream.StreamError) as exc:  # nothing streamed yet
                replica.mark("down", describe(exc))
                reasons.append(f"{replica.url}: {describe(exc)}")
        if busy == len(reasons):
            return progress.final(FinishReason.ERROR, f"{BUSY} ({'; '.join(reasons)})")
        return progress.final(
            FinishReason.ERROR, f"no engine could take this reply ({'; '.join(reasons)})"
        )

    async def _stream_from(
        self, replica: Replica, body: dict, progress: Progress, on_event: OnEvent
    ) -> EngineEvent:
        model = await self._model_of(replica)
        started = time.monotonic()
        payload = json.dumps({"model": model, **body}).encode()
        stream = await sse_stream.open_stream(
            f"{replica.url}/v1/chat/completions",
            payload,
            self._headers,
            settings.TANDEM_ENGINE_CONNECT_TIMEOUT,
            settings.TANDEM_ENGINE_STALL_TIMEOUT,
        )
        try:
            status = stream.status
            if status != 200:
                detail = error_text(await stream.body())
                if status in REFUSED_BUSY:
                    replica.mark("busy", f"{status}: {detail}", time.monotonic() - started)
                    raise Refused(f"{status} {detail}", busy=True)
                if status >= 500:
                    replica.mark("down", f"{status}: {detail}", time.monotonic() - started)
                    raise Refused(f"{status} {detail}")
                replica.mark("ok", latency=time.monotonic() - started)
                return progress.final(
                    FinishReason.ERROR, f"{replica.url} refused this reply ({status}): {detail}"
                )
            replica.mark("ok", latency=time.monotonic() - started)
            return await self._relay(replica, stream, progress, on_event)
        finally:
            stream.close()

    async def _relay(
        self, replica: Replica, stream: sse_stream.SseProtocol, progress: Progress, on_event
    ) -> EngineEvent:
        """Turn the SSE chunks into events until the stream ends; a drop or a stall keeps the
        text (`interrupted`). Each chunk is handled as its bytes arrive, in the protocol's
        callback: no task is woken per token."""
        outcome = Outcome()

        def on_line(data: bytes) -> bool:
            if data == b"[DONE]":
                return True
            chunk = json.loads(data)
            if "error" in chunk:
                error = chunk["error"]
                outcome.error = error.get("message") if isinstance(error, dict) else str(error)
                return True
            if usage := chunk.get("usage"):
                progress.usage = Usage(usage["prompt_tokens"], usage["completion_tokens"])
            for choice in chunk.get("choices") or []:
                if content := (choice.get("delta") or {}).get("content"):
                    on_event(progress.piece(content))
                outcome.finish = choice.get("finish_reason") or outcome.finish
            return False

        try:
            await stream.relay(on_line)
        except sse_stream.ReadTimeout:
            stall = settings.TANDEM_ENGINE_STALL_TIMEOUT
            replica.mark("ok", f"a stream stalled for {stall:g} s")
            return progress.final(
                FinishReason.INTERRUPTED, f"{replica.url} sent nothing for {stall:g} s"
            )
        except sse_stream.StreamError as exc:
            replica.mark("down", describe(exc))
            return progress.final(
                FinishReason.INTERRUPTED, f"the stream from {replica.url} dropped: {describe(exc)}"
            )
        if outcome.error is not None:
            return progress.final(FinishReason.ERROR, f"{replica.url}: {outcome.error}")
        if outcome.finish is None:
            return progress.final(
                FinishReason.INTERRUPTED,
                f"the stream from {replica.url} ended before the reply did",
            )
        return progress.final(FINISH.get(outcome.finish, FinishReason.EOS_TOKEN))

    async def _model_of(self, replica: Replica) -> str:
        """The model name to ask for: the setting, else what the replica serves."""
        if settings.TANDEM_ENGINE_MODEL:
            return settings.TANDEM_ENGINE_MODEL
        if not replica.model:
            await self._ask_models(replica, settings.TANDEM_ENGINE_CONNECT_TIMEOUT)
        return replica.model or "default"

    async def _ask_models(self, replica: Replica, timeout: float) -> None:
        started = time.monotonic()
        response = await self._client.get(f"{replica.url}/v1/models", timeout=timeout)
        latency = time.monotonic() - started
        if response.status_code in REFUSED_BUSY:
            replica.mark("busy", f"{response.status_code}: {response.text[:200]}", latency)
            return
        if response.status_code != 200:
            replica.mark("down", f"{response.status_code}: {response.text[:200]}", latency)
            return
        models = response.json().get("data") or []
        replica.model = str(models[0].get("id", "")) if models else ""
        replica.mark("ok", latency=latency)

    async def _probe_all(self, timeout: float) -> None:
        async def probe(replica: Replica) -> None:
            try:
                await self._ask_models(replica, timeout)
            except (httpx2.HTTPError, ValueError) as exc:
                replica.mark("down", describe(exc))

        await asyncio.gather(*(probe(replica) for replica in self.replicas))

    async def _listen(self) -> None:
        """Cancel the streams of this process that a Stop elsewhere asked for."""
        while True:
            try:
                client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
                async with client, client.pubsub() as pubsub:
                    await pubsub.subscribe(self.cancel_channel)
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self._cancel_here(message["data"].decode())
            except (redis.RedisError, OSError) as exc:
                log.warning("stop listener: %s; retrying in 1 s", exc)
                await asyncio.sleep(1)


def error_text(body: bytes) -> str:
    """The body of a refusal, short: OpenAI's error message when it is one."""
    raw = body.decode(errors="replace")
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return raw[:200]
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:200]
    return raw[:200]

"""Round trips on one WebSocket held open on a server while the bench loads it: does Daphne answer?

Two round trips are timed, each about every `interval` seconds, on one signed-in socket to
`/ws/diagnostics/echo/` (chat.consumers.EchoConsumer):
- `ping`: a protocol-level ping (`await ws.ping()`). Daphne's own event loop answers it with a
  pong, without the application: this is the "Daphne keeps answering" figure.
- `echo`: a JSON frame the consumer sends to its own channel through the channel layer (Redis)
  and back: the path every live event takes, so it also pays Django's side of the process.

Each loop waits for its answer before the next send, so a stalled server shows as one long round
trip rather than a queue of short ones. The socket lives in a thread of its own with its own
event loop, so the bench's synchronous code (and its HTTP load client, unchanged) runs beside
it; the figures include that client's own delays (one process, the GIL, the same cores).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import websockets

from bench.stats import ms, percentile

PATH = "/ws/diagnostics/echo/"
INTERVAL = 0.1
ANSWER_TIMEOUT = 30.0  # a round trip slower than this counts as lost
T = TypeVar("T")


@dataclass(frozen=True)
class RoundTrips:
    """One kind of round trip over one window: how many, percentiles and max, how many lost."""

    count: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    lost: int


@dataclass(frozen=True)
class Pings:
    """Both kinds of round trip over one window and how long the window lasted."""

    seconds: float
    ping: RoundTrips
    echo: RoundTrips


def round_trips(seconds: list[float], lost: int = 0) -> RoundTrips:
    """The figures of a list of round-trip times (seconds) and the number that never came back."""
    return RoundTrips(
        count=len(seconds),
        p50_ms=ms(percentile(seconds, 50)),
        p99_ms=ms(percentile(seconds, 99)),
        max_ms=ms(max(seconds)) if seconds else None,
        lost=lost,
    )


@dataclass
class Samples:
    """Round-trip times of one kind, collected while a window is open."""

    seconds: list[float] = field(default_factory=list)
    lost: int = 0

    def figures(self) -> RoundTrips:
        return round_trips(self.seconds, self.lost)


class Pinger:
    """One socket held open in a background thread; `measure` times round trips around a call."""

    def __init__(self, url: str, origin: str, cookie: str, interval: float = INTERVAL) -> None:
        self.url, self.origin, self.cookie, self.interval = url, origin, cookie, interval
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ws-ping", daemon=True)
        self.ws: websockets.ClientConnection | None = None
        self.echo_ids = itertools.count()

    def __enter__(self) -> Pinger:
        self.thread.start()
        self.ws = self.call(self.connect())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.ws is not None:
                self.call(self.ws.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()

    def call(self, coroutine, timeout: float | None = 60.0):
        """Run a coroutine on the socket's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def connect(self) -> websockets.ClientConnection:
        return await websockets.connect(
            self.url,
            origin=self.origin,
            additional_headers={"Cookie": self.cookie},
            open_timeout=ANSWER_TIMEOUT,
            ping_interval=None,  # only our own pings
            compression=None,
        )

    def measure(self, work: Callable[[], T]) -> tuple[T, Pings]:
        """Call `work()` while both round trips are timed; its result and the figures."""
        stop = threading.Event()
        ping, echo = Samples(), Samples()
        started = time.perf_counter()
        loops = asyncio.run_coroutine_threadsafe(self.sample(stop, ping, echo), self.loop)
        try:
            result = work()
        finally:
            seconds = time.perf_counter() - started
            stop.set()
            loops.result(ANSWER_TIMEOUT + 10)  # the round trips in flight finish or are lost
        return result, Pings(seconds, ping.figures(), echo.figures())

    def idle(self, seconds: float) -> Pings:
        """The figures with nothing else asked of the server, for `seconds`."""
        return self.measure(lambda: time.sleep(seconds))[1]

    async def sample(self, stop: threading.Event, ping: Samples, echo: Samples) -> None:
        await asyncio.gather(
            self.every_interval(stop, ping, self.ping_once),
            self.every_interval(stop, echo, self.echo_once),
        )

    async def every_interval(
        self, stop: threading.Event, samples: Samples, once: Callable[[], Awaitable[None]]
    ) -> None:
        """One round trip at a time, started every interval (at once if the last one was late)."""
        next_send = time.perf_counter()
        while not stop.is_set():
            sent = time.perf_counter()
            try:
                await asyncio.wait_for(once(), ANSWER_TIMEOUT)
            except TimeoutError:
                samples.lost += 1
            else:
                samples.seconds.append(time.perf_counter() - sent)
            next_send = max(next_send + self.interval, time.perf_counter())
            await asyncio.sleep(next_send - time.perf_counter())

    async def ping_once(self) -> None:
        pong = await self.ws.ping()
        await pong

    async def echo_once(self) -> None:
        token = next(self.echo_ids)
        await self.ws.send(json.dumps({"n": token}))
        while json.loads(await self.ws.recv())["echo"] != {"n": token}:
            pass  # an answer to an earlier, timed-out frame


def log_line(label: str, pings: Pings) -> str:
    """One printed line per window: both round trips' p50/p99/max and the sample counts."""

    def part(name: str, figures: RoundTrips) -> str:
        if not figures.count:
            return f"{name} none (lost {figures.lost})"
        lost = f", lost {figures.lost}" if figures.lost else ""
        return (
            f"{name} p50 {figures.p50_ms:7.1f} p99 {figures.p99_ms:7.1f} "
            f"max {figures.max_ms:7.1f} ms (n={figures.count}{lost})"
        )

    return f"ws {label:<10} {part('ping', pings.ping)} | {part('echo', pings.echo)}"

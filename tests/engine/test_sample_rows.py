"""A step's rows sampled together (`sample_rows`): each row as if alone, HF's arithmetic, the
distribution a draw follows on each of its paths."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from inference.engine import SamplingParams
from inference.engine.sampling import RequestSampler, candidate_draws, penalised, sample_rows

CPU = torch.device("cpu")
MIXED = [
    SamplingParams(max_new_tokens=8),
    SamplingParams(max_new_tokens=8, repetition_penalty=1.3),
    SamplingParams(do_sample=True, temperature=0.7, top_p=0.9, repetition_penalty=1.15, seed=1),
    SamplingParams(do_sample=True, temperature=1.0, seed=2),
    SamplingParams(do_sample=True, temperature=1.2, top_k=5, top_p=0.8, seed=3),
    SamplingParams(do_sample=True, temperature=1e-40, top_p=0.9, seed=4),  # overflows: greedy
    SamplingParams(do_sample=True, temperature=5.0, top_p=0.99, seed=5),  # flat: full sort
]


def samplers(vocab: int) -> list[RequestSampler]:
    return [RequestSampler(params, [3, 7, 7, 42], vocab, CPU) for params in MIXED]


def test_rows_sampled_together_draw_what_each_would_alone() -> None:
    vocab, steps = 1000, 12
    logits = torch.randn(steps, len(MIXED), vocab, generator=torch.Generator().manual_seed(0)) * 3
    together, alone = samplers(vocab), samplers(vocab)
    for step in logits:
        before = step.clone()
        rows = sample_rows(step, together)
        assert torch.equal(step, before)  # the raw logits stay for the log-probabilities
        singles = [sampler.sample(row) for sampler, row in zip(alone, step, strict=True)]
        assert rows == singles
        for sampler, other, token in zip(together, alone, rows, strict=True):
            sampler.observe(token)
            other.observe(token)
    assert rows[0] == int(step[0].argmax())
    assert rows[5] == int(penalised(step[None, 5], [together[5]]).argmax())


def test_penalty_over_rows_matches_hf_and_leaves_other_rows() -> None:
    vocab = 300
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1)) * 4
    prompt = [5, 9, 9, 200]
    rows = [
        RequestSampler(SamplingParams(repetition_penalty=1.3), prompt, vocab, CPU),
        RequestSampler(SamplingParams(), prompt, vocab, CPU),
        RequestSampler(SamplingParams(repetition_penalty=0.7), [*prompt, 17], vocab, CPU),
    ]
    rows[0].observe(11)
    ours = penalised(logits, rows)
    expected = [
        RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([[*prompt, 11]]), logits[:1].clone()),
        logits[1:2],
        RepetitionPenaltyLogitsProcessor(0.7)(torch.tensor([[*prompt, 17]]), logits[2:].clone()),
    ]
    torch.testing.assert_close(ours, torch.cat(expected))


def draws(logits: torch.Tensor, params: SamplingParams, count: int) -> torch.Tensor:
    """`count` draws from one row, each by a request of its own seed, in steps of 2,000 rows."""
    tokens = []
    for start in range(0, count, 2000):
        batch = [
            RequestSampler(SamplingParams(**{**vars(params), "seed": start + i}), [0], 1000, CPU)
            for i in range(2000)
        ]
        tokens += sample_rows(logits.expand(2000, -1), batch)
    return torch.tensor(tokens)


def test_draws_follow_the_nucleus_on_each_path() -> None:
    """Peaked (the nucleus within 32 tokens), wider (within 256) and flat (the whole
    vocabulary sorted): the tokens drawn are HF's top-p set, at its renormalised odds."""
    base = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(do_sample=True, temperature=1.0, top_p=0.9)
    for spread, most_kept in ((6.0, 32), (2.0, 256), (0.3, 1000)):
        logits = base * spread
        warped = TopPLogitsWarper(0.9)(None, TemperatureLogitsWarper(1.0)(None, logits[None]))[0]
        expected = warped.softmax(-1)
        kept = int((expected > 0).sum())
        assert kept <= most_kept and (most_kept == 32 or kept > most_kept // 8)
        share = torch.bincount(draws(logits, params, 20_000), minlength=1000) / 20_000
        assert float(share[expected == 0].sum()) == 0.0  # never a token outside the nucleus
        distance = float((share - expected).abs().sum()) / 2
        assert distance < 0.03 + 0.005 * kept**0.5, (spread, kept, distance)


def test_a_draw_spans_exactly_hf_s_nucleus() -> None:
    """The uniform number's two ends pick the most likely token and the least likely one
    HF's top-p keeps, on the candidate paths (32 and 256 tokens)."""
    base = torch.randn(1000, generator=torch.Generator().manual_seed(4))
    for spread, candidates in ((6.0, 32), (2.0, 256)):
        logits = base * spread
        kept = TopPLogitsWarper(0.9)(None, logits[None].clone())[0].isfinite().nonzero()[:, 0]
        least = int(kept[logits[kept].argmin()])
        probs = logits.softmax(-1)[None]
        assert candidate_draws(probs, candidates, [0.9], [0.0]) == [int(logits.argmax())]
        assert candidate_draws(probs, candidates, [0.9], [1 - 1e-7]) == [least]

"""The prefill pacer: a step with prefill stays within `multiple` decoders' steps."""

from __future__ import annotations

from inference.engine.pacing import PrefillPacer, _bucket, chunk_fitting


def step_seconds(rows: int) -> float:
    """A cost model like the compiled runner's: flat per bucket up to 64 rows, eager above."""
    bucket = _bucket(rows)
    if bucket <= 64:
        return {1: 0.020, 2: 0.021, 4: 0.022, 8: 0.024, 16: 0.028, 32: 0.040, 64: 0.055}[bucket]
    return 0.060 + 0.002 * rows


def run(pacer: PrefillPacer, decoders: int, steps: int) -> list[int]:
    """Budgets given over `steps` steps that each use their whole budget."""
    budgets = []
    for _ in range(steps):
        tokens = pacer.budget(decoders)
        budgets.append(tokens)
        pacer.observe(decoders, tokens, step_seconds(decoders + tokens))
    return budgets


def test_nobody_decoding_gets_the_whole_budget() -> None:
    assert PrefillPacer(max_tokens=512).budget(0) == 512


def test_unknown_costs_start_small_then_fill_the_cheap_bucket() -> None:
    pacer = PrefillPacer(max_tokens=512, multiple=1.6, min_tokens=8)
    budgets = run(pacer, 31, 6)
    assert budgets[0] == 8  # nothing measured near 31 rows yet
    # 31 + 33 = 64 rows cost 0.055 s against 0.040 for the decoders' 32: within 1.6×; the
    # next bucket (eager) would not be.
    assert budgets[-1] == 33
    assert step_seconds(31 + budgets[-1]) <= 1.6 * step_seconds(31)


def test_a_tighter_multiple_keeps_prefill_out_of_a_dearer_bucket() -> None:
    pacer = PrefillPacer(max_tokens=512, multiple=1.2, min_tokens=8)
    pacer.observe(31, 0, step_seconds(31))  # the decoders' own step, measured alone
    budgets = run(pacer, 31, 6)
    assert budgets[-1] == 8  # the floor: 64 rows cost 1.375× the decoders' 32


def test_a_floor_that_crosses_into_a_bucket_fills_it_when_steps_are_padded() -> None:
    """Compiled steps run padded to their bucket: once the floor puts a step in the 64-row
    bucket, its other rows cost nothing more, so they are the prompt's too."""
    pacer = PrefillPacer(max_tokens=512, multiple=1.2, min_tokens=8, reference_rows=32)
    pacer.observe(31, 0, step_seconds(31))
    assert pacer.budget(29) == 8  # not padded (an eager runner pays by the row)
    pacer.seed({rows: step_seconds(rows) for rows in (1, 2, 4, 8, 16, 32, 64)})
    assert pacer.padded
    assert pacer.budget(29) == 64 - 29  # 64 rows cost 1.375x the decoders' 32: the floor's bucket
    assert pacer.budget(20) == 32 - 20  # the floor stays in the decoders' bucket: filled to it


def test_without_a_decode_only_step_the_paid_bucket_is_filled() -> None:
    """The floor already puts 31 decoders in the 64-row bucket: filling it costs nothing more."""
    pacer = PrefillPacer(max_tokens=512, multiple=1.2, min_tokens=8)
    assert run(pacer, 31, 6)[-1] == 33


def test_a_bucket_never_measured_alone_takes_its_neighbours_cost() -> None:
    pacer = PrefillPacer(max_tokens=512)
    pacer.observe(13, 8, step_seconds(21))  # bucket 32 measured, 16 never alone
    assert pacer.decoders_cost(16) == step_seconds(21)
    assert pacer.budget(13) == 32 - 13


def test_unmeasured_larger_buckets_are_bounded_by_measured_ones() -> None:
    pacer = PrefillPacer(max_tokens=512)
    pacer.observe(31, 481, 1.2)  # 31 decoders beside a 481-token chunk
    pacer.observe(31, 0, 0.04)
    assert pacer.estimate(64) == 1.2  # bounded above by the 512-row step
    assert pacer.budget(31) == 8  # so no prefill beyond the floor until 64 is measured


def test_a_prefill_only_step_teaches_nothing() -> None:
    """Without decoders' attention it is cheaper than a mixed step of its rows: as a bound
    on an unmeasured bucket it would let prefill into an eager step."""
    pacer = PrefillPacer(max_tokens=512)
    pacer.observe(0, 512, 0.05)
    assert pacer.seconds == {}


def test_no_multiple_means_no_pacing() -> None:
    pacer = PrefillPacer(max_tokens=512, multiple=None)
    pacer.observe(31, 0, 0.05)
    assert pacer.budget(31) == 512


def test_few_decoders_may_slow_to_a_full_engines_step() -> None:
    """With one decoder, prompts fill the rows a full engine's step (32 decoders) allows,
    once that step's cost is known (seeded from the compiled warm-up, measured later)."""
    pacer = PrefillPacer(max_tokens=512, multiple=1.6, min_tokens=8, reference_rows=32)
    pacer.observe(1, 0, step_seconds(1))
    assert pacer.budget(1) == 8  # the full engine's step is not known yet: its own bucket
    pacer.seed({rows: step_seconds(rows) for rows in (1, 2, 4, 8, 16, 32, 64)})
    assert pacer.seconds[1] == step_seconds(1)  # its own measurement is kept
    # 64 rows cost 0.055 s, within 1.6 × 0.040 (32 rows); 128 would be eager.
    assert pacer.budget(1) == 63
    assert pacer.budget(31) == 33  # a full engine is paced as before


def test_a_short_prompt_may_go_alone_when_its_step_costs_at_most_the_multiple() -> None:
    pacer = PrefillPacer(max_tokens=512, multiple=1.6, reference_rows=32)
    assert pacer.alone_tokens(31) == 0  # nothing known
    pacer.observe(31, 0, 0.160)  # the decoders' step
    pacer.observe(0, 37, 0.150)  # a 37-token prompt alone (bucket 64)
    pacer.observe(0, 100, 0.300)  # a 100-token prompt alone (bucket 128): dearer
    assert pacer.alone_tokens(31) == 64
    assert pacer.alone_tokens(0) == 0  # nobody decoding: every step is prefill's anyway
    pacer.observe(31, 0, 0.100)  # the decoders' step got cheaper: 64 rows alone still fit
    assert pacer.alone_tokens(31) == 64  # 0.150 <= 1.6 x 0.138 (the step's mean, smoothed)
    for _ in range(10):
        pacer.observe(31, 0, 0.080)  # ... until 1.6 decode steps are less than it costs
    assert pacer.alone_tokens(31) == 0


def test_a_chunk_late_in_a_long_prompt_is_limited_by_the_keys_it_attends() -> None:
    """Steps cost their bucket plus a term per attended key (chunk token x position)."""
    per_key = 0.040 / 66_000  # 33 tokens at position ~2,000 add a decode step's worth
    pacer = PrefillPacer(max_tokens=512, multiple=1.6, reference_rows=32)
    pacer.seed({rows: step_seconds(rows) for rows in (1, 2, 4, 8, 16, 32, 64)})
    assert pacer.keys(31, 33) is None  # the per-key cost is not known yet
    start = 0
    for _ in range(30):
        tokens = pacer.budget(31)
        keys = pacer.keys(31, tokens)
        size = tokens if keys is None else min(tokens, max(8, keys // (start + tokens)))
        end = start + size
        seconds = step_seconds(31 + size) + per_key * size * end
        pacer.observe(31, size, seconds, size * end)
        start = end
    assert abs(pacer.key_seconds - per_key) < 0.05 * per_key
    allowed = 1.6 * step_seconds(31)
    keys = pacer.keys(31, 33)
    assert abs(pacer.seconds[64] - step_seconds(64)) < 0.001  # the bucket, net of its keys
    now = 1.6 * pacer.seconds[32]  # the decoders' step as the mixed steps say it costs now
    assert abs(now - allowed) < 1e-4
    assert keys == int((now - pacer.mixed_cost(64, 31)) / pacer.key_seconds)
    # At position 1,900 a chunk may take what fits: the step stays within the multiple.
    size = min(33, keys // 1_933)
    assert step_seconds(31 + size) + per_key * size * (1_900 + size) <= allowed
    assert pacer.keys(0, 512) is None  # nobody decoding: no limit
    pacer.key_seconds = 0.0  # keys that cost nothing measurable
    assert pacer.keys(31, 33) is None


def test_the_measured_chunk_attention_bounds_keys_the_fit_cannot_see() -> None:
    """Seeded with the chunk attention's own cost per key, the pacer bounds a late chunk's
    keys before any step is fitted, and a fit that reads 0 (noise over a small term) or less
    than the floor does not lift the bound; a fit above the floor is taken."""
    floor = 0.040 / 66_000
    pacer = PrefillPacer(max_tokens=512, multiple=1.6, reference_rows=32)
    pacer.seed({rows: step_seconds(rows) for rows in (1, 2, 4, 8, 16, 32, 64)}, None, floor)
    allowed = 1.6 * step_seconds(31)
    bound = int((allowed - step_seconds(64)) / floor)
    assert pacer.keys(31, 33) == bound
    for keys in (10_000, 40_000, 10_000, 40_000):  # the same time whatever the keys: slope 0
        pacer.observe(31, 33, step_seconds(64), keys)
    assert pacer.key_seconds == 0.0
    assert pacer.per_key == floor
    at_floor = pacer.keys(31, 33)
    assert at_floor is not None  # unfloored, a slope of 0 meant no bound at all
    pacer.key_seconds = 3 * floor
    assert pacer.per_key == 3 * floor
    assert pacer.keys(31, 33) < at_floor


def test_a_burst_is_not_paced_while_as_many_start_as_decode() -> None:
    """15 decoding beside 17 prompts still to feed: prefill takes the whole step, nobody
    goes alone and no key limit applies; with one prompt among 31 decoders pacing holds."""
    pacer = PrefillPacer(max_tokens=512, multiple=1.6, reference_rows=32)
    pacer.seed({rows: step_seconds(rows) for rows in (1, 2, 4, 8, 16, 32, 64)})
    pacer.observe(31, 0, 0.040)
    pacer.key_seconds = 1e-6
    assert pacer.budget(15, starting=17) == 512
    assert pacer.keys(15, 512, starting=17) is None
    assert pacer.alone_tokens(15, starting=17) == 0
    assert pacer.budget(16, starting=16) == 512
    assert pacer.budget(31, starting=1) == 33
    assert pacer.keys(31, 33, starting=1) is not None
    assert pacer.alone_tokens(31, starting=1) == 64  # 0.055 alone <= 1.6 x 0.040
    assert PrefillPacer(max_tokens=512, multiple=None).budget(31, starting=1) == 512


def test_the_compiled_buckets_seeded_give_a_full_engine_a_smaller_mixed_step() -> None:
    """Seeded with the graphs' buckets (48 between 32 and 64), 31 decoders at a tighter
    multiple get the 48-row step the 64-row one was too dear for."""
    costs = {1: 0.020, 2: 0.021, 4: 0.022, 8: 0.024, 16: 0.028, 32: 0.040, 48: 0.047, 64: 0.055}
    pacer = PrefillPacer(max_tokens=512, multiple=1.2, min_tokens=8, reference_rows=32)
    pacer.seed(costs)
    assert pacer.buckets == tuple(sorted(costs))
    assert pacer.bucket(33) == 48 and pacer.bucket(49) == 64 and pacer.bucket(600) == 1024
    assert pacer.budget(31) == 48 - 31  # 48 rows: 1.175x the decoders' 32; 64 rows: 1.375x
    pacer.observe(31, 17, 0.047)
    assert pacer.seconds[48] == 0.047  # timed under its own bucket, not under 64
    assert pacer.decoders_cost(48) == 0.047


def test_prefill_only_timings_seed_the_alone_steps_apart() -> None:
    """The graphs' warm-up times a big bucket twice: beside 32 decoders (the mixed step) and
    as one prompt alone. A 40-token prompt among 31 decoders goes alone when its 48-row
    prefill-only step fits the multiple, though the mixed 48-row step would not."""
    mixed = {1: 0.020, 8: 0.024, 32: 0.040, 48: 0.070, 64: 0.080}
    alone = {48: 0.030, 64: 0.038}
    pacer = PrefillPacer(max_tokens=512, multiple=1.4, reference_rows=32)
    pacer.seed(mixed, alone)
    assert pacer.alone == {1: 0.020, 8: 0.024, 32: 0.040, 48: 0.030, 64: 0.038}
    assert pacer.seconds == mixed
    assert pacer.alone_tokens(31) == 64  # 0.038 <= 1.4 x 0.040
    unseparated = PrefillPacer(max_tokens=512, multiple=1.4, reference_rows=32)
    unseparated.seed(mixed)
    assert unseparated.alone_tokens(31) == 32  # 48 rows at 0.070 > 0.056: mixed steps


def test_the_decoders_growing_step_is_learned_from_mixed_steps() -> None:
    """31 decoders' step grows with their histories while a long prompt prefills beside
    them and no step is decode-only: each mixed step says what the decoders' own step costs
    now (its time less the prefill-only delta), so every bucket's estimate follows, the
    64-row one last used long ago included."""
    mixed = {1: 0.009, 8: 0.019, 32: 0.028, 48: 0.036, 64: 0.033}
    alone = {1: 0.009, 8: 0.019, 32: 0.017, 48: 0.020, 64: 0.023}
    pacer = PrefillPacer(max_tokens=512, multiple=1.4, reference_rows=32)
    pacer.seed(mixed, alone)
    assert abs(pacer.mixed_cost(64, 31) - 0.034) < 1e-9  # 28 ms + (23 - 17) ms
    for _ in range(40):  # 48-row steps at 44 ms: the decoders' own share is now 41 ms
        pacer.observe(31, 17, 0.044)
    assert abs(pacer.seconds[32] - 0.041) < 1e-4
    assert abs(pacer.mixed_cost(64, 31) - 0.047) < 1e-4
    assert pacer.budget(31) == 64 - 31  # 47 ms <= 1.4 x 41 ms
    unseeded = PrefillPacer(max_tokens=512, multiple=1.4, reference_rows=32)
    unseeded.observe(31, 0, 0.028)
    unseeded.observe(31, 17, 0.044)
    assert unseeded.seconds == {32: 0.028, 64: 0.044}  # no prefill-only times: nothing inferred


def test_a_bigger_bucket_timed_cheaper_alone_does_not_inflate_the_decoders_step() -> None:
    """Warm-up timings on a noisy 2-core AMD EPYC Zen 3 read the 40-row bucket alone at
    76 ms and the 32-row one at 86. A 40-row mixed step then said the decoders' own step
    cost 10 ms more than the whole step, and the reference (with it the steps allowed) grew
    step after step; more rows are never taken to cost less."""
    mixed = {32: 0.098, 40: 0.108, 48: 0.136, 64: 0.140}
    alone = {32: 0.086, 40: 0.076, 48: 0.089, 64: 0.109}
    pacer = PrefillPacer(max_tokens=512, multiple=1.4, reference_rows=32)
    pacer.seed(mixed, alone)
    for _ in range(40):
        pacer.observe(31, 9, 0.110)
    assert abs(pacer.seconds[32] - 0.110) < 1e-4
    assert pacer.mixed_cost(40, 31) == pacer.seconds[32]


def test_late_in_a_long_prompt_a_smaller_bucket_that_leaves_room_for_keys_is_taken() -> None:
    """The budget's bucket (the largest within the multiple) leaves keys for 14 tokens at
    position 1,500; `plan` takes the 48-row bucket, whose chunk feeds 17 within both bounds,
    and that step still costs no more than the multiple allows."""
    per_key = 0.040 / 66_000
    compiled = {1: 0.020, 2: 0.021, 4: 0.022, 8: 0.024, 16: 0.028, 32: 0.040, 40: 0.043}
    compiled |= {48: 0.046, 64: 0.055}
    pacer = PrefillPacer(max_tokens=512, multiple=1.7, reference_rows=32)
    pacer.seed(compiled, None, per_key)
    allowed = 1.7 * compiled[32]
    start = 1_500

    tokens = pacer.budget(31)
    keys = pacer.keys(31, tokens)
    planned_tokens, planned_keys = pacer.plan(31, start)
    fed = min(planned_tokens, chunk_fitting(start, planned_keys))

    assert (tokens, min(tokens, chunk_fitting(start, keys))) == (33, 14)
    assert (planned_tokens, fed) == (17, 17)
    assert compiled[48] + per_key * fed * (start + fed) <= allowed
    # Early in the prompt keys cost little: the budget's bucket feeds the most, as before.
    assert pacer.plan(31, 0) == (tokens, keys)
    # Nothing to feed, or nobody decoding: budget and keys as they are.
    assert pacer.plan(31, None) == (tokens, keys)
    assert pacer.plan(0, start) == (512, None)


def test_chunk_fitting_is_the_largest_chunk_within_the_keys() -> None:
    assert chunk_fitting(1_500, None) == 1 << 30
    assert chunk_fitting(1_500, 0) == 0
    for start, keys in ((0, 64), (1_500, 30_000), (7, 1)):
        n = chunk_fitting(start, keys)
        assert n * (start + n) <= keys < (n + 1) * (start + n + 1)

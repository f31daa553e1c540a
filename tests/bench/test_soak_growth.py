"""The soak's bars: memory judged by its growth per hour, everything else by its growth in all."""

import math
from collections.abc import Callable

from bench.soak import comparison_window, over_bar, reply_slots
from bench.soak_sampler import Sampler, growth, interval_rates


def rows(minutes: int, rss: Callable[[int], float], keys: Callable[[int], int]) -> list[dict]:
    return [
        {"t": m * 60.0, "rss_mb.daphne": rss(m), "redis_keys": keys(m), "load_average_1m": 1.0}
        for m in range(minutes + 1)
    ]


def test_growth_is_measured_between_window_medians_and_per_hour():
    samples = rows(120, rss=lambda m: 1000.0 + m / 6, keys=lambda m: 50)
    grown = growth(samples, warmup=600.0, window=60.0)
    rss = grown["rss_mb.daphne"]
    assert rss["after_warmup"] == 1000.0 + 10 / 6
    assert rss["at_end"] == 1000.0 + 120 / 6
    hours = (120 - 10) / 60  # one sample per window: minutes 10 and 120
    assert abs(rss["growth_per_hour"] - rss["growth"] / hours) < 1e-3
    assert grown["redis_keys"]["growth"] == 0.0
    assert "load_average_1m" not in grown


def test_a_slow_steady_leak_fails_the_memory_bar_that_a_flat_series_passes():
    leak = growth(
        rows(120, rss=lambda m: 1000.0 * (1 + 0.025 * m / 60), keys=lambda m: 50), 600.0, 60.0
    )
    flat = growth(rows(120, rss=lambda m: 1000.0 + (m % 3), keys=lambda m: 50 + m % 2), 600.0, 60.0)
    assert leak["rss_mb.daphne"]["growth"] < 0.05  # under the old bar in all...
    assert over_bar("rss_mb.daphne", leak["rss_mb.daphne"])  # ...but 2.5% an hour
    assert not over_bar("rss_mb.daphne", flat["rss_mb.daphne"])
    assert not over_bar("redis_keys", flat["redis_keys"])


def test_other_series_are_judged_by_their_growth_in_all():
    grown = growth(rows(120, rss=lambda m: 1000.0, keys=lambda m: 50 + m // 10), 600.0, 60.0)
    assert over_bar("redis_keys", grown["redis_keys"])
    assert not over_bar("rss_mb.daphne", grown["rss_mb.daphne"])


def test_a_swinging_series_is_judged_by_its_level_and_a_rising_one_still_fails():
    """Redis keys of live streams swing 175-205 over a quarter hour: a minute at a trough against a
    minute at a peak read +13%; medians over a tenth of the run see the level."""
    samples = [
        {
            "t": t,
            "redis_keys": round(190 + 15 * math.sin(2 * math.pi * t / 840)),
            "rising_keys": 190 + t / 600,
        }
        for t in range(0, 7201, 10)
    ]
    warmup = 600.0
    minute = growth(samples, warmup, 60.0)
    assert over_bar("redis_keys", minute["redis_keys"])  # +6.6%: a trough against a rise
    window = comparison_window(7200 - warmup, 10.0)
    assert window == 660.0
    grown = growth(samples, warmup, window)
    assert not over_bar("redis_keys", grown["redis_keys"])
    assert over_bar("rising_keys", grown["rising_keys"])  # +12 keys an hour: a leak
    assert comparison_window(300.0, 10.0) == 60.0  # short runs keep a minute


def test_interval_rates_tell_cores_steal_and_the_engine_apart():
    before = {
        "cpu_total": 100.0,
        "steal": 1.0,
        "cpu_s.daphne": 10.0,
        "tandem_engine_generated_tokens_total": 1000.0,
        "tandem_engine_inter_token_latency_seconds_sum": 5.0,
        "tandem_engine_inter_token_latency_seconds_count": 900.0,
    }
    after = {
        "cpu_total": 120.0,  # two cores for 10 s
        "steal": 3.0,
        "cpu_s.daphne": 17.5,
        "tandem_engine_generated_tokens_total": 1500.0,
        "tandem_engine_inter_token_latency_seconds_sum": 10.0,
        "tandem_engine_inter_token_latency_seconds_count": 1400.0,
    }
    rates = interval_rates(before, after, 10.0)
    assert rates == {
        "cores.daphne": 0.75,
        "steal_share": 0.1,
        "engine_tok_s": 50.0,
        "engine_itl_ms": 10.0,
    }
    idle = interval_rates(after, after, 10.0)
    assert idle["engine_itl_ms"] is None and idle["steal_share"] is None


def test_a_sampler_measures_a_real_process_and_its_rates_are_never_judged():
    import os
    import threading

    from django.conf import settings

    sampler = Sampler(
        {"bench": os.getpid()},
        settings.REDIS_URL,
        lambda: 3,
        threading.Event(),
        cpu_only={"again": lambda: [os.getpid()], "none": lambda: []},
    )
    first = sampler.sample()
    sum(i * i for i in range(2_000_000))  # some CPU for the second sample to see
    second = sampler.sample()
    assert "cores.bench" not in first and second["cores.bench"] > 0
    assert second["cores.again"] > 0 and second["cores.none"] == 0
    assert second["open_files.bench"] > 0 and second["rss_mb.bench"] > 0
    kinds = {key: n for key, n in second.items() if key.startswith("fds.bench.")}
    # The same descriptors but the one each listing of /proc/<pid>/fd holds itself.
    assert sum(kinds.values()) == second["open_files.bench"] - 1
    # The sampler's own connection, found held by this process, as it listed the clients.
    assert second["redis_clients.bench"] >= 1
    assert [c for c in sampler.clients if c["owner"] == "bench" and c["cmd"] == "client|list"]
    samples = [dict(second, t=t * 60.0, **{"cores.bench": t}) for t in range(30)]
    grown = growth(samples, warmup=60.0, window=120.0)
    assert "rss_mb.bench" in grown
    unjudged = ("cores.", "steal", "engine_", "fds.", "redis_clients.")
    assert not [key for key in grown if key.startswith(unjudged)]


def test_replies_are_grouped_by_the_minutes_they_started_in():
    from datetime import UTC, datetime, timedelta

    since = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)

    def reply(minute: float, first: float, total: float) -> tuple:
        started = since + timedelta(minutes=minute)
        return started, started + timedelta(seconds=first), started + timedelta(seconds=total)

    rows = [reply(-1, 9, 9), reply(1, 0.1, 1.0), reply(9.9, 0.3, 3.0), reply(2, 0.2, 2.0)]
    rows.append(reply(25, 0.5, 1.5))
    assert reply_slots(rows, since) == [
        {"from_minute": 0, "replies": 3, "median_first_token_s": 0.2, "median_reply_s": 2.0},
        {"from_minute": 20, "replies": 1, "median_first_token_s": 0.5, "median_reply_s": 1.5},
    ]


def test_connections_are_judged_by_their_high_water_mark():
    """Requests and kept threads hold connections while they run: 7 and 9 in turn all run, more
    often 9 late (window medians 7 then 9); a leak sets new highs."""
    warmup, window = 600.0, 720.0

    def toggling(t: int) -> int:
        return 9 if (t // 10) % (3 if t < 3600 else 2) == 0 else 7

    grown = growth(
        [{"t": float(t), "db_connections": toggling(t)} for t in range(0, 7201, 10)], warmup, window
    )
    held = grown["db_connections"]
    assert held["judged_by"] == "high-water"
    assert (held["after_warmup"], held["at_end"]) == (9, 9)
    assert not over_bar("db_connections", held)

    leaking = [
        {"t": float(t), "db_connections": toggling(t) + t // 1200} for t in range(0, 7201, 10)
    ]
    grown = growth(leaking, warmup, window)["db_connections"]
    assert grown["at_end"] > grown["after_warmup"]
    assert over_bar("db_connections", grown)

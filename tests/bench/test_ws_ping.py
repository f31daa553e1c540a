"""The WebSocket round trips the tandem-http peer times: their figures, and a real socket's."""

from __future__ import annotations

import time

import pytest

from bench.session_cookie import signed_in
from bench.ws_ping import PATH, Pinger, Pings, RoundTrips, log_line, round_trips
from tests.support import database
from tests.support.processes import child_env


def test_round_trips_give_percentiles_max_count_and_lost() -> None:
    figures = round_trips([0.010, 0.020, 0.030, 0.040, 1.0], lost=2)
    assert figures.count == 5
    assert figures.p50_ms == pytest.approx(30.0)
    assert figures.p99_ms == pytest.approx(40.0 + 0.96 * 960.0)  # interpolated toward the max
    assert figures.max_ms == pytest.approx(1000.0)
    assert figures.lost == 2


def test_no_round_trips_have_no_figures() -> None:
    assert round_trips([], lost=3) == RoundTrips(0, None, None, None, 3)


def test_log_line_shows_both_kinds_and_what_was_lost() -> None:
    pings = Pings(2.0, round_trips([0.001, 0.003]), round_trips([], lost=1))
    line = log_line("idle", pings)
    assert "ping p50     2.0 p99     3.0 max     3.0 ms (n=2)" in line
    assert "echo none (lost 1)" in line


@pytest.mark.django_db(transaction=True)
def test_a_signed_in_socket_times_pings_and_echoes_on_a_real_daphne(daphne) -> None:
    # The cookie is made as the bench makes it: a child process with the server's environment.
    cookie = signed_in(child_env(DATABASE_URL=database.test_database_url()), "pinger")
    with Pinger(f"{daphne.ws_url}{PATH}", daphne.url, cookie) as pinger:
        result, pings = pinger.measure(lambda: time.sleep(1.5) or "done")
        again = pinger.idle(0.5)
    assert result == "done"
    for figures in (pings.ping, pings.echo, again.ping, again.echo):
        assert figures.count >= 1 and figures.lost == 0, pings
        assert 0 < figures.p50_ms <= figures.p99_ms <= figures.max_ms
    assert pings.seconds >= 1.5

"""Overload: 200 turns at once from 20 users against a web process with a small engine.

The server has 8 decoding slots and 8 waiting places, and each user may have 3 replies in
flight, so most turns must be refused: with a clean 429 (a reason and Retry-After), never a
5xx, and every accepted turn must still finish, leaving nothing behind in the engine.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from chat.models import Part
from tests.chaos.conftest import SERVER_ENV, make_visitor, record_figures, unfinished, wait_terminal
from tests.conftest import start_daphne, wait_for_model
from tests.support.http import scrape_metric
from tests.support.processes import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.model, pytest.mark.django_db(transaction=True)]

USERS, TURNS_EACH = 20, 10
SLOTS, WAITING, PER_USER = 8, 8, 3
REASONS = {"replies in progress": "per_user_limit", "engine is busy": "engine_busy"}
DRAIN_BOUND = 90.0  # seconds from the last answer until every accepted reply is final


def reason(body) -> str:
    error = body.get("error", "") if isinstance(body, dict) else ""
    return next((name for words, name in REASONS.items() if words in error), f"other: {body}")


def test_200_simultaneous_turns_get_counted_429s_and_leave_no_orphans(service_logs, private_redis):
    server = start_daphne(
        "daphne-overload",
        service_logs,
        REDIS_URL=private_redis.url,
        TANDEM_MAX_RUNNING=str(SLOTS),
        TANDEM_MAX_WAITING=str(WAITING),
        TANDEM_MAX_TURNS_IN_FLIGHT=str(PER_USER),
        TANDEM_CHAT_MAX_NEW_TOKENS="8",
        TANDEM_CHAT_TEMPERATURE="0",
        **SERVER_ENV,
    )
    try:
        wait_for_model(server)
        visitors = [make_visitor("load") for _ in range(USERS)]
        conversations = [visitor.conversation() for visitor in visitors]
        total = USERS * TURNS_EACH
        start = threading.Barrier(total)

        def fire(number: int):
            user = number % USERS
            start.wait(30)
            try:
                return visitors[user].post_turn(
                    server, conversations[user], f"Say hello to guest number {number}."
                )
            except OSError as error:  # refused or reset: counted, never a crash of the test
                return 0, {}, repr(error)

        started = time.monotonic()
        with ThreadPoolExecutor(total) as pool:
            answers = list(pool.map(fire, range(total)))
        burst_seconds = time.monotonic() - started

        statuses = Counter(status for status, _, _ in answers)
        refused = [(headers, body) for status, headers, body in answers if status == 429]
        refusals = Counter(reason(body) for _, body in refused)
        accepted_parts = [
            part["id"]
            for status, _, body in answers
            if status == 201
            for part in body["reply"]["parts"]
        ]
        drain_seconds = wait_terminal(accepted_parts, DRAIN_BOUND, "accepted replies to finish")

        def engine_load() -> int:
            running = scrape_metric(server, "tandem_engine_running_requests")
            return int(running + scrape_metric(server, "tandem_engine_waiting_requests"))

        wait_until(lambda: engine_load() == 0, 10, "the engine to be empty")
        engine_after = engine_load()
        assert server.service.alive(), server.service.log_text()
    finally:
        server.service.stop()

    texts = Counter(Part.objects.filter(pk__in=accepted_parts).values_list("state", flat=True))
    server_errors = sum(count for status, count in statuses.items() if status >= 500)
    figures = record_figures(
        "overload",
        f"{total} turns from {USERS} users in {burst_seconds:.1f} s: "
        f"{statuses[201]} accepted, {statuses[429]} refused with 429 ({dict(refusals)}), "
        f"{server_errors} 5xx, {statuses[0]} connection errors; accepted replies final after "
        f"{drain_seconds:.1f} s "
        f"({dict(texts)}); engine running+waiting after: {engine_after}",
        requests=total,
        users=USERS,
        engine_slots=SLOTS,
        engine_waiting_places=WAITING,
        per_user_limit=PER_USER,
        statuses={str(status): count for status, count in sorted(statuses.items())},
        accepted=statuses[201],
        refused_429=statuses[429],
        refused_429_by_reason=dict(refusals),
        server_errors_5xx=server_errors,
        connection_errors=statuses[0],
        connection_error_kinds=sorted({body for status, _, body in answers if status == 0}),
        burst_seconds=round(burst_seconds, 2),
        accepted_text_parts_by_state=dict(texts),
        seconds_until_accepted_final=round(drain_seconds, 2),
        bound_seconds_until_accepted_final=DRAIN_BOUND,
        engine_running_plus_waiting_after=engine_after,
        unfinished_parts_after=len(unfinished(accepted_parts)),
    )
    assert set(statuses) <= {201, 429}, statuses
    assert statuses[201] + statuses[429] == total
    assert statuses[201] >= SLOTS and statuses[429] > 0
    assert set(refusals) <= set(REASONS.values()), refusals
    assert all(int(headers["Retry-After"]) >= 1 for headers, _ in refused)
    assert texts == {Part.State.SUCCEEDED: statuses[201]}, texts
    assert figures["engine_running_plus_waiting_after"] == 0
    assert figures["unfinished_parts_after"] == 0

"""The per-user cap on replies in progress holds across web processes.

Two real Daphnes (synthetic tokens, slow enough that no reply finishes during the burst) share
the database; 200 turns of one user at once, alternating between them, must let exactly
TANDEM_MAX_TURNS_IN_FLIGHT through and refuse the rest with 429. Each process admits its own
turns one at a time; only the user's row lock in the turn's transaction orders the two. A cap of
1 makes the two processes' first turns race: without the lock, PostgreSQL let 2 through (2 runs
of 2); SQLite's BEGIN IMMEDIATE orders them by itself.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from chat.models import Message, Part
from tests.chat.test_sse import signed_in
from tests.conftest import serving

pytestmark = [pytest.mark.django_db(transaction=True)]

CAP = 1
TURNS = 200
SLOW = {
    "TANDEM_ENGINE_SOURCE": "synthetic",
    "TANDEM_SYNTHETIC_TOKENS_PER_S": "5",
    "TANDEM_MAX_TURNS_IN_FLIGHT": str(CAP),
    "TANDEM_CHAT_MAX_NEW_TOKENS": "500",
}


def test_a_burst_over_two_processes_never_passes_the_cap(service_logs):
    with (
        serving("web-cap-a", service_logs, timeout=120, **SLOW) as first,
        serving("web-cap-b", service_logs, timeout=120, **SLOW) as second,
    ):
        session = signed_in(first, "burst-user")  # its cookies hold on either port
        cookies = session.cookies.get_dict()

        def post(index: int) -> int:
            server = (first, second)[index % 2]
            response = requests.post(
                f"{server.url}/c/new/turns",
                json={"text": f"turn {index}", "image": False},
                cookies=cookies,
                headers={"X-CSRFToken": cookies["csrftoken"], "Referer": server.url},
                timeout=120,
            )
            return response.status_code

        with ThreadPoolExecutor(max_workers=40) as pool:
            statuses = list(pool.map(post, range(TURNS)))

        unfinished = [Part.State.QUEUED, Part.State.STREAMING]
        in_flight = Message.objects.filter(
            role=Message.Role.ASSISTANT, parts__state__in=unfinished
        ).count()
        replies = Message.objects.filter(role=Message.Role.ASSISTANT).count()
    assert statuses.count(201) == CAP, sorted(set(statuses))
    assert statuses.count(429) == TURNS - CAP
    assert replies == in_flight == CAP

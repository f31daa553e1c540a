"""The ops page on a real Daphne with the real model: the feed's engine figures come from real
generations, and in Chromium the page refreshes itself without a reload."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from chat.models import Part
from tests.chat_ui.conftest import shot
from tests.ops.conftest import make_reply, session_cookie
from tests.support.http import get, post_json

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

PROMPTS = ["The capital of France is", "One, two, three,", "Water boils at"]


def test_the_feed_reports_the_engine_and_its_last_minute(engine_server, staff):
    tokens = []
    for prompt in PROMPTS:
        status, _, body = post_json(
            f"{engine_server.url}/generate",
            {"inputs": prompt, "parameters": {"max_new_tokens": 4, "details": True}},
        )
        assert status == 200, body
        tokens.append(body["details"]["generated_tokens"])
    cookie = {"Cookie": session_cookie(staff)}
    status, _, snapshot = get(f"{engine_server.url}/ops/status.json", headers=cookie)
    assert status == 200, snapshot
    engine = snapshot["engine"]
    assert engine["state"] == "ready" and engine["name"] and engine["device"] == "cpu"
    assert engine["stats"]["tokens_generated"] >= sum(tokens) == 12
    # At least the last request lies inside the one-minute window (a busy 2-core machine
    # can take longer than a minute for all three).
    recent = engine["recent"]
    assert recent["tokens"] >= tokens[-1] and recent["requests_started"] >= 1
    assert recent["tokens_per_second"] == pytest.approx(recent["tokens"] / 60, abs=0.01)
    ttft, itl = recent["ttft_ms"], recent["itl_ms"]
    assert 0 < ttft["p50"] <= ttft["p95"] and 0 < itl["p50"] <= itl["p95"]
    assert "model" not in {banner["component"] for banner in snapshot["banners"]}
    assert f'data-field="engine.name">{engine["name"]}</dd>' in snapshot["html"]
    # Nobody but staff reads it from the real server either.
    assert get(f"{engine_server.url}/ops/status.json")[0] == 403


@pytest.mark.browser
def test_the_page_refreshes_itself_without_a_reload(daphne, staff, page):
    cookie_value = session_cookie(staff).split("=", 1)[1]
    page.context.add_cookies([{"name": "sessionid", "value": cookie_value, "url": daphne.url}])
    page.set_viewport_size({"width": 1280, "height": 1000})
    page.goto(f"{daphne.url}/ops/")
    complete = page.locator('[data-field="messages.complete"]')
    before = int(complete.inner_text())
    stamp = page.locator("#ops-updated").get_attribute("datetime")
    page.evaluate("window.__sameDocument = true")
    make_reply(staff, timezone.now(), [Part.State.SUCCEEDED, Part.State.SUCCEEDED])
    expect(complete).to_have_text(str(before + 1), timeout=30_000)
    expect(page.locator("#ops-live")).to_have_attribute("data-state", "live")
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    assert page.locator("#ops-updated").get_attribute("datetime") != stamp
    assert int(page.locator("#ops-panels").get_attribute("data-refreshes")) >= 1
    shot(page, "ops-page")

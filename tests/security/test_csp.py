"""The Content-Security-Policy: its header on every page, and Chromium running the chat, the
admin and the ops page under it with no violation, while an injected inline script is blocked
and reported to /csp-report."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from playwright.sync_api import Page, expect

from tests.chat_ui.conftest import make_user, open_chat, sign_in
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# Every violation the page sees, from its first script on (a reload's too).
WATCH = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push({directive: e.effectiveDirective, blocked: e.blockedURI});
});
"""
INJECT = """() => {
  const script = document.createElement("script");
  script.textContent = "window.__injected = true";
  document.body.appendChild(script);
  const styled = document.createElement("div");
  styled.setAttribute("style", "color: red");
  document.body.appendChild(styled);
  return getComputedStyle(styled).color;
}"""


def directives(header: str) -> dict[str, str]:
    pairs = (part.strip().split(" ", 1) for part in header.split(";") if part.strip())
    return {name: value for name, value in pairs}


def watched(page: Page) -> list[str]:
    """Console lines about the policy, collected for the whole life of the page."""
    lines: list[str] = []
    page.on("console", lambda m: lines.append(m.text) if "Content Security" in m.text else None)
    page.add_init_script(WATCH)
    return lines


def violations(page: Page) -> list[dict]:
    return page.evaluate("window.__violations")


@pytest.mark.parametrize("path", ["/accounts/login/", "/", "/keys/", "/admin/", "/ops/", "/health"])
def test_every_page_carries_the_strict_policy(path):
    staff = get_user_model().objects.create_user("csp-staff", password="x", is_staff=True)
    client = Client()
    client.force_login(staff)
    response = client.get(path)
    policy = directives(response.headers["Content-Security-Policy"])
    assert "Content-Security-Policy-Report-Only" not in response.headers
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["connect-src"] == "'self'"
    assert policy["img-src"] == "'self'"
    assert policy["object-src"] == "'none'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["report-uri"] == "/csp-report"
    assert "unsafe-inline" not in response.headers["Content-Security-Policy"]


def test_report_only_is_a_setting():
    from django.conf import settings

    policy = settings.CONTENT_SECURITY_POLICY
    with override_settings(
        CONTENT_SECURITY_POLICY=None, CONTENT_SECURITY_POLICY_REPORT_ONLY=policy
    ):
        response = Client().get("/accounts/login/")
    assert "Content-Security-Policy" not in response.headers
    only = directives(response.headers["Content-Security-Policy-Report-Only"])
    assert only["script-src"] == "'self'"


def test_the_report_endpoint_logs_a_violation_and_refuses_junk(caplog):
    report = {"csp-report": {"document-uri": "http://x/", "violated-directive": "script-src"}}
    client = Client(enforce_csrf_checks=True)
    response = client.post("/csp-report", json.dumps(report), content_type="application/csp-report")
    assert response.status_code == 204
    assert any(
        "csp violation" in r.getMessage() and "script-src" in r.getMessage() for r in caplog.records
    )
    assert (
        client.post("/csp-report", "not json", content_type="application/csp-report").status_code
        == 400
    )
    assert client.post("/csp-report", "x" * 20_000, content_type="text/plain").status_code == 400
    assert client.get("/csp-report").status_code == 405


@pytest.mark.browser
@pytest.mark.model
def test_the_chat_streams_under_the_policy_and_blocks_an_injected_script(
    engine_server, celery_worker, page
):
    lines = watched(page)
    user, password = make_user("csp")
    chat = open_chat(page, engine_server.url, user, password)
    chat.send("Say hello in three words.", image=True)
    assert chat.wait_final(chat.text_part) == "succeeded"
    expect(chat.image_part).to_have_attribute("data-state", "succeeded", timeout=60_000)
    picture = chat.image_part.locator("img")
    expect(picture).to_be_visible()
    assert picture.evaluate("img => img.complete && img.naturalWidth > 0")
    assert violations(page) == [] and lines == []

    color = page.evaluate(INJECT)
    assert page.evaluate("window.__injected === undefined")
    assert color != "rgb(255, 0, 0)"
    page.wait_for_function("() => window.__violations.length >= 2")
    assert {v["directive"] for v in violations(page)} == {"script-src-elem", "style-src-attr"}
    wait_until(
        lambda: "csp violation" in engine_server.service.log_text(),
        20,
        "the browser's report to reach /csp-report",
    )


@pytest.mark.browser
def test_the_admin_and_the_ops_page_run_under_the_policy(daphne, page):
    lines = watched(page)
    staff = get_user_model().objects.create_superuser("csp-admin", password="pw-csp-admin")
    sign_in(page, daphne.url, staff.username, "pw-csp-admin")
    for path in ("/admin/", "/admin/chat/part/", "/admin/axes/accessattempt/", "/ops/"):
        page.goto(f"{daphne.url}{path}")
        page.wait_for_load_state("networkidle")
        assert violations(page) == [], path
    page.wait_for_function("() => document.querySelector('#ops-live').dataset.state === 'live'")
    assert violations(page) == [] and lines == []

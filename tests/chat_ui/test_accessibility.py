"""axe-core in Chromium: the conversation, list, login and ops pages have no serious or
critical violations, wide and at 390 px.

axe-core is vendored for the tests only (tests/support/vendor/, `make vendor`) and injected
here; users never load it. Its context bypasses the CSP for that one injected script.
"""

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from tests.chat_ui.conftest import make_user, sign_in
from tests.chat_ui.seeded import add_partial_reply, rich_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE = Path(__file__).resolve().parents[1] / "support" / "vendor" / "axe-core-4.14.1" / "axe.min.js"


def serious_violations(page) -> list[str]:
    page.add_script_tag(path=str(AXE))
    found = page.evaluate(
        """async () => {
            const result = await window.axe.run(document, { resultTypes: ["violations"] });
            return result.violations
                .filter(v => v.impact === "serious" || v.impact === "critical")
                .map(v => v.id + ": " + v.help + " -> " +
                     v.nodes.slice(0, 3).map(n => n.target.join(" ")).join(" | "));
        }"""
    )
    return found


@pytest.fixture
def axe_page(chromium):
    context = chromium.new_context(bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        context.close()


@pytest.mark.parametrize("width", [1280, 390])
def test_pages_have_no_serious_axe_violations(daphne, axe_page, width):
    page = axe_page
    page.set_viewport_size({"width": width, "height": 844})
    page.goto(f"{daphne.url}/accounts/login/")
    problems = {"login": serious_violations(page)}

    user, password = make_user("staff")
    get_user_model().objects.filter(pk=user.pk).update(is_staff=True)
    convo, _ = rich_conversation(user)
    add_partial_reply(convo)
    sign_in(page, daphne.url, user.get_username(), password)
    problems["list"] = serious_violations(page)
    page.goto(f"{daphne.url}/c/{convo.pk}/")
    page.locator(".part-text .code-block").wait_for()
    page.locator(".failure-card").wait_for()
    problems["conversation"] = serious_violations(page)
    page.click("#settings-panel summary")
    problems["conversation settings"] = serious_violations(page)
    if width < 760:
        page.click("#sidebar-toggle")
        problems["conversation list open"] = serious_violations(page)
    page.goto(f"{daphne.url}/c/new")
    problems["new conversation"] = serious_violations(page)
    page.goto(f"{daphne.url}/ops/")
    page.locator("#ops-panels").wait_for()
    problems["ops"] = serious_violations(page)
    assert {name: found for name, found in problems.items() if found} == {}

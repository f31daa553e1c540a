"""Real Chromium (Debian's, through Playwright) signs in on a real Daphne."""

import pytest
from django.contrib.auth import get_user_model

pytestmark = pytest.mark.browser


@pytest.mark.django_db(transaction=True)
def test_login_page_loads_and_signs_in(daphne, page):
    get_user_model().objects.create_user("carol", password="s3cret-pass")
    page.goto(f"{daphne.url}/")
    assert "/accounts/login/" in page.url  # login required
    assert page.locator("h1").inner_text() == "Sign in to Tandem"
    page.fill("#id_username", "carol")
    page.fill("#id_password", "s3cret-pass")
    page.click("button[type=submit]")
    page.wait_for_selector("text=Welcome, carol")
    assert page.url == f"{daphne.url}/"


@pytest.mark.django_db(transaction=True)
def test_wrong_password_shows_an_error(daphne, page):
    get_user_model().objects.create_user("dave", password="right-pass")
    page.goto(f"{daphne.url}/accounts/login/")
    page.fill("#id_username", "dave")
    page.fill("#id_password", "wrong-pass")
    page.click("button[type=submit]")
    assert "didn't match" in page.locator("[role=alert]").inner_text()

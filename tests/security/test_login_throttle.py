"""Failed-login throttling (django-axes): a username guessed from one address is locked out
after the limit, with a clear page, for the cool-off period; others are not; admins see it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

pytestmark = pytest.mark.django_db(transaction=True)

LOGIN = "/accounts/login/"
LIMIT = settings.AXES_FAILURE_LIMIT


def attempt(password: str, username: str = "guessed", address: str = "203.0.113.7") -> int:
    response = Client(REMOTE_ADDR=address).post(LOGIN, {"username": username, "password": password})
    return response.status_code, response.content.decode()


@pytest.fixture
def user():
    return get_user_model().objects.create_user("guessed", password="the-right-one")


def test_the_limit_locks_that_username_from_that_address(user):
    for _ in range(LIMIT - 1):
        status, body = attempt("wrong")
        assert status == 200 and "didn't match" in body
    status, body = attempt("wrong")
    assert status == 429 and "Too many failed sign-ins" in body
    assert f"After {LIMIT} wrong passwords" in body
    status, body = attempt("the-right-one")
    assert status == 429, "the right password does not lift a lock-out"

    assert attempt("the-right-one", address="198.51.100.9")[0] == 302, "another address"
    other = get_user_model().objects.create_user("bystander", password="theirs-ok")
    assert attempt("theirs-ok", username=other.username)[0] == 302, "another user, same address"


def test_the_lock_lifts_after_the_cool_off(user):
    for _ in range(LIMIT):
        attempt("wrong")
    assert attempt("the-right-one")[0] == 429
    past = timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    AccessAttempt.objects.update(attempt_time=past)
    assert attempt("the-right-one")[0] == 302


def test_a_success_clears_the_count(user):
    for _ in range(LIMIT - 1):
        attempt("wrong")
    assert attempt("the-right-one")[0] == 302
    for _ in range(LIMIT - 1):
        assert attempt("wrong")[0] == 200


def test_admins_see_the_lock_outs(user):
    for _ in range(LIMIT):
        attempt("wrong")
    admin = get_user_model().objects.create_superuser("axes-admin", password="x")
    client = Client()
    client.force_login(admin)
    page = client.get("/admin/axes/accessattempt/").content.decode()
    assert "guessed" in page and "203.0.113.7" in page


@pytest.mark.browser
def test_the_browser_shows_the_lock_out(daphne, page):
    get_user_model().objects.create_user("browser-guessed", password="the-right-one")
    page.goto(f"{daphne.url}{LOGIN}")
    for _ in range(LIMIT - 1):
        page.fill("#id_username", "browser-guessed")
        page.fill("#id_password", "wrong")
        page.click("button[type=submit]")
        expect(page.locator("p.error[role=alert]")).to_contain_text("didn't match")
    page.fill("#id_username", "browser-guessed")
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    expect(page.locator("#locked-out")).to_contain_text("Too many failed sign-ins")
    page.goto(f"{daphne.url}{LOGIN}")
    page.fill("#id_username", "browser-guessed")
    page.fill("#id_password", "the-right-one")
    page.click("button[type=submit]")
    expect(page.locator("#locked-out")).to_be_visible()

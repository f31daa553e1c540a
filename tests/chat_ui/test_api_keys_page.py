"""The API keys page in Chromium: create a key, see it once, copy it, use it, revoke it.

The Daphne serves no model: a key the API accepts gets the engine's 503, a refused one 401.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from inference.api.keys import ApiKey
from tests.chat_ui.conftest import make_user, sign_in
from tests.conftest import daphne_without_model
from tests.support.http import get

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def server(django_db_setup, service_logs):
    with daphne_without_model("daphne-keys-page", service_logs) as daphne:
        yield daphne


def models_status(server, token: str) -> int:
    return get(f"{server.url}/v1/models", {"Authorization": f"Bearer {token}"})[0]


def test_a_key_is_created_shown_once_copied_and_revoked(server, chromium):
    context = chromium.new_context(permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    refused = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)
    try:
        user, password = make_user("keys")
        sign_in(page, server.url, user.username, password)
        page.get_by_role("link", name="API keys").click()
        expect(page.get_by_role("heading", name="API keys")).to_be_visible()
        expect(page.locator(".empty-keys")).to_be_visible()

        page.fill("#key-name", "notebook")
        page.get_by_role("button", name="Create key").click()
        token = page.locator("#new-key-token").inner_text().strip()
        assert token.startswith("tdm_") and len(token) > 40
        key = ApiKey.objects.get(owner=user)
        row = page.locator(f"tr[data-key-id='{key.pk}']")
        expect(row).to_contain_text("notebook")
        expect(row).to_contain_text(token[:12])
        expect(row).to_contain_text("never")

        page.get_by_role("button", name="Copy the new key").click()
        expect(page.get_by_role("button", name="Copy the new key")).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == token

        assert models_status(server, token) == 503  # accepted: only the engine is missing
        page.reload()  # a GET, not the form again: no second key, and the token is gone
        expect(page.locator("#new-key-token")).to_have_count(0)
        assert ApiKey.objects.filter(owner=user).count() == 1
        assert token[12:] not in page.content()
        expect(row).not_to_contain_text("never")  # last used just now

        row.get_by_role("button", name="Revoke the key notebook").click()
        expect(row).to_contain_text("revoked")
        expect(row.get_by_role("button")).to_have_count(0)
        assert models_status(server, token) == 401
        assert refused == []
    finally:
        context.close()

"""API keys in the admin: an admin makes one for a user (its token shown on that answer only),
revokes keys with an action, and reads which key made each API request."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.contrib.auth import get_user_model

from inference.api.keys import ApiKey, ApiRequest, key_create

pytestmark = pytest.mark.django_db

KEYS = "/admin/inference/apikey/"


def test_an_admin_creates_a_key_whose_token_is_shown_once_and_stored_hashed(admin_client):
    owner = get_user_model().objects.create_user("dora")
    answer = admin_client.post(f"{KEYS}add/", {"owner": owner.pk, "name": "  batch job "})
    assert answer.status_code == 200
    token = re.search(r'value="(tdm_[A-Za-z0-9_-]+)"', answer.content.decode()).group(1)
    key = ApiKey.objects.get(owner=owner)
    assert key.name == "batch job"
    assert key.hashed == hashlib.sha256(token.encode()).hexdigest() and key.prefix == token[:12]
    page = admin_client.get(f"{KEYS}{key.pk}/change/").content.decode()
    assert key.prefix in page and token[12:] not in page


def test_the_revoke_action_and_the_requests_key_column(admin_client):
    owner = get_user_model().objects.create_user("emil")
    live, _ = key_create(owner, "live one")
    gone, _ = key_create(owner, "revoked one")
    ApiRequest.objects.create(key=live, owner=owner, route="/generate", process="p", status=200)
    answer = admin_client.post(KEYS, {"action": "revoke_keys", "_selected_action": [gone.pk]})
    assert answer.status_code == 302
    gone.refresh_from_db()
    live.refresh_from_db()
    assert gone.revoked and not live.revoked

    requests_page = admin_client.get("/admin/inference/apirequest/").content.decode()
    assert "live one" in requests_page and f"/admin/inference/apikey/{live.pk}/change/" in (
        requests_page
    )
    assert admin_client.get("/admin/inference/apirequest/add/").status_code == 403

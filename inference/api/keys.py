"""Per-user API keys: the key and request records, hashing and lookup.

A key is a random token shown to its owner once; the database keeps only its SHA-256 and a
short visible prefix, which finds the candidate rows without reading any secret. The digest
is compared with `hmac.compare_digest`, so a guess learns nothing from the time it takes.
Service keys (TANDEM_API_KEYS) are not rows: `inference/api/auth.py` checks them first.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

# Every user key starts with this, so a token that carries it is looked up and refused when it
# matches no live key, even where the API is open: its owner learns that it is revoked.
TOKEN_MARK = "tdm_"
# The mark and 8 random characters: what the page and the admin show, and the lookup's index.
PREFIX_LENGTH = len(TOKEN_MARK) + 8


def new_token() -> str:
    """A key's secret: 32 random bytes (256 bits), URL-safe, behind the visible mark."""
    return TOKEN_MARK + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    """What is stored: SHA-256 suffices, since the token is random, not a chosen password."""
    return hashlib.sha256(token.encode()).hexdigest()


class ApiKey(models.Model):
    """One user's named key for the generation API; revoked, never deleted by its owner, so
    the requests it made keep pointing at it."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True, editable=False)
    hashed = models.CharField("SHA-256", max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class ApiRequest(models.Model):
    """One generation-API request made with a user's key: who, with which key, while it runs.

    Unfinished rows count against the owner's cap of replies in flight (`chat/caps.py`), as
    long as the web process serving them (`process`, its heartbeat id) is alive.
    """

    key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="requests"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_requests"
    )
    route = models.CharField(max_length=100)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    process = models.CharField(max_length=64, help_text="The web process serving it.")
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        verbose_name = "API request"
        indexes = [models.Index(fields=["owner", "finished_at"])]

    def __str__(self) -> str:
        return f"{self.route} by {self.owner_id} at {self.started_at:%Y-%m-%d %H:%M:%S}"


def key_issue(key: ApiKey) -> str:
    """Save the unsaved `key` (owner and name set) with a new token's prefix and digest, and
    return the plaintext token, which is never stored nor shown again."""
    token = new_token()
    key.name = key.name.strip()
    key.prefix = token[:PREFIX_LENGTH]
    key.hashed = digest(token)
    key.save(force_insert=True)
    return token


class KeyNameInvalid(ValueError):
    """The name a user gave a new key is empty or too long; the message says which."""


def key_create(owner, name: str) -> tuple[ApiKey, str]:
    """A new key named `name` for `owner`, and its plaintext token."""
    name = name.strip()
    limit = ApiKey._meta.get_field("name").max_length
    if not name:
        raise KeyNameInvalid("Name the key, to tell it from the others later.")
    if len(name) > limit:
        raise KeyNameInvalid(f"That name is {len(name)} characters; the limit is {limit}.")
    key = ApiKey(owner=owner, name=name)
    return key, key_issue(key)


def key_revoke(key: ApiKey) -> bool:
    """Revoke `key` from now on; False when it already was."""
    updated = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    return bool(updated)


def keys_of(owner) -> models.QuerySet[ApiKey]:
    """The owner's keys, newest first, revoked ones included."""
    return ApiKey.objects.filter(owner=owner)


def key_for_token(token: str) -> ApiKey | None:
    """The live key whose token this is, or None (unknown, wrong or revoked)."""
    if not token.startswith(TOKEN_MARK):
        return None
    hashed = digest(token)
    found = None
    for key in ApiKey.objects.filter(prefix=token[:PREFIX_LENGTH]).select_related("owner"):
        if hmac.compare_digest(key.hashed, hashed):
            found = key
    if found is None or found.revoked or not found.owner.is_active:
        return None
    return found


def any_live_key() -> bool:
    """Whether some user holds a key that is not revoked."""
    return ApiKey.objects.filter(revoked_at__isnull=True).exists()

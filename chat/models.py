"""Conversations, their messages, and the ordered parts of each assistant reply.

A Part's state changes only through `chat/services.py`, whose guarded transitions also tell
the browser; a Message's status is derived from its parts, never stored.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxLengthValidator, MaxValueValidator, MinValueValidator
from django.db import models

# A reply's length is capped below the context window (2,048 tokens for SmolLM2), so the
# conversation so far always keeps room in the prompt.
MAX_NEW_TOKENS_CAP = 1024
SYSTEM_PROMPT_CHARS = 2000
# Each setting of a conversation and the Django setting that is its default.
SETTING_DEFAULTS = {
    "system_prompt": "TANDEM_CHAT_SYSTEM_PROMPT",
    "temperature": "TANDEM_CHAT_TEMPERATURE",
    "top_p": "TANDEM_CHAT_TOP_P",
    "max_new_tokens": "TANDEM_CHAT_MAX_NEW_TOKENS",
    "image_by_default": "TANDEM_CHAT_IMAGE_BY_DEFAULT",
}


class Conversation(models.Model):
    """One chat thread, owned by one user, with its own settings for the replies.

    A setting left empty (null) follows its default in the Django settings (TANDEM_CHAT_*),
    read when each reply starts; the owner sets them through
    `chat.conversations.conversation_settings_update`, checked by these fields' validators.
    """

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, blank=True)
    system_prompt = models.TextField(
        null=True,
        blank=True,
        validators=[MaxLengthValidator(SYSTEM_PROMPT_CHARS)],
        help_text="Sent first in every prompt; empty: the default (TANDEM_CHAT_SYSTEM_PROMPT).",
    )
    temperature = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(2.0)],
        help_text="0 is greedy (always the likeliest token); empty: TANDEM_CHAT_TEMPERATURE.",
    )
    top_p = models.FloatField(
        "top-p",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.05), MaxValueValidator(1.0)],
        help_text="Sample from the likeliest tokens holding this much probability.",
    )
    max_new_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_NEW_TOKENS_CAP)],
        help_text="The longest reply, in tokens; empty: TANDEM_CHAT_MAX_NEW_TOKENS.",
    )
    image_by_default = models.BooleanField(
        null=True, blank=True, help_text="The composer's Image switch starts on."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    def effective_settings(self) -> dict:
        """Each setting as the next reply uses it: this conversation's own, else the default."""
        effective = {}
        for name, setting in SETTING_DEFAULTS.items():
            value = getattr(self, name)
            effective[name] = getattr(settings, setting) if value in (None, "") else value
        return effective


class Message(models.Model):
    """A turn's user message or assistant reply: a node of the conversation's tree.

    Each message follows its `parent` (None for a first message); `position` is its depth.
    Editing a user message adds a sibling (same parent, same position) that starts a new
    branch; of a set of siblings, the one `shown` is on screen and in the model's history.
    """

    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        COMPLETE = "complete"
        PARTIAL = "partial"
        FAILED = "failed"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    parent = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="children",
        help_text="The message this one follows (none for a conversation's first).",
    )
    position = models.PositiveIntegerField(help_text="The depth in the conversation, from 0.")
    text = models.TextField(blank=True, help_text="The user's words (assistant text is in parts).")
    wants_image = models.BooleanField(default=False)
    history_truncated = models.BooleanField(
        default=False, help_text="Older turns were left out of the prompt to fit the context."
    )
    shown_version = models.PositiveIntegerField(
        default=1,
        help_text="The version of this reply on screen, and in the model's history.",
    )
    shown = models.BooleanField(
        default=True,
        help_text="Of this message and its edits (its siblings), the branch on screen.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "position", "pk"]
        indexes = [models.Index(fields=["conversation", "position"])]

    def __str__(self) -> str:
        return f"{self.role} #{self.position} of {self.conversation_id}"

    def shown_parts(self) -> list[Part]:
        """The parts of the version on screen, in order (from `parts` as prefetched)."""
        shown = [part for part in self.parts.all() if part.version == self.shown_version]
        return sorted(shown, key=lambda part: part.index)

    def version_count(self) -> int:
        return max((part.version for part in self.parts.all()), default=1)


# A part's states before a final one (chat/states.py has the final ones): the partial index
# `part_unfinished`, the per-user cap and Stop all read this list.
UNFINISHED_STATES = ["queued", "streaming", "running"]


class Part(models.Model):
    """One ordered piece of one version of an assistant reply: its text (index 0) or its
    image (index 1). Regenerating a reply lays out a new version's parts; the old ones stay."""

    class Kind(models.TextChoices):
        TEXT = "text"
        IMAGE = "image"

    class State(models.TextChoices):
        QUEUED = "queued"
        STREAMING = "streaming"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"
        INTERRUPTED = "interrupted"

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="parts")
    version = models.PositiveIntegerField(default=1)
    index = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    text = models.TextField(blank=True)
    seq = models.PositiveIntegerField(default=0, help_text="Text deltas saved so far.")
    image = models.FileField(upload_to="images/%Y/%m/", blank=True)
    previous_image = models.FileField(
        upload_to="images/%Y/%m/",
        blank=True,
        help_text='The picture shown while a new one is drawn ("New image"); kept if it fails.',
    )
    progress = models.FloatField(default=0.0)
    error = models.TextField(blank=True)
    attempt = models.PositiveIntegerField(default=1)
    engine_request_id = models.CharField(max_length=64, blank=True, db_index=True)
    task_id = models.CharField(max_length=64, blank=True, db_index=True)
    stream_owner = models.CharField(
        max_length=64, blank=True, help_text="The web process streaming this text part."
    )
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    first_token_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    finish_reason = models.CharField(max_length=32, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["message", "version", "index"]
        constraints = [
            models.UniqueConstraint(fields=["message", "version", "index"], name="part_index")
        ]
        indexes = [
            models.Index(fields=["kind", "state"]),
            # The parts in flight: a few rows whatever the history, so the per-user cap
            # (chat/caps.py) finds them without reading the user's past replies.
            models.Index(
                fields=["message"],
                condition=models.Q(state__in=UNFINISHED_STATES),
                name="part_unfinished",
            ),
        ]
        # The admin's actions on parts; each goes through the same service as the chat UI.
        permissions = [
            ("retry_image", "Can retry a failed or cancelled image"),
            ("cancel_generation", "Can cancel a part's generation"),
            ("mark_failed", "Can mark an unfinished part failed"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} part {self.index} of message {self.message_id} ({self.state})"

"""What the sweeper did, kept so that an operator can see it in the admin."""

from __future__ import annotations

from django.db import models

from chat.models import Part


class SweeperAction(models.Model):
    """One repair the sweeper made to one part, and why."""

    class Action(models.TextChoices):
        REQUEUED = "requeued", "image sent to the queue again"
        FAILED = "failed", "running image failed (worker gone)"
        INTERRUPTED = "interrupted", "text interrupted (web process gone)"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=16, choices=Action.choices)
    part = models.ForeignKey(Part, on_delete=models.CASCADE, related_name="sweeper_actions")
    detail = models.TextField()

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.action} part {self.part_id}"

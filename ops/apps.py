"""Django app config for the operations views."""

from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The project-wide views for people who run Tandem: /health and the staff-only /ops/ page.

    It sits above chat, media and inference (it reads all three) so that none of them needs
    to know a dashboard exists.
    """

    name = "ops"

"""Django app config for the inference package."""

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    """Model provisioning, the engine runtime and its management commands."""

    name = "inference"

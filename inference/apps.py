"""Django app config for the inference package."""

from django.apps import AppConfig
from django.core import checks
from prometheus_client import REGISTRY

from inference.checks import api_open_check
from inference.provisioning import metrics
from inference.provisioning.runtime import model_runtime


class InferenceConfig(AppConfig):
    """Model provisioning, the engine runtime, the generation APIs, their keys and its
    management command."""

    name = "inference"

    def ready(self) -> None:
        """Register the engine's metrics once per process, gauges read from its runtime, and
        the deploy check of the API's settings."""
        metrics.register(REGISTRY, model_runtime.engine_stats)
        checks.register(api_open_check, checks.Tags.security, deploy=True)

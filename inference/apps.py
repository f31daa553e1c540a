"""Django app config for the inference package."""

from django.apps import AppConfig
from prometheus_client import REGISTRY

from inference.provisioning import metrics
from inference.provisioning.runtime import model_runtime


class InferenceConfig(AppConfig):
    """Model provisioning, the engine runtime, the generation APIs and its management command."""

    name = "inference"

    def ready(self) -> None:
        """Register the engine's metrics once per process, gauges read from its runtime."""
        metrics.register(REGISTRY, model_runtime.engine_stats)

"""Load the configured model and print what it is, so an operator can check the set-up."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.provisioning import loading
from inference.provisioning.errors import ModelUnavailable


class Command(BaseCommand):
    """`manage.py model_info`: model, dtype, device, parameter count and load time."""

    help = "Load TANDEM_MODEL (converting the packaged GGUF on first use) and describe it."

    def handle(self, *args, **options) -> None:
        try:
            loaded = loading.load(settings.TANDEM_MODEL, settings.TANDEM_DTYPE)
        except (ModelUnavailable, ValueError) as exc:
            raise CommandError(str(exc)) from None
        info = loaded.describe()
        self.stdout.write(f"model:       {info['name']}")
        self.stdout.write(f"directory:   {loaded.model.name_or_path}")
        self.stdout.write(f"class:       {type(loaded.model).__name__}")
        self.stdout.write(f"dtype:       {info['dtype']}")
        self.stdout.write(f"device:      {info['device']}")
        self.stdout.write(f"parameters:  {info['parameters']:,}")
        converted = " (converted from the packaged GGUF now)" if info["converted_now"] else ""
        self.stdout.write(f"load time:   {info['load_seconds']:.2f} s{converted}")

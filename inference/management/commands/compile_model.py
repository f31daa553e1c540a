"""Build the compiled step's buckets ahead, so that `make run` and a deploy start warm."""

import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.provisioning import startup
from inference.provisioning.errors import ModelUnavailable

POLL_SECONDS = 0.5


class Command(BaseCommand):
    """`manage.py compile_model`: every bucket of TANDEM_COMPILE_BUCKETS into the cache."""

    help = (
        "Load or build every compiled bucket of the configured model into TANDEM_COMPILE_CACHE, "
        "one line a bucket (a first build takes 20-90 s a bucket; a bucket already there loads "
        "in about a second)."
    )

    def handle(self, *args, **options) -> None:
        if not settings.TANDEM_COMPILE:
            raise CommandError("TANDEM_COMPILE is off: there is no compiled step to build.")
        directory = startup.compile_cache_dir()
        if directory is None:
            raise CommandError("TANDEM_COMPILE_CACHE is off: nothing would keep the buckets.")
        started = time.perf_counter()
        try:
            loaded, runner, compiling = startup.load_source()
        except (ModelUnavailable, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if runner is None or compiling is None:
            raise CommandError("The configured engine source has no compiled step.")
        self.stdout.write(
            f"{loaded.describe()['name']}, weights {runner.weights}: "
            f"{len(settings.TANDEM_COMPILE_BUCKETS)} buckets into {directory}"
        )
        reported: set[int] = set()
        while True:
            building = compiling.is_alive()
            for size, status in runner.compile_buckets.items():
                if size not in reported and status["seconds"] is not None:
                    reported.add(size)
                    state, seconds = status["state"], status["seconds"]
                    self.stdout.write(f"  bucket {size:>4}: {state} in {seconds} s")
            if not building:
                break
            compiling.join(POLL_SECONDS)
        if runner.compile_state != "ready":
            raise CommandError(f"The compiled step could not be built: {runner.compile_state}")
        self.stdout.write(f"ready in {time.perf_counter() - started:.0f} s")

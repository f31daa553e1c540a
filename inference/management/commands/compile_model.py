"""Build the compiled step's buckets ahead, so that `make run` and a deploy start warm."""

import os
import time
from collections.abc import Callable

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.provisioning import startup
from inference.provisioning.errors import ModelUnavailable

POLL_SECONDS = 0.5
# How long the command waits for the machine to settle before the model's load measures the
# weights' crossover, and how far under the CPU count the 1-minute load must fall for it.
SETTLE_SECONDS = 120.0
SETTLE_MARGIN = 0.5
SETTLE_POLL_SECONDS = 2.0


def settle(
    cpus: int,
    timeout: float = SETTLE_SECONDS,
    load: Callable[[], float] = lambda: os.getloadavg()[0],
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, float]:
    """Wait until the 1-minute load is SETTLE_MARGIN under `cpus`, at most `timeout`
    seconds; the load then, and the seconds waited.

    The crossover the buckets are keyed on is kept only when measured on a quiet machine
    (`CompileCache.measured`). `make compile` runs right after `make model` converted the
    GGUF on every core, and the load average lags: on a fresh 2-core AMD EPYC Zen 3 it read
    2.7 when the crossover was measured, so nothing was kept, the next start measured again,
    read the lm_head's crossover at 8 rows instead of 4 and built all 12 buckets a second
    time (578 s). A machine that stays busy is waited for no longer than `timeout`."""
    waited = 0.0
    current = load()
    while current >= cpus - SETTLE_MARGIN and waited < timeout:
        sleep(SETTLE_POLL_SECONDS)
        waited += SETTLE_POLL_SECONDS
        current = load()
    return current, waited


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
        current, waited = settle(len(os.sched_getaffinity(0)))
        if waited:
            self.stdout.write(f"waited {waited:.0f} s for the load to settle ({current:.2f})")
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

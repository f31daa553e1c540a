"""What other processes took of the CPUs while a measurement ran: another process's busy
loop counts, this process's own threads do not (the measurement's own load once made every
start-up measurement read as taken on a busy machine)."""

from __future__ import annotations

import time

from inference.engine.others_cpu import QUIET_CPUS, OthersCpu
from tests.support.busy import spin

SPAN = 1.5


def busy_here(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_another_process_busy_counts_and_this_ones_own_work_does_not():
    own = OthersCpu()
    busy_here(SPAN)
    own_reading = own.cpus()

    beside = OthersCpu()
    spin(SPAN).wait()
    beside_reading = beside.cpus()

    # The other process's loop took about one CPU of the span (less its start); the same
    # loop in this process took none of what is counted. Both readings share whatever else
    # the machine ran, so their difference is what the test holds.
    assert beside_reading - own_reading > 0.6
    assert beside_reading > QUIET_CPUS  # a measurement beside it would not be kept

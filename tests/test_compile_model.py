"""`manage.py compile_model` waits for the machine to settle before the crossover is measured."""

from inference.management.commands.compile_model import SETTLE_POLL_SECONDS, settle


def _readings(*loads: float):
    """A load reader returning `loads` in turn (the last one from then on), and the sleeps."""
    remaining, slept = list(loads), []
    return (lambda: remaining.pop(0) if len(remaining) > 1 else remaining[0]), slept


def test_a_quiet_machine_is_not_waited_for():
    load, slept = _readings(0.4)
    assert settle(2, load=load, sleep=slept.append) == (0.4, 0.0)
    assert slept == []


def test_waits_until_the_load_falls_under_the_margin():
    # 2.7 after the GGUF's conversion on both cores; 1.6 is not yet half a CPU under 2.
    load, slept = _readings(2.7, 2.1, 1.6, 1.4, 0.9)
    assert settle(2, load=load, sleep=slept.append) == (1.4, 3 * SETTLE_POLL_SECONDS)
    assert slept == [SETTLE_POLL_SECONDS] * 3


def test_a_machine_that_stays_busy_is_waited_for_no_longer_than_the_timeout():
    load, slept = _readings(3.4)
    current, waited = settle(2, timeout=10.0, load=load, sleep=slept.append)
    assert current == 3.4
    assert waited == 10.0
    assert len(slept) == 10.0 / SETTLE_POLL_SECONDS

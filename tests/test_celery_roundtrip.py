"""A task goes through the real Redis to a real worker process and its answer comes back."""

import pytest

from media.tasks import echo
from tests.support.processes import wait_until


@pytest.mark.django_db(transaction=True)
def test_task_round_trip_through_a_real_worker(celery_worker):
    result = echo.apply_async(args=[{"hello": "tandem"}], queue="media")
    assert result.get(timeout=30) == {"echo": {"hello": "tandem"}}
    line = f"Task media.echo[{result.id}] succeeded"
    wait_until(lambda: line in celery_worker.log_text(), 10, "the worker to log the success")

"""Schemathesis fuzzes the public API, as /openapi.json describes it, on a real Daphne + engine.

The server's context is cut to a few dozen tokens so every generated request finishes in
moments: the run is bounded by examples per operation, not by wall time. Every response must
be a documented status with a documented content type and body, and none may be a 5xx. The
coverage phase sends bodies that break the schema (a boolean for an integer, a number past a
bound, a missing field): every one must be refused with a 4xx (negative_data_rejection).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest

from tests.conftest import serving
from tests.support.http import get
from tests.support.processes import BIN, child_env

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

MAX_EXAMPLES = 10
SEED = 20261129
OPERATIONS = {
    "POST /",
    "POST /generate",
    "POST /generate_stream",
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "GET /v1/models",
}
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)


@pytest.fixture(scope="module")
def fuzz_server(django_db_setup, service_logs):
    with serving(
        "daphne-fuzz",
        service_logs,
        TANDEM_MAX_SEQ_LEN="36",
        TANDEM_DEFAULT_MAX_NEW_TOKENS="2",
        TANDEM_MAX_RUNNING="2",
        TANDEM_MAX_WAITING="2",
    ) as server:
        yield server


def test_the_document_is_served_and_names_every_public_route(fuzz_server):
    status, headers, document = get(f"{fuzz_server.url}/openapi.json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert document["openapi"].startswith("3.1")
    operations = {
        f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item
    }
    assert operations == OPERATIONS
    parameters = document["components"]["schemas"]["TgiParameters"]["properties"]
    assert parameters["top_p"]["anyOf"][0] == {
        "exclusiveMinimum": 0,
        "maximum": 1,
        "type": "number",
    }


def status_histogram(har: dict) -> dict[str, Counter]:
    """Per operation ("POST /generate"), how many responses had each status code."""
    histogram: dict[str, Counter] = {}
    for entry in har["log"]["entries"]:
        request = entry["request"]
        path = "/" + request["url"].split("/", 3)[3].split("?")[0]
        key = f"{request['method']} {path}"
        histogram.setdefault(key, Counter())[entry["response"]["status"]] += 1
    return histogram


def test_fuzzing_the_documented_api_gets_no_server_error(fuzz_server, tmp_path):
    har_path = tmp_path / "run.har"
    command = [
        str(BIN / "st"),
        "run",
        f"{fuzz_server.url}/openapi.json",
        f"--checks={','.join(CHECKS)}",
        "--phases=examples,coverage,fuzzing",
        f"--max-examples={MAX_EXAMPLES}",
        f"--seed={SEED}",
        "--workers=1",
        "--request-timeout=60",
        "--no-shrink",
        "--suppress-health-check=all",
        "--continue-on-failure",
        "--report=har",
        f"--report-har-path={har_path}",
    ]
    result = subprocess.run(
        command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=420
    )
    histogram = status_histogram(json.loads(har_path.read_text()))
    total = Counter()
    for counts in histogram.values():
        total.update(counts)
    server_errors = sum(n for code, n in total.items() if code >= 500)
    print(
        f"\nschemathesis: {len(histogram)} operations, {sum(total.values())} requests, "
        f"status codes {dict(sorted(total.items()))}, 5xx = {server_errors}"
    )
    for operation, counts in sorted(histogram.items()):
        print(f"  {operation}: {dict(sorted(counts.items()))}")
    assert result.returncode == 0, result.stdout[-6000:]
    assert server_errors == 0
    documented = {op: counts for op, counts in histogram.items() if op in OPERATIONS}
    assert set(documented) == OPERATIONS
    assert all(any(200 <= code < 300 for code in counts) for counts in documented.values())
    # The coverage phase also tries undocumented methods on the API's paths ("/" is the chat).
    probes = [
        counts
        for op, counts in histogram.items()
        if op not in OPERATIONS and op.split()[1] in {o.split()[1] for o in OPERATIONS} - {"/"}
    ]
    assert probes and all(set(counts) == {405} for counts in probes)
    posts = [counts for operation, counts in documented.items() if operation.startswith("POST")]
    assert all(any(400 <= code < 500 for code in counts) for counts in posts)

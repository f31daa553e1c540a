"""bench/stream.py end to end at a tiny size: its own Daphne, synthetic tokens, WS and SSE readers.

Two readers per reply on each transport, so the fan-out inside one process is exercised too
(two SSE readers of one reply once crashed the second: the layer hands both the same dict).
"""

import json
import subprocess
import sys

import pytest

from tests.support.processes import ROOT, child_env

CLIENTS = 4


@pytest.mark.timeout(600)
def test_small_run_holds_every_reader_and_measures_the_delay(tmp_path):
    argv = [sys.executable, "-m", "bench.stream", "--clients", str(CLIENTS)]
    argv += ["--conversations", "2", "--window", "2", "--rate", "20", "--workdir", str(tmp_path)]
    result = subprocess.run(
        argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=540
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]

    report = json.loads((tmp_path / "stream.json").read_text())
    rows = {row["transport"]: row for row in report["rows"]}
    assert set(rows) == {"ws", "sse"}
    for row in rows.values():
        assert (row["held"], row["errors"], row["error_kinds"]) == (CLIENTS, 0, {}), row
        assert row["deliveries"] >= CLIENTS, row  # every reader got pieces stamped `t`
        assert 0 < row["delay_p50_ms"] <= row["delay_p99_ms"] <= row["delay_max_ms"], row
        assert row["kib_per_connection"] is not None
    assert "| ws |" in result.stdout and "| sse |" in result.stdout


@pytest.mark.timeout(600)
def test_remote_source_each_reader_of_many_replies_sees_every_piece_once(tmp_path):
    """--source remote: many replies, one reader each, streamed by a Daphne from the stub
    engine in its own process; every piece reaches its reader once and the saved text is
    what was streamed, for every reply."""
    replies = 40
    argv = [sys.executable, "-m", "bench.stream", "--transport", "ws", "--clients"]
    argv += ["--distinct", str(replies), "--source", "remote", "--rate", "20"]
    argv += ["--window", "3", "--workdir", str(tmp_path)]
    result = subprocess.run(
        argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=540
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]

    [row] = json.loads((tmp_path / "stream.json").read_text())["rows"]
    assert (row["replies"], row["clients"], row["offered_tok_s"]) == (replies, replies, 800.0)
    assert (row["errors"], row["gaps"], row["dups"], row["error_kinds"]) == (0, 0, 0, {}), row
    assert row["saved_equal"] is True, row
    assert row["delivered_tok_s"] > 0 and row["delay_p50_ms"] <= row["delay_p99_ms"], row

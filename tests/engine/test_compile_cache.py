"""The compiled buckets kept on disk: a fresh process loads them instead of compiling, a
damaged package is rebuilt, another key is never loaded, and two processes starting together
build each bucket once. Each process is a real one (`compile_child.py`), as a restart is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inference.engine import compile_cache
from inference.engine.compile_cache import CompileCache, key_digest
from tests.support.busy import spin

BUCKETS = ("1", "2")
ROOT = Path(__file__).resolve().parents[2]


def child(cache_dir: Path, weights: str = "bf16") -> subprocess.Popen:
    """Start `compile_child` on `cache_dir`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.engine.compile_child", str(cache_dir), weights],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def report(process: subprocess.Popen) -> tuple[dict, str]:
    """The child's JSON report and its log."""
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def run(cache_dir: Path, weights: str = "bf16") -> tuple[dict, str]:
    return report(child(cache_dir, weights))


def entries(cache_dir: Path) -> list[Path]:
    return sorted(path for path in cache_dir.iterdir() if path.is_dir())


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    """A cache directory after one process built every bucket into it."""
    cache_dir = tmp_path_factory.mktemp("compiled")
    first, _ = run(cache_dir)
    return cache_dir, first


def test_a_fresh_process_loads_the_buckets_instead_of_compiling(built):
    cache_dir, first = built
    assert first["state"] == "ready"
    assert first["buckets"] == {size: "built" for size in BUCKETS}
    assert first["builds"] == len(BUCKETS)
    second, _ = run(cache_dir)
    assert second["buckets"] == {size: "loaded" for size in BUCKETS}
    assert second["builds"] == 0
    assert second["tokens"] == first["tokens"]


def test_a_loaded_package_leaves_no_unpacked_copy_behind(built):
    """torch unpacks each package under /tmp and removes the copy only when its loader is
    destroyed, which a process exiting with its graphs alive never does: the copies this
    process mapped its graphs from are gone while it still runs them, and after it ends."""
    cache_dir, first = built
    second, _ = run(cache_dir)
    for report in (first, second):
        assert len(report["unpacked"]) == len(BUCKETS)  # one mapped copy a bucket, found
        assert not [folder for folder in report["unpacked"] if Path(folder).exists()]
    assert second["tokens"] == first["tokens"]  # the graphs ran from the removed copies


def test_a_damaged_package_is_rebuilt_and_the_log_says_why(built, tmp_path):
    cache_dir, first = built
    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-r", str(cache_dir), str(damaged)], check=True)
    (package,) = entries(damaged)[0].glob("bucket-1.pt2")
    data = bytearray(package.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)  # the size stays: only the checksums can tell
    package.write_bytes(bytes(data))
    again, log = run(damaged)
    assert again["buckets"] == {"1": "built", "2": "loaded"}
    assert again["builds"] == 1
    assert "bucket 1's cache entry" in log and "unusable" in log
    assert again["tokens"] == first["tokens"]


def test_a_key_file_for_another_key_is_not_loaded(built, tmp_path):
    cache_dir, _ = built
    copied = tmp_path / "copied"
    subprocess.run(["cp", "-r", str(cache_dir), str(copied)], check=True)
    meta = entries(copied)[0] / "bucket-2.json"
    record = json.loads(meta.read_text())
    record["key"]["torch"] = "0.0.0"
    meta.write_text(json.dumps(record))
    again, log = run(copied)
    assert again["buckets"] == {"1": "loaded", "2": "built"}
    assert "made for another key" in log


def test_another_weights_kind_gets_an_entry_of_its_own(built, tmp_path):
    """int8 weights change the key: the bf16 entry is left alone, int8's is built."""
    cache_dir, _ = built
    copied = tmp_path / "kinds"
    subprocess.run(["cp", "-r", str(cache_dir), str(copied)], check=True)
    before = entries(copied)
    other, _ = run(copied, "int8")
    assert other["weights"] == "int8"
    assert other["buckets"] == {size: "built" for size in BUCKETS}
    assert len(entries(copied)) == len(before) + 1


def test_two_processes_starting_together_build_each_bucket_once(tmp_path):
    """fp16 weights: the graph one process built names fbgemm's matrices by handles that the
    other process must draw the same from the weights."""
    cache_dir = tmp_path / "together"
    started = (child(cache_dir, "fp16"), child(cache_dir, "fp16"))
    reports = [report(process)[0] for process in started]
    assert {r["weights"] for r in reports} == {"fp16"}
    assert sum(r["builds"] for r in reports) == len(BUCKETS)
    for size in BUCKETS:
        assert sorted(r["buckets"][size] for r in reports) == ["built", "loaded"]
    assert reports[0]["tokens"] == reports[1]["tokens"]


def test_a_measurement_is_kept_per_key_when_nothing_else_ran_beside_it(tmp_path, monkeypatch):
    """The crossover measured once is what a restart builds on; another key measures again;
    a reading taken while another process kept a CPU busy is used but not kept. (Quiet is
    faked for the first three: a test cannot make the machine quiet.)"""
    cache = CompileCache(tmp_path)
    calls = []

    def measure() -> dict:
        calls.append(1)
        return {"layers": len(calls)}

    with monkeypatch.context() as patched:
        patched.setattr(compile_cache.OthersCpu, "quiet", lambda self: True)
        assert cache.measured("crossover", {"a": 1}, measure) == ({"layers": 1}, True)
        assert cache.measured("crossover", {"a": 1}, measure) == ({"layers": 1}, False)
        assert cache.measured("crossover", {"a": 2}, measure) == ({"layers": 2}, True)
    assert key_digest({"a": 1}) != key_digest({"a": 2})

    def measure_beside_another() -> dict:
        spin(1.5).wait()
        return measure()

    assert cache.measured("crossover", {"a": 3}, measure_beside_another) == ({"layers": 3}, True)
    assert cache.measured("crossover", {"a": 3}, measure_beside_another) == ({"layers": 4}, True)

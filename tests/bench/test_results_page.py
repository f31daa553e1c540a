"""docs/benchmarks.md's tables are made from bench/results/kept/, and say what the files say."""

import json
import shutil

import pytest

from bench import results_page

KEPT = sorted(results_page.KEPT.glob("*.json"))


def test_the_page_shows_what_the_kept_runs_say():
    page = results_page.PAGE.read_text()
    assert results_page.rewrite(page, results_page.newest_by_kind()) == page, (
        "docs/benchmarks.md and bench/results/kept/ disagree: run `make bench-docs`"
    )


def test_every_kind_of_cpu_has_its_table_on_the_first_screen():
    page = results_page.PAGE.read_text()
    first_screen = "\n".join(page.splitlines()[:40])
    assert results_page.BEGIN in first_screen
    for record in results_page.newest_by_kind().values():
        _, title = results_page.kind(record["cpu"])
        assert f"[{title}]" in first_screen


def _copy(tmp_path, change):
    record = json.loads(KEPT[0].read_text())
    change(record)
    (tmp_path / "run.json").write_text(json.dumps(record))
    return tmp_path


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.pop("commit"),
        lambda r: r["cpu"]["flags"].pop("amx"),
        lambda r: r["load"].update(start="0.9"),
        lambda r: r["peers"][0].update(tokens_per_s=True),
        lambda r: r["peers"].clear(),
        lambda r: r.update(date="yesterday"),
    ],
    ids=["no commit", "no amx flag", "load as text", "bool tok/s", "no peers", "bad date"],
)
def test_a_malformed_kept_run_is_refused(tmp_path, change):
    with pytest.raises(results_page.MalformedResult):
        results_page.newest_by_kind(_copy(tmp_path, change))


def test_a_file_that_is_not_json_is_refused(tmp_path):
    (tmp_path / "run.json").write_text('{"date": ')
    with pytest.raises(results_page.MalformedResult):
        results_page.newest_by_kind(tmp_path)


def test_the_newest_run_of_a_kind_is_the_one_shown(tmp_path):
    shutil.copy(KEPT[0], tmp_path / "a.json")
    _copy(tmp_path, lambda r: r.update(date="2099-01-01T00:00Z", commit="later"))
    (newest,) = results_page.newest_by_kind(tmp_path).values()
    assert newest["commit"] == "later"


@pytest.mark.parametrize(
    ("family", "slug"), [(25, "amd-avx512-bf16"), (26, "amd-zen5")], ids=["Zen 4", "Zen 5"]
)
def test_zen_5_is_a_kind_of_its_own(family, slug):
    flags = {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx": False}
    cpu = {"vendor": "AMD", "family": family, "model": 2, "flags": flags, "name": "AMD EPYC"}
    assert results_page.kind(cpu)[0] == slug


def test_a_page_without_the_markers_is_refused():
    with pytest.raises(results_page.MalformedResult):
        results_page.rewrite("# Benchmarks\n", results_page.newest_by_kind())


def test_keep_writes_a_run_the_page_can_read(tmp_path):
    payload = json.loads(KEPT[0].read_text())
    for key in ("source", "date", "commit", "load"):
        payload.pop(key)
    payload["machine"] |= {"load_average_start": (0.5, 0.4, 0.3), "load_average_end": [1.5]}
    written = results_page.keep(payload, tmp_path)
    record = results_page.read(written)
    assert written.name.startswith(results_page.kind(record["cpu"])[0] + "-")
    assert record["load"] == {"start": 0.5, "end": 1.5}
    assert record["source"] == "written by bench.engine --keep"
